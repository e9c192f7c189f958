"""#16, ninth round: the tail split's launch as a programmatic dependent launch (PDL) of the main one.

The main launch's programs execute `griddepcontrol.launch_dependents` before their partitions start,
so the split launch (launched with the PDL attribute) may start on SMs that the main launch's last
wave frees, instead of after all of it; each split program runs `griddepcontrol.wait` before it exits,
so its completion still implies the main launch's (the merge and every later kernel wait on it).
The variant is gluon_pdl.py beside this script (backends/gluon_attn.py at 34237c9 plus the PDL flag).
Measured in the ninth round: within noise or slower; not shipped.

    PYTHONPATH=$PWD:$PWD/docs/experiments/ninth-round python docs/experiments/ninth-round/pdl.py [--rep-ms 100]
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import torch

HEADS = 16
LAYOUTS = [(1, 12800, 72), (1, 6400, 72), (2, 10000, 72), (1, 20000, 72), (2, 6400, 80)]


def inputs(segments, seq_len, head_dim, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    qkv = torch.randn((segments * seq_len, 3, HEADS, head_dim), generator=g, device="cuda").to(torch.bfloat16)
    return (*qkv.unbind(1), torch.arange(segments + 1, dtype=torch.int32, device="cuda") * seq_len)


def smoke() -> None:
    import gluon_pdl

    for segments, seq_len, head_dim in LAYOUTS:
        q, k, v, cu = inputs(segments, seq_len, head_dim)
        gluon_pdl.gluon_varlen_attention(q, k, v, cu, seq_len, head_dim**-0.5)
    torch.cuda.synchronize()
    # A graph of the PDL launches, replayed on fresh inputs, against eager.
    q, k, v, cu = inputs(1, 12800, 72)
    out = torch.empty_like(q)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gluon_pdl.gluon_varlen_attention(q, k, v, cu, 12800, 72**-0.5, out=out)
    for seed in (1, 2):
        for static, fresh in zip((q, k, v), inputs(1, 12800, 72, seed)[:3]):
            static.copy_(fresh)
        graph.replay()
        eager = gluon_pdl.gluon_varlen_attention(q, k, v, cu, 12800, 72**-0.5)
        torch.cuda.synchronize()
        assert torch.equal(out, eager), "replay differs from eager"
    print("smoke ok (graph replay equals eager)")


def main(rep_ms: int) -> None:
    import gluon_pdl

    from rocm_vit.backends import gluon_attn
    from rocm_vit.cli.workload import device_ms

    rows = []
    for segments, seq_len, head_dim in LAYOUTS:
        q, k, v, cu = inputs(segments, seq_len, head_dim)
        out = torch.empty_like(q)
        flops = 4 * segments * seq_len**2 * HEADS * head_dim
        results = {}
        for label, module in (("shipped", gluon_attn), ("pdl", gluon_pdl), ("shipped again", gluon_attn),
                              ("pdl again", gluon_pdl)):  # fmt: skip
            call = lambda: module.gluon_varlen_attention(q, k, v, cu, seq_len, head_dim**-0.5, out=out)  # noqa: E731
            call()
            torch.cuda.synchronize()
            results[label] = out.clone()
            ms = device_ms(call, rep_ms)
            rows.append((f"{segments}x{seq_len} d{head_dim}", label, ms, flops / ms / 1e9))
            print(rows[-1], flush=True)
        same = torch.equal(results["shipped"], results["pdl"])
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
