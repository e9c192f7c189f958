"""#16, tenth round: gluon_attn with three consumer warpgroups (192 query rows per program) against the
shipped two (128 rows), same process, passes interleaved.

Why: FlashAttention-3 runs three consumer warpgroups at head dim 64 (192 x 128 tiles), where the
softmax is large against the matmuls; at head dim 72-80 this kernel is in the same regime (ninth round:
issue slots 40 %, tensor pipe 57 %, SFU 47 %). With three, two warpgroups can feed the tensor cores
while the third runs its softmax. The register file then gives each consumer 160 registers, too few
for the overlap of QK(j) with PV(j - 1) inside a warpgroup (it spilled: 52 local loads and stores, every
wgmma serialised), so the three-consumer variant runs each warpgroup's tile in series.

    PYTHONPATH=$PWD:$PWD/docs/experiments/tenth-round python docs/experiments/tenth-round/three_consumers.py [--rep-ms 100]
"""

from __future__ import annotations

import argparse
import contextlib

import torch

import gluon_c3
from rocm_vit.backends import gluon_attn
from rocm_vit.cli.workload import device_ms

HEADS = 16
LAYOUTS = [(1, 12800, 72), (1, 47376, 72), (1, 12800, 80), (1, 47376, 80), (1, 8160, 72), (2, 8160, 72),
           (1, 14400, 72), (3, 1000, 72)]  # fmt: skip
VARIANTS = ["shipped", "2 consumers (copy)", "3 consumers", "3 consumers, no split"]


def inputs(segments, seq_len, head_dim, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    qkv = torch.randn((segments * seq_len, 3, HEADS, head_dim), generator=g, device="cuda").to(torch.bfloat16)
    cu = torch.arange(segments + 1, dtype=torch.int32, device="cuda") * seq_len
    return (*qkv.unbind(1), cu)


@contextlib.contextmanager
def variant(name):
    plan = gluon_c3.plan_tail_split
    gluon_c3.CONSUMERS = 3 if name.startswith("3") else 2
    if name.endswith("no split"):
        gluon_c3.plan_tail_split = lambda *args: None
    try:
        yield gluon_attn.gluon_varlen_attention if name == "shipped" else gluon_c3.gluon_varlen_attention
    finally:
        gluon_c3.plan_tail_split = plan


def run(name, q, k, v, cu, seq_len, head_dim, out):
    with variant(name) as fn:
        return fn(q, k, v, cu, seq_len, head_dim**-0.5, out=out)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rep-ms", type=int, default=100)
    args = parser.parse_args()
    rows = []
    for segments, seq_len, head_dim in LAYOUTS:
        q, k, v, cu = inputs(segments, seq_len, head_dim)
        flops = 4 * segments * seq_len**2 * HEADS * head_dim
        expected = torch.nn.functional.scaled_dot_product_attention(
            *(x.view(segments, seq_len, HEADS, head_dim).transpose(1, 2).float() for x in (q, k, v))
        ).transpose(1, 2).reshape(q.shape) if seq_len <= 14400 else None
        outs = {name: torch.full_like(q, float("nan")) for name in VARIANTS}
        for name in VARIANTS:
            run(name, q, k, v, cu, seq_len, head_dim, outs[name])
        torch.cuda.synchronize()
        times = {name: [] for name in VARIANTS}
        for _ in range(2):
            for name in VARIANTS:
                out = outs[name]
                times[name].append(device_ms(lambda: run(name, q, k, v, cu, seq_len, head_dim, out), args.rep_ms))  # noqa: B023
        layout = f"{segments}x{seq_len} d{head_dim}"
        for name in VARIANTS:
            same = torch.equal(outs[name], outs["shipped"])
            err = float("nan") if expected is None else (outs[name].float() - expected).abs().max().item()
            rows.append((layout, name, times[name], flops / min(times[name]) / 1e9, same, err))
            print(rows[-1], flush=True)
    print("\n| layout | kernel | ms, pass 1 / pass 2 | TFLOP/s (best) | bit-equal to shipped | max abs error vs fp32 |")
    print("|---|---|---|---:|---|---:|")
    for layout, name, ms, tflops, same, err in rows:
        print(f"| {layout} | {name} | {ms[0]:.3f} / {ms[1]:.3f} | {tflops:.0f} | {same} | {err:.2e} |")


if __name__ == "__main__":
    main()
