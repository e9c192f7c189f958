"""#16, tenth round: where three consumer warpgroups (192-row programs) start to beat two (128 rows).

The shipped module with ``THREE_CONSUMERS_FROM`` forced either way, same process, passes interleaved;
each launch with the tail split it would plan. Prints a table.

    PYTHONPATH=$PWD python docs/experiments/tenth-round/crossover.py [--rep-ms 50]
"""

from __future__ import annotations

import argparse

import torch

from rocm_vit.backends import gluon_attn
from rocm_vit.cli.workload import device_ms

HEADS = 16
LAYOUTS = [(1, 1024, 72), (1, 1600, 72), (1, 2048, 72), (1, 2560, 72), (1, 3072, 72), (1, 3600, 72), (1, 4096, 72),
           (1, 5120, 72), (1, 6400, 72), (1, 8160, 72), (4, 1024, 72), (8, 1024, 72), (2, 2048, 72), (4, 2048, 72),
           (2, 3072, 72), (1, 4096, 64), (1, 4096, 80), (1, 12800, 64), (4, 4096, 72)]  # fmt: skip


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rep-ms", type=int, default=50)
    args = parser.parse_args()
    rows = []
    for segments, seq_len, head_dim in LAYOUTS:
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = torch.randn((segments * seq_len, 3, HEADS, head_dim), generator=g, device="cuda").to(
            torch.bfloat16).unbind(1)
        cu = torch.arange(segments + 1, dtype=torch.int32, device="cuda") * seq_len
        out = torch.empty_like(q)
        times = {2: [], 3: []}
        for _ in range(2):
            for consumers in (2, 3):
                gluon_attn.THREE_CONSUMERS_FROM = 0 if consumers == 3 else 1 << 40
                call = lambda: gluon_attn.gluon_varlen_attention(q, k, v, cu, seq_len, head_dim**-0.5, out=out)  # noqa: E731
                call()
                times[consumers].append(device_ms(call, args.rep_ms))
        two, three = min(times[2]), min(times[3])
        rows.append((f"{segments}x{seq_len} d{head_dim}", times[2], times[3], three / two - 1))
        print(rows[-1], flush=True)
    print("\n| layout | 2 consumers ms (pass 1 / 2) | 3 consumers ms (pass 1 / 2) | 3 vs 2 (best) |")
    print("|---|---|---|---:|")
    for name, two, three, delta in rows:
        print(f"| {name} | {two[0]:.4f} / {two[1]:.4f} | {three[0]:.4f} / {three[1]:.4f} | {delta:+.1%} |")


if __name__ == "__main__":
    main()
