"""#16, ninth round: gluon_attn with one ready and one free mbarrier per K/V slot (MERGED_KV) against
separate K and V barriers (the eighth round's protocol), same module, same process.

Why: Nsight Compute put 2.06 of the main kernel's 7.24 cycles per issued instruction on "barrier"
stalls. Gluon (Triton 3.6) lowers an mbarrier arrive to one thread's arrive after a warpgroup
bar.sync, so each arrive per tile is a warpgroup barrier; merging the slots halves the arrives.

    PYTHONPATH=$PWD:$PWD/docs/experiments/ninth-round python docs/experiments/ninth-round/merged_kv.py [--rep-ms 100]
"""

from __future__ import annotations

import argparse

import torch

import gluon_merged_kv as gluon_attn  # the module with the MERGED_KV flag, as it ran
from rocm_vit.cli.workload import device_ms

HEADS = 16
LAYOUTS = [(1, 12800, 72), (1, 47376, 72), (1, 8160, 72), (1, 14400, 72), (2, 8160, 72), (1, 12800, 80),
           (1, 12800, 64), (3, 1000, 72)]  # fmt: skip


def main(rep_ms: int) -> None:
    rows = []
    for segments, seq_len, head_dim in LAYOUTS:
        g = torch.Generator(device="cuda").manual_seed(0)
        qkv = torch.randn((segments * seq_len, 3, HEADS, head_dim), generator=g, device="cuda").to(torch.bfloat16)
        q, k, v = qkv.unbind(1)
        cu = torch.arange(segments + 1, dtype=torch.int32, device="cuda") * seq_len
        out = torch.empty_like(q)
        flops = 4 * segments * seq_len**2 * HEADS * head_dim
        results = {}
        for merged in (False, True):
            gluon_attn.MERGED_KV = merged
            call = lambda: gluon_attn.gluon_varlen_attention(q, k, v, cu, seq_len, head_dim**-0.5, out=out)  # noqa: E731
            call()
            torch.cuda.synchronize()
            results[merged] = out.clone()
            ms = device_ms(call, rep_ms)
            rows.append((f"{segments}x{seq_len} d{head_dim}", "merged" if merged else "separate", ms, flops / ms / 1e9))
            print(rows[-1], flush=True)
        rows.append((f"{segments}x{seq_len} d{head_dim}", "bit-identical", float(torch.equal(results[False], results[True])), 0.0))
    gluon_attn.MERGED_KV = True
    print("\n| layout | K/V barriers | ms | TFLOP/s |")
    print("|---|---|---:|---:|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]:.3f} | {r[3]:.0f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rep-ms", type=int, default=100)
    main(parser.parse_args().rep_ms)
