"""#16, tenth round: float64 errors and the 8B tower with three consumer warpgroups (shipped) and two.

    PYTHONPATH=$PWD python docs/experiments/tenth-round/tower_and_errors.py [--skip-fp64] [--skip-tower]

1. float64 error at 47,376 tokens (d72, d80) and 1x12800 d72 of gluon_attn as shipped (three
   consumers at these sizes) and forced to two, seeded bf16 q, k, v as views of one packed projection;
2. `rocm-vit bench --preset qwen3-vl-8b --layouts 1x2048x1600,1x3024x4032 --no-graphs --repeats 10`,
   shipped, then with two consumers, same process.
"""

from __future__ import annotations

import argparse
import contextlib

import torch

from rocm_vit.backends import gluon_attn

HEADS = 16


@contextlib.contextmanager
def consumers(count):
    saved = gluon_attn.THREE_CONSUMER_WAVES
    if count == 2:
        gluon_attn.THREE_CONSUMER_WAVES = float("inf")
    try:
        yield
    finally:
        gluon_attn.THREE_CONSUMER_WAVES = saved


def reference64(q, k, v, scale, chunk=4096):
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    for h in range(q.shape[1]):
        kk, vv = k[:, h].double(), v[:, h].double()
        for c in range(0, q.shape[0], chunk):
            qq = q[c:c + chunk, h].double()
            out[c:c + qq.shape[0], h] = torch.softmax((qq @ kk.T) * scale, -1) @ vv
    return out


def part_fp64():
    rows = []
    for seq_len, head_dim in ((47376, 72), (47376, 80), (12800, 72)):
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = torch.randn((seq_len, 3, HEADS, head_dim), generator=g, device="cuda").to(torch.bfloat16).unbind(1)
        cu = torch.tensor([0, seq_len], dtype=torch.int32, device="cuda")
        scale = head_dim**-0.5
        expected = reference64(q, k, v, scale)
        for count in (3, 2):
            with consumers(count):
                out = gluon_attn.gluon_varlen_attention(q, k, v, cu, seq_len, scale)
            err = out.double() - expected
            rows.append((f"1x{seq_len} d{head_dim}", f"{count} consumers", (err.norm() / expected.norm()).item(),
                         err.abs().max().item()))
            print(rows[-1], flush=True)
        del expected
        torch.cuda.empty_cache()
    return rows


def part_tower():
    from rocm_vit.cli.main import main

    for count in (3, 2):
        print(f"== tower, {count} consumers where the rule picks 3", flush=True)
        with consumers(count):
            main(["bench", "--preset", "qwen3-vl-8b", "--layouts", "1x2048x1600,1x3024x4032", "--no-graphs",
                  "--repeats", "10"])  # fmt: skip


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--skip-fp64", action="store_true")
    parser.add_argument("--skip-tower", action="store_true")
    args = parser.parse_args()
    errors = [] if args.skip_fp64 else part_fp64()
    if not args.skip_tower:
        part_tower()
    if errors:
        print("\n| layout | gluon_attn | rel. error vs float64 | max abs |")
        print("|---|---|---:|---:|")
        for name, label, rel, mx in errors:
            print(f"| {name} | {label} | {rel:.4e} | {mx:.2e} |")


if __name__ == "__main__":
    main()
