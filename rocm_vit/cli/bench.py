"""``rocm-vit bench``: tower latency per image layout, eager against graphs, optionally against transformers.

Each row also gives an eager call's host and device cost apart (``workloads.launch_cost``): eager runs
near device speed only where host ms stays under device ms.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import logging
from datetime import datetime, timezone
from pathlib import Path

import torch

from rocm_vit.cli.breakdown import format_breakdown, kernel_breakdown
from rocm_vit.models import VisionTower, preset_names
from rocm_vit.platform import platform_info
from rocm_vit.version import build_info
from rocm_vit.workloads.launch_cost import MAX_AHEAD_MS, eager_cost
from rocm_vit.workloads.workload import (
    NAMED_SWEEPS,
    Workload,
    bench_graph_options,
    build_tower,
    median_ms,
    parse_layouts,
    progress,
    random_pixels,
    table_lines,
)

logger = logging.getLogger(__name__)

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", choices=preset_names(), help="tower (default: tiny on CPU, qwen3-vl-2b on a GPU)")
    parser.add_argument(
        "--layouts",
        default=None,
        help=f"named sweep ({', '.join(NAMED_SWEEPS)}) or specs like 1x512,4x512,1x768x1024,1x224+2x512,1x448f8 "
        "(default: 'default' on a GPU, 'tiny' on CPU)",
    )
    parser.add_argument("--dtype", choices=sorted(_DTYPES), help="default: bf16 on a GPU, fp32 on CPU")
    parser.add_argument("--attention-backend", help="override the attention backend (see rocm-vit doctor)")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per cell (default: 20 GPU, 3 CPU)")
    parser.add_argument("--capacity", type=int, default=32, help="graph cache capacity (default 32)")
    parser.add_argument("--no-graphs", action="store_true", help="eager column only")
    parser.add_argument("--baseline", choices=["transformers"], help="add transformers' own vision model, same weights")
    parser.add_argument("--plot", type=Path, help="write latency against patches to this PNG")
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="also profile each layout's kernels: time per forward in GEMMs, attention, norms, rotary, memory, other",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")


def run(args: argparse.Namespace) -> int:
    info = platform_info()
    on_gpu = info.name != "cpu"
    device = torch.device("cuda" if on_gpu else "cpu")
    preset_name = args.preset or ("qwen3-vl-2b" if on_gpu else "tiny")
    dtype = _DTYPES[args.dtype or ("bf16" if on_gpu else "fp32")]
    repeats = args.repeats or (20 if on_gpu else 3)
    tower = build_tower(preset_name, device, dtype, args.attention_backend, args.seed)
    workloads = parse_layouts(args.layouts or ("default" if on_gpu else "tiny"), tower.config)
    baseline = _transformers_baseline(tower) if args.baseline else None
    graphs = on_gpu and not args.no_graphs
    # Every row is timed with a graph, whatever its size: the serving defaults (a layout captured on
    # its second call, up to 4096 patches, within 1/64 of the device) would leave large rows eager.
    runner = tower.enable_graphs(**bench_graph_options(args.capacity, workloads, device)) if graphs else None

    rows = []
    with torch.inference_mode():
        for index, workload in enumerate(progress(workloads, "layouts", "layout")):
            pixels = random_pixels(workload, tower.config, device, args.seed + index).to(dtype)
            rows.append(_measure(tower, baseline, workload, pixels, repeats, graphs, args.breakdown))
    report = {
        **build_info(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "device": info.device_name,
        "platform": info.name,
        "torch": torch.__version__,
        "preset": preset_name,
        "dtype": str(dtype).removeprefix("torch."),
        "attention_backend": tower.attention.name,
        "repeats": repeats,
        "rows": rows,
        "runner": runner.stats() if runner else None,
        "peak_reserved_bytes": torch.cuda.max_memory_reserved() if on_gpu else 0,
    }
    if args.plot:
        _plot(rows, args.plot, f"{preset_name} {report['dtype']} on {info.device_name}")
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 1 if any(row["check"] == "MISMATCH" for row in rows) else 0


def _measure(
    tower: VisionTower,
    baseline: object | None,
    workload: Workload,
    pixels: torch.Tensor,
    repeats: int,
    graphs: bool,
    breakdown: bool = False,
) -> dict:
    device = pixels.device
    grid = list(workload.grid_thw)
    eager_out = tower(pixels, grid, use_graphs=False)
    row = {
        "layout": workload.spec,
        "patches": workload.patches,
        "tokens": eager_out.shape[0],
        "eager_ms": median_ms(lambda: tower(pixels, grid, use_graphs=False), device, repeats),
        **eager_cost(lambda: tower(pixels, grid, use_graphs=False), device, repeats).fields(),
    }
    check = "finite" if torch.isfinite(eager_out).all() else "NON-FINITE"
    if graphs:
        runner = tower.graph_runner
        before = runner.stats()["capture_seconds"]
        graph_out = tower(pixels, grid)  # first call captures (or falls back)
        row["capture_ms"] = (runner.stats()["capture_seconds"] - before) * 1e3
        row["graph_ms"] = median_ms(lambda: tower(pixels, grid), device, repeats)
        row["speedup"] = row["eager_ms"] / row["graph_ms"]
        check = "exact" if torch.equal(graph_out, eager_out) else "MISMATCH"
    if baseline is not None:
        grid_tensor = torch.tensor(grid, device=device)
        row["transformers_ms"] = median_ms(lambda: baseline(pixels, grid_tensor), device, repeats)
    if breakdown:
        row["breakdown"] = kernel_breakdown(lambda: tower(pixels, grid, use_graphs=False), device)
    row["check"] = check
    return row


# transformers' module, config class and model class for each tower family (by model_type).
_TRANSFORMERS_TOWERS = {
    "qwen3_vl": ("transformers.models.qwen3_vl.modeling_qwen3_vl", "Qwen3VLVisionConfig", "Qwen3VLVisionModel"),
    "qwen2_5_vl": (
        "transformers.models.qwen2_5_vl.modeling_qwen2_5_vl",
        "Qwen2_5_VLVisionConfig",
        "Qwen2_5_VisionTransformerPretrainedModel",
    ),
}


def _transformers_baseline(tower: VisionTower):
    """transformers' own tower with the same weights (sdpa attention), or an error saying what is missing."""
    module_name, config_name, model_name = _TRANSFORMERS_TOWERS[tower.config.model_type]
    try:
        module = importlib.import_module(module_name)
        config_cls, model_cls = getattr(module, config_name), getattr(module, model_name)
    except (ImportError, AttributeError) as error:
        raise SystemExit(f"--baseline transformers needs transformers >= 4.57 installed ({error})") from None
    # Our config fields carry transformers' names; only the rotary base moved into rope_parameters.
    fields = dataclasses.asdict(tower.config)
    rope_theta = fields.pop("rope_theta")
    hf_config = config_cls(**fields)
    hf_config.rope_parameters = {**hf_config.rope_parameters, "rope_theta": rope_theta}
    hf_config._attn_implementation = "sdpa"
    model = model_cls(hf_config)
    model.load_state_dict(tower.state_dict())
    return model.to(device=tower.device, dtype=tower.dtype).eval()


