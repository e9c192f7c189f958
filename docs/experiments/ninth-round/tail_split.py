"""#16, ninth round: gluon_attn's tail split on an H200, against the unsplit launch and other plans.

    PYTHONPATH=$PWD python docs/experiments/ninth-round/tail_split.py [--rep-ms 100] [--skip-times] [--skip-fp64] [--skip-tower]

Parts (a table each, printed at the end):
1. times, graph-replayed (rocm_vit.cli.workload.device_ms): per layout the unsplit launch, the plan
   the module picks, and other plans (tail blocks x splits), with the wave model's prediction;
2. float64 error at 47,376 tokens (d72, d80) of gluon_attn, triton_attn and cuDNN, and at 1x12800
   of the split and unsplit gluon_attn;
3. the 8B tower at 1x2048x1600, eager, median of 5, with and without the split, same process.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import time

import torch

from rocm_vit.backends import gluon_attn, tail_split
from rocm_vit.backends.tail_split import TailSplit, plan_tail_split
from rocm_vit.cli.workload import device_ms

HEADS = 16
LAYOUTS = [(1, 12800), (1, 6400), (2, 6400), (1, 20000), (2, 10000), (1, 10000), (1, 14400), (1, 16384),
           (2, 8160), (1, 8160), (2, 12800), (1, 47376)]  # fmt: skip


def inputs(segments, seq_len, head_dim, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    qkv = torch.randn((segments * seq_len, 3, HEADS, head_dim), generator=g, device="cuda").to(dtype)
    cu = torch.arange(segments + 1, dtype=torch.int32, device="cuda") * seq_len
    return (*qkv.unbind(1), cu)


@contextlib.contextmanager
def forced(plan):
    """gluon_attn with this plan (None: unsplit) whatever the shapes."""
    saved = gluon_attn.plan_tail_split
    gluon_attn.plan_tail_split = lambda *args: plan
    try:
        yield
    finally:
        gluon_attn.plan_tail_split = saved


def model_cost(blocks, ppb, sms, plan):
    step = blocks + tail_split.PROGRAM_OVERHEAD_TILES
    if plan is None:
        return math.ceil(blocks * ppb / sms) * step
    return (math.ceil(plan.first_tail_block * ppb / sms) * step
            + math.ceil(plan.tail_blocks * ppb * plan.splits / sms) * (math.ceil(blocks / plan.splits) + 1)
            + tail_split.SPLIT_OVERHEAD_TILES)  # fmt: skip


def candidates(blocks, ppb, sms):
    """Unsplit, the module's plan, and for the two smallest tails that remove a wave, 2/4/8/16 splits."""
    plans = [None]
    auto = plan_tail_split(blocks * 128, 128, ppb, sms)
    if auto is not None:
        plans.append(auto)
    whole_waves = math.ceil(blocks * ppb / sms)
    tails = [t for t in range(1, blocks) if math.ceil((blocks - t) * ppb / sms) < whole_waves][:2]
    for t in tails:
        for k in (2, 4, 8, 16):
            if blocks // k >= 2:
                plan = TailSplit(blocks - t, t, k)
                if plan not in plans:
                    plans.append(plan)
    return plans


def part_times(rep_ms):
    rows = []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for segments, seq_len in LAYOUTS:
        q, k, v, cu = inputs(segments, seq_len, 72)
        out = torch.empty_like(q)
        blocks = math.ceil(seq_len / 128)
        ppb = HEADS * segments
        auto = plan_tail_split(seq_len, 128, ppb, sms)
        with forced(None):
            gluon_attn.gluon_varlen_attention(q, k, v, cu, seq_len, 72**-0.5, out=out)
            whole = out.clone()
        base_ms = None
        for plan in candidates(blocks, ppb, sms):
            with forced(plan):
                call = lambda: gluon_attn.gluon_varlen_attention(q, k, v, cu, seq_len, 72**-0.5, out=out)  # noqa: E731
                call()
                torch.cuda.synchronize()
                diff = (out.float() - whole.float()).abs().max().item()
                ms = device_ms(call, rep_ms)
            base_ms = base_ms or ms
            predicted = model_cost(blocks, ppb, sms, plan) / model_cost(blocks, ppb, sms, None)
            flops = 4 * segments * seq_len**2 * HEADS * 72
            rows.append((f"{segments}x{seq_len}", "unsplit" if plan is None else f"{plan.tail_blocks}x{plan.splits}",
                         "yes" if plan == auto else "", ms, ms / base_ms, predicted, flops / ms / 1e9, diff))
            print(rows[-1], flush=True)
    return rows


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


