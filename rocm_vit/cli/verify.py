"""``rocm-vit verify``: graph output == eager output, bit for bit, over random layouts.

Capacity is below the number of layouts, so captures, evictions, replays and eager runs interleave
as in a busy server, under ``inference_mode`` and ``no_grad``: what a user runs on an MI355X to trust
the graphs. ``--padded``: one graph replays layouts it was not captured from.
"""

from __future__ import annotations

import argparse
import json

import torch

from rocm_vit.models import preset_names
from rocm_vit.platform import platform_info
from rocm_vit.version import build_info
from rocm_vit.workloads.workload import bench_graph_options, build_tower, random_pixels, random_workloads

_GRAD_MODES = {"inference": torch.inference_mode, "no_grad": torch.no_grad}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--layouts", type=int, default=24, help="random layouts to check (default 24)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--preset", choices=preset_names(), default=None, help="default: qwen3-vl-2b (GPU)")
    parser.add_argument("--capacity", type=int, default=None, help="graph cache capacity (default: layouts / 2)")
    parser.add_argument("--max-side", type=int, default=2048, help="largest image side in pixels (default 2048)")
    parser.add_argument("--attention-backend", help="override the attention backend")
    parser.add_argument(
        "--grad-mode",
        choices=sorted(_GRAD_MODES),
        default="inference",
        help="inference (torch.inference_mode, as serving runs) or no_grad (default inference)",
    )
    parser.add_argument(
        "--padded",
        action="store_true",
        help="small layouts padded to shared buckets, as serving runs them (one graph serves many layouts)",
    )
    parser.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    info = platform_info()
    if info.name == "cpu":
        print("rocm-vit verify compares CUDA/HIP graphs with eager runs and needs a GPU; none is visible.")
        return 2
    device = torch.device("cuda")
    tower = build_tower(args.preset or "qwen3-vl-2b", device, torch.bfloat16, args.attention_backend, args.seed)
    capacity = args.capacity if args.capacity is not None else max(1, args.layouts // 2)
    workloads = random_workloads(args.layouts, args.seed, tower.config, args.max_side)
    runner = tower.enable_graphs(**bench_graph_options(capacity, workloads, device), padded=args.padded)
    # Each layout twice: the second visit replays what the first captured (or stays eager).
    schedule = workloads + workloads[::-1]
    rows = []
    with _GRAD_MODES[args.grad_mode]():
        for index, workload in enumerate(schedule):
            pixels = random_pixels(workload, tower.config, device, args.seed + index).to(tower.dtype)
            graph_out = tower(pixels, list(workload.grid_thw))
            eager_out = tower(pixels, list(workload.grid_thw), use_graphs=False)
            exact = torch.equal(graph_out, eager_out)
            rows.append(
                {
                    "layout": workload.spec if len(workload.spec) <= 48 else workload.spec[:45] + "...",
                    "patches": workload.patches,
                    "exact": exact,
                    "max_abs_diff": 0.0 if exact else (graph_out.float() - eager_out.float()).abs().max().item(),
                }
            )
    stats = runner.stats()
    mismatches = sum(not row["exact"] for row in rows)
    where = f"{info.device_name}" + (f" emulating ROCm {info.arch}" if info.emulated_on else "")
    if args.json:
        report = {**build_info(), "device": where, "grad_mode": args.grad_mode, "rows": rows, "runner": stats}
        print(json.dumps(report, indent=2))
    else:
        print(f"{'layout':<48} {'patches':>8}  result")
        for row in rows:
            result = "exact" if row["exact"] else f"MISMATCH (max |diff| {row['max_abs_diff']:.3g})"
            print(f"{row['layout']:<48} {row['patches']:>8}  {result}")
        print(
            f"{len(rows)} runs on {where} ({args.grad_mode}): {len(rows) - mismatches} exact, {mismatches} "
            f"mismatched; captures {stats['captures']}, replays {stats['replays']}, evictions "
            f"{stats['evictions']}, eager {stats['eager_runs']}"
        )
    return 1 if mismatches else 0
