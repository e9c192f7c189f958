"""#16, tenth round: gluon_attn with part of the softmax's exp2 on the FMA pipe (FA4's polynomial).

Why: Nsight Compute (ninth round, 1x12800 d72) put the SFU at 47 % and the tensor pipe at 57 %. At head
dim 72 a key tile costs the SM 1,056 cycles of MUFU.EX2 (2 x 128 threads x 66 exp2 at 16 per clock)
against 1,280 of wgmma at the peak rate: 0.82 of it, against 0.45 at head dim 128, and the two consumer
warpgroups' softmaxes share each scheduler's MUFU unit. A polynomial exp2 costs 8 FMA/ALU
instructions (1 cycle each) where MUFU takes 8 cycles per warp: moving about a quarter of the exp2s
balances the two pipes (tenth round, benchmarks.md).

Variants (pack, emulated): every `pack` consecutive scores of a thread, `emulated` go to the
polynomial. (0, 0) is the shipped kernel. Same process, passes interleaved.

    PYTHONPATH=$PWD:$PWD/docs/experiments/tenth-round python docs/experiments/tenth-round/poly_exp2.py [--rep-ms 100]
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

import gluon_poly
from rocm_vit.backends import gluon_attn
from rocm_vit.cli.workload import device_ms

HEADS = 16
LAYOUTS = [(1, 12800, 72), (1, 47376, 72), (1, 12800, 80), (1, 47376, 80), (1, 8160, 72), (2, 8160, 72),
           (1, 14400, 72)]  # fmt: skip
VARIANTS = [(0, 0), (8, 1), (4, 1), (8, 3)]


def inputs(segments, seq_len, head_dim, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    qkv = torch.randn((segments * seq_len, 3, HEADS, head_dim), generator=g, device="cuda").to(torch.bfloat16)
    cu = torch.arange(segments + 1, dtype=torch.int32, device="cuda") * seq_len
    return (*qkv.unbind(1), cu)


@triton.jit
def _exp2_kernel(x_ptr, y_ptr, n, ASM: tl.constexpr, CON: tl.constexpr, PACK: tl.constexpr):
    offs = tl.program_id(0) * 1024 + tl.arange(0, 1024)
    x = tl.load(x_ptr + offs, mask=offs < n)
    y = tl.inline_asm_elementwise(ASM, CON, [x], tl.float32, True, PACK)
    tl.store(y_ptr + offs, y, mask=offs < n)


def part_function():
    """The asm alone: every lane of a pack of 8 with 8 emulated, over [-130, 0.01] and -inf."""
    x = torch.cat([torch.linspace(-130, 0.01, 1 << 22, device="cuda"),
                   torch.tensor([float("-inf")] * 8 + [0.0] * 8 + [-1.0] * 8 + [-126.5] * 8, device="cuda")])
    x = x[: x.numel() // 8 * 8].contiguous()
    y = torch.full_like(x, float("nan"))
    _exp2_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), gluon_poly.exp2_asm(8, 8),
                                                   ",".join(["=r"] * 8 + ["r"] * 8), 8)
    expected = torch.exp2(x.double())
    normal = expected > 2.0**-126
    rel = ((y.double() - expected).abs() / expected)[normal].max().item()
    tiny = (y.double() - expected)[~normal].abs().max().item()
    print(f"polynomial exp2: max rel error {rel:.3e} (x > -126), max abs error below 2^-126 {tiny:.3e}, "
          f"exp2(-inf) = {y[-32].item()}, exp2(0) = {y[-24].item()}, exp2(-1) = {y[-16].item()}")
    return rel


def reference64(q, k, v, cu, scale, chunk=4096):
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    bounds = cu.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        for h in range(q.shape[1]):
            kk, vv = k[start:end, h].double(), v[start:end, h].double()
            for c in range(start, end, chunk):
                qq = q[c:min(c + chunk, end), h].double()
                out[c:c + qq.shape[0], h] = torch.softmax((qq @ kk.T) * scale, -1) @ vv
    return out


def run(q, k, v, cu, seq_len, head_dim, variant, out):
    gluon_poly.EXP2_SPLIT = variant
    return gluon_poly.gluon_varlen_attention(q, k, v, cu, seq_len, head_dim**-0.5, out=out)


def part_times(rep_ms):
    rows = []
    for segments, seq_len, head_dim in LAYOUTS:
        q, k, v, cu = inputs(segments, seq_len, head_dim)
        flops = 4 * segments * seq_len**2 * HEADS * head_dim
        shipped = gluon_attn.gluon_varlen_attention(q, k, v, cu, seq_len, head_dim**-0.5)
        outs = {var: torch.full_like(q, float("nan")) for var in VARIANTS}
        for var in VARIANTS:
            run(q, k, v, cu, seq_len, head_dim, var, outs[var])
        torch.cuda.synchronize()
        name = f"{segments}x{seq_len} d{head_dim}"
        print(name, "(0, 0) equals the shipped module:", torch.equal(outs[(0, 0)], shipped), flush=True)
        times = {var: [] for var in VARIANTS}
        for _ in range(2):
            for var in VARIANTS:
                out = outs[var]
                times[var].append(device_ms(lambda: run(q, k, v, cu, seq_len, head_dim, var, out), rep_ms))  # noqa: B023
        for var in VARIANTS:
            diff = (outs[var].float() - shipped.float()).abs().max().item()
            best = min(times[var])
            rows.append((name, var, times[var], flops / best / 1e9, diff))
            print(rows[-1], flush=True)
    return rows


def part_fp64():
    rows = []
    for segments, seq_len, head_dim in ((1, 12800, 72), (1, 47376, 72)):
        q, k, v, cu = inputs(segments, seq_len, head_dim, seed=1)
        expected = reference64(q, k, v, cu, head_dim**-0.5)
        for var in VARIANTS:
            out = run(q, k, v, cu, seq_len, head_dim, var, torch.full_like(q, float("nan")))
            err = out.double() - expected
            rows.append((f"{segments}x{seq_len} d{head_dim}", var, (err.norm() / expected.norm()).item(),
                         err.abs().max().item()))
            print(rows[-1], flush=True)
        del expected
        torch.cuda.empty_cache()
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rep-ms", type=int, default=100)
    parser.add_argument("--skip-fp64", action="store_true")
    args = parser.parse_args()
    part_function()
    times = part_times(args.rep_ms)
    errors = [] if args.skip_fp64 else part_fp64()
    print("\n| layout | exp2 on FMA (pack, emulated) | ms, pass 1 / pass 2 | TFLOP/s (best) | max diff to shipped |")
    print("|---|---|---|---:|---:|")
    for name, var, ms, tflops, diff in times:
        print(f"| {name} | {var} | {ms[0]:.3f} / {ms[1]:.3f} | {tflops:.0f} | {diff:.2e} |")
    if errors:
        print("\n| layout | variant | rel. error vs float64 | max abs |")
        print("|---|---|---:|---:|")
        for name, var, rel, mx in errors:
            print(f"| {name} | {var} | {rel:.4e} | {mx:.3e} |")


if __name__ == "__main__":
    main()