def part_fp64():
    from rocm_vit.attention import get_backend
    from rocm_vit.backends.triton_attn import triton_varlen_attention

    rows = []
    sdpa = get_backend("sdpa")
    from rocm_vit.layout import VisionLayout

    for segments, seq_len, head_dim, grid in ((1, 47376, 72, [(1, 188, 252)]), (1, 47376, 80, [(1, 188, 252)]),
                                              (1, 12800, 72, [(1, 100, 128)])):  # fmt: skip
        q, k, v, cu = inputs(segments, seq_len, head_dim)
        scale = head_dim**-0.5
        expected = reference64(q, k, v, cu, scale)
        layout = VisionLayout.from_grid_thw(grid, spatial_merge_size=1)
        assert layout.num_patches == seq_len
        results = {}
        with forced(None):
            results["gluon_attn unsplit"] = gluon_attn.gluon_varlen_attention(q, k, v, cu, seq_len, scale)
        auto = plan_tail_split(seq_len, 128, HEADS * segments, torch.cuda.get_device_properties(0).multi_processor_count)
        if auto is not None:
            results[f"gluon_attn split {auto.tail_blocks}x{auto.splits}"] = gluon_attn.gluon_varlen_attention(
                q, k, v, cu, seq_len, scale)
        results["triton_attn"] = triton_varlen_attention(q, k, v, cu, seq_len, scale)
        results["cuDNN (sdpa)"] = sdpa(q, k, v, sdpa.runner_args(layout, cu), scale)
        for name, out in results.items():
            err = (out.double() - expected)
            rows.append((f"{segments}x{seq_len} d{head_dim}", name, (err.norm() / expected.norm()).item(),
                         err.abs().max().item()))
            print(rows[-1], flush=True)
        del expected
        torch.cuda.empty_cache()
    return rows


def part_tower():
    from rocm_vit.cli.main import main

    rows = []
    for label, plan_fn in (("split (shipped)", None), ("unsplit", lambda *args: None)):
        saved = gluon_attn.plan_tail_split
        if plan_fn is not None:
            gluon_attn.plan_tail_split = plan_fn
        try:
            start = time.perf_counter()
            main(["bench", "--preset", "qwen3-vl-8b", "--layouts", "1x2048x1600,1x3024x4032", "--no-graphs",
                  "--repeats", "5"])  # fmt: skip
            rows.append((label, time.perf_counter() - start))
        finally:
            gluon_attn.plan_tail_split = saved
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rep-ms", type=int, default=100)
    parser.add_argument("--skip-times", action="store_true")
    parser.add_argument("--skip-fp64", action="store_true")
    parser.add_argument("--skip-tower", action="store_true")
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), "SMs", torch.cuda.get_device_properties(0).multi_processor_count)
    times = [] if args.skip_times else part_times(args.rep_ms)
    errors = [] if args.skip_fp64 else part_fp64()
    tower = [] if args.skip_tower else part_tower()
    print("\n| layout | plan (tail blocks x splits) | module's pick | ms | rel. to unsplit | model | TFLOP/s | max abs diff to unsplit |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for row in times:
        print(f"| {row[0]} | {row[1]} | {row[2]} | {row[3]:.3f} | {row[4]:.3f} | {row[5]:.3f} | {row[6]:.0f} | {row[7]:.1e} |")
    if errors:
        print("\n| layout | kernel | rel. error vs float64 | max abs |")
        print("|---|---|---:|---:|")
        for row in errors:
            print(f"| {row[0]} | {row[1]} | {row[2]:.3e} | {row[3]:.1e} |")
    for row in tower:
        print("tower run:", row)


if __name__ == "__main__":
    main()