def format_report(report: dict) -> str:
    """The table printed last: one row per layout, graph columns when graphs ran."""
    rows = report["rows"]
    columns = [("layout", "layout", "{}"), ("patches", "patches", "{}"), ("tokens", "tokens", "{}")]
    columns.append(("eager_ms", "eager ms", "{:.2f}"))
    columns += [(key, title, fmt) for key, title, fmt in LAUNCH_COLUMNS if rows and key in rows[0]]
    if rows and "graph_ms" in rows[0]:
        columns += [("graph_ms", "graph ms", "{:.2f}"), ("speedup", "speedup", "{:.2f}x")]
        columns.append(("capture_ms", "capture ms", "{:.0f}"))
    if rows and "transformers_ms" in rows[0]:
        columns.append(("transformers_ms", "transformers ms", "{:.2f}"))
    columns.append(("check", "check", "{}"))
    cells = [[_cell(fmt, row[key]) for key, _, fmt in columns] for row in rows]
    lines = [
        f"rocm-vit {report['rocm_vit']} bench  {report['date']}  {report['device']}  commit {report['commit']}  "
        f"torch {report['torch']}",
        f"preset {report['preset']}  {report['dtype']}  attention {report['attention_backend']}  "
        f"median of {report['repeats']}",
        *table_lines([title for _, title, _ in columns], cells),
    ]
    waited = [row["layout"] for row in rows if not row.get("busy_ahead", True)]
    if waited:
        lines.append(f"host ms includes waits on the device (a sleep of {MAX_AHEAD_MS:.0f} ms ahead ran out): {waited}")
    runner = report["runner"]
    if runner:
        lines.append(
            f"graphs held {runner['graphs']}  captures {runner['captures']}  replays {runner['replays']}  "
            f"eager runs {sum(runner['eager_runs'].values())}  pool {runner['pool_bytes'] / 2**20:.0f} MiB  "
            f"graph staging {runner['staging_bytes'] / 2**20:.0f} MiB  "
            f"peak reserved {report['peak_reserved_bytes'] / 2**20:.0f} MiB"
        )
    if rows and "breakdown" in rows[0]:
        lines.append(format_breakdown(rows))
    return "\n".join(lines)


# An eager call's host and device cost (launch_cost.EagerCost): row key, title, format; "-" off the GPU.
LAUNCH_COLUMNS = (
    ("host_ms", "host ms", "{:.2f}"),
    ("device_ms", "device ms", "{:.2f}"),
    ("kernels", "kernels", "{}"),
    ("host_us_per_launch", "host us/launch", "{:.1f}"),
)


def _cell(fmt: str, value: object) -> str:
    return "-" if value is None else fmt.format(value)


def _plot(rows: list[dict], path: Path, title: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.error("--plot needs matplotlib (pip install rocm-vit[bench]); no plot written")
        return
    figure, axes = plt.subplots(figsize=(7, 4.5))
    ordered = sorted(rows, key=lambda row: row["patches"])
    for key, label in (
        ("eager_ms", "rocm-vit eager"),
        ("graph_ms", "rocm-vit graphs"),
        ("transformers_ms", "transformers"),
    ):
        if key in ordered[0]:
            axes.plot([r["patches"] for r in ordered], [r[key] for r in ordered], marker="o", label=label)
    axes.set(xscale="log", yscale="log", xlabel="patches", ylabel="latency (ms, median)", title=title)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    logger.info("plot written to %s", path)
