"""``rocm-vit bench-memory``: reserved memory after capturing many layouts, one shared pool vs one pool per graph.

The bound we hold ourselves to: after capturing N layouts, reserved memory grows by at most
1.25 x (the largest single capture's pool + all per-graph I/O buffers). With one shared pool the
captures reuse each other's intermediates; with a private pool per graph (SGLang's upstream
default) every graph keeps its own, so memory grows with every new image size.
"""

from __future__ import annotations

import argparse
import gc
import json
from typing import Any

import torch

from rocm_vit.cli.workload import Workload, build_tower, random_pixels, random_workloads
from rocm_vit.graphs import CudaGraphs
from rocm_vit.models import VisionTower, preset_names
from rocm_vit.platform import platform_info

BOUND_FACTOR = 1.25


class PrivatePoolGraphs(CudaGraphs):
    """Upstream behaviour, for comparison only: every capture gets a pool of its own."""

    def __init__(self) -> None:
        self.pools: list[Any] = []

    def capture(self, fn, pool, stream):
        private = torch.cuda.graph_pool_handle()
        self.pools.append(private)
        return super().capture(fn, private, stream)

    def pool_bytes(self, pool: Any, device: torch.device) -> int:
        return sum(super(PrivatePoolGraphs, self).pool_bytes(p, device) for p in self.pools)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", choices=preset_names(), default="qwen3-vl-8b")
    parser.add_argument("--graphs", type=int, default=32, help="distinct layouts to capture (default 32)")
    parser.add_argument("--max-side", type=int, default=1024, help="largest image side in pixels (default 1024)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    if platform_info().name == "cpu":
        print("rocm-vit bench-memory measures GPU graph pools and needs a GPU; none is visible.")
        return 2
    device = torch.device("cuda")
    tower = build_tower(args.preset, device, torch.bfloat16, None, args.seed)
    workloads = _distinct(random_workloads(args.graphs * 2, args.seed, tower.config, args.max_side), args.graphs)
    # The largest layout goes first, so its pool alone is measured before the others share it.
    workloads.sort(key=lambda w: -w.patches)
    rows = [_measure(tower, workloads, mechanism, args.seed) for mechanism in ("shared", "private")]
    if args.json:
        print(json.dumps({"device": platform_info().device_name, "preset": args.preset, "rows": rows}, indent=2))
    else:
        print(format_rows(rows, args.preset))
    return 0 if rows[0]["within_bound"] else 1


def _measure(tower: VisionTower, workloads: list[Workload], mode: str, seed: int) -> dict:
    mechanism = CudaGraphs() if mode == "shared" else PrivatePoolGraphs()
    runner = tower.enable_graphs(capacity=len(workloads), mechanism=mechanism)
    baseline = _settled_reserved()
    single_pool = 0
    with torch.inference_mode():
        for index, workload in enumerate(workloads):
            pixels = random_pixels(workload, tower.config, tower.device, seed + index).to(tower.dtype)
            tower(pixels, list(workload.grid_thw))
            del pixels
            if index == 0:
                single_pool = runner.stats()["pool_bytes"]
    growth = _settled_reserved() - baseline
    stats = runner.stats()
    bound = BOUND_FACTOR * (single_pool + stats["buffer_bytes"])
    tower.disable_graphs()
    del runner, mechanism
    return {
        "pools": mode,
        "graphs": stats["graphs"],
        "largest_patches": workloads[0].patches,
        "largest_single_pool_bytes": single_pool,
        "pool_bytes": stats["pool_bytes"],
        "buffer_bytes": stats["buffer_bytes"],
        "reserved_growth_bytes": growth,
        "bound_bytes": bound,
        "within_bound": growth <= bound,
    }


def _settled_reserved() -> int:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.memory_reserved()


def _distinct(workloads: list[Workload], count: int) -> list[Workload]:
    seen, chosen = set(), []
    for workload in workloads:
        key = workload.grid_thw
        if key not in seen:
            seen.add(key)
            chosen.append(workload)
    return chosen[:count]


def format_rows(rows: list[dict], preset_name: str) -> str:
    mib = 2**20
    lines = [
        f"rocm-vit bench-memory  {preset_name}  bf16  {rows[0]['graphs']} layouts, largest "
        f"{rows[0]['largest_patches']} patches",
        f"{'pools':>8} {'graphs':>6} {'largest pool MiB':>16} {'all pools MiB':>13} {'buffers MiB':>11} "
        f"{'reserved growth MiB':>19} {'bound MiB':>9}  within",
    ]
    for row in rows:
        lines.append(
            f"{row['pools']:>8} {row['graphs']:>6} {row['largest_single_pool_bytes'] / mib:>16.0f} "
            f"{row['pool_bytes'] / mib:>13.0f} {row['buffer_bytes'] / mib:>11.0f} "
            f"{row['reserved_growth_bytes'] / mib:>19.0f} {row['bound_bytes'] / mib:>9.0f}  {row['within_bound']}"
        )
    return "\n".join(lines)
