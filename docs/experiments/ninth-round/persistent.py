"""#16, ninth round: gluon_attn's main launch as a persistent kernel (one CTA per SM looping over
query blocks, the loader fetching the next block's Q and K/V during the current block's epilogue)
against the shipped one-program-per-block launch. The variant is gluon_persistent.py beside this script
(`git show 2f5af4b:backends/gluon_attn.py` plus `_attn_fwd_persistent`, as it ran; see README).

    PYTHONPATH=$PWD:$PWD/docs/experiments/ninth-round python docs/experiments/ninth-round/persistent.py [--rep-ms 100]

A smoke run in a subprocess with a timeout comes first: a wrong mbarrier phase hangs the GPU.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import torch

HEADS = 16
LAYOUTS = [(1, 12800, 72), (1, 47376, 72), (1, 8160, 72), (1, 14400, 72), (2, 8160, 72), (1, 12800, 80),
           (1, 12800, 64), (3, 1000, 72), (1, 6400, 72)]  # fmt: skip


def inputs(segments, seq_len, head_dim):
    g = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn((segments * seq_len, 3, HEADS, head_dim), generator=g, device="cuda").to(torch.bfloat16)
    return (*qkv.unbind(1), torch.arange(segments + 1, dtype=torch.int32, device="cuda") * seq_len)


def smoke() -> None:
    import gluon_persistent

    for segments, seq_len, head_dim in LAYOUTS:
        q, k, v, cu = inputs(segments, seq_len, head_dim)
        gluon_persistent.gluon_varlen_attention(q, k, v, cu, seq_len, head_dim**-0.5)
    torch.cuda.synchronize()
    print("smoke ok")


def main(rep_ms: int) -> None:
    import gluon_persistent

    from rocm_vit.backends import gluon_attn
    from rocm_vit.cli.workload import device_ms

    rows = []
    for segments, seq_len, head_dim in LAYOUTS:
        q, k, v, cu = inputs(segments, seq_len, head_dim)
        out = torch.empty_like(q)
        flops = 4 * segments * seq_len**2 * HEADS * head_dim
        results = {}
        for label, module in (("shipped", gluon_attn), ("persistent", gluon_persistent), ("shipped again", gluon_attn)):
            call = lambda: module.gluon_varlen_attention(q, k, v, cu, seq_len, head_dim**-0.5, out=out)  # noqa: E731
            call()
            torch.cuda.synchronize()
            results[label] = out.clone()
            ms = device_ms(call, rep_ms)
            rows.append((f"{segments}x{seq_len} d{head_dim}", label, ms, flops / ms / 1e9))
            print(rows[-1], flush=True)
        same = torch.equal(results["shipped"], results["persistent"])
        rows.append((f"{segments}x{seq_len} d{head_dim}", f"bit-identical: {same}", 0.0, 0.0))
    print("\n| layout | launch | ms | TFLOP/s |")
    print("|---|---|---:|---:|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]:.3f} | {r[3]:.0f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rep-ms", type=int, default=100)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        smoke()
    else:
        done = subprocess.run([sys.executable, __file__, "--smoke"], timeout=120)
        if done.returncode == 0:
            main(args.rep_ms)
