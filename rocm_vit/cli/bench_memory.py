"""``rocm-vit bench-memory``: the graph runner's defaults (and ``--budget-mib``) under serving streams.

Scenarios (``SCENARIOS``): ``mixed`` (hot layouts: hit rate, bytes held), ``random`` (reserved-memory
growth), ``streams`` (threads replaying shared graphs: outputs equal eager), ``churn`` (every layout
captured: refusals), ``capture-stall`` (another stream's p99 while capturing). Exit status 1 when a
target is missed, 2 without a GPU. Figures: docs/benchmarks.md, "`rocm-vit bench-memory`".
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import torch

from rocm_vit.graphs import (
    DEFAULT_CAPACITY,
    DEFAULT_MAX_TOKENS,
    DEFAULT_MIN_HITS,
    default_budget_bytes,
)
from rocm_vit.models import preset_names
from rocm_vit.platform import platform_info
from rocm_vit.version import build_info
from rocm_vit.workloads.memory import (
    CHURN_CAPACITY,
    Traces,
    capture_stall,
    churn,
    mixed,
    random_layouts,
    release_graphs,
    streams,
)
from rocm_vit.workloads.workload import (
    DEFAULT_ONE_OFF_MAX_SIDE_PX,
    build_tower,
    table_lines,
)

logger = logging.getLogger(__name__)

SCENARIOS = ("mixed", "random", "streams", "churn", "capture-stall")
HIT_RATE_TARGET = 0.75
RESERVED_GROWTH_TARGET_BYTES = 256 << 20
STALL_P99_TARGET = 2.0
# random_workloads draws video sides up to a quarter of the largest side, from 64 px.
_MIN_MAX_SIDE_PX = 256
_MIB = 2**20

# (scenario, metric, value, target, met); ``met`` is None where no target applies.
Row = tuple[str, str, str, str, bool | None]
ROW_FIELDS = ("scenario", "metric", "value", "target", "met")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--scenario", choices=[*SCENARIOS, "all"], default="all", help="which serving stream to replay (default all)"
    )
    parser.add_argument("--preset", choices=preset_names(), default="qwen3-vl-8b", help="tower (default qwen3-vl-8b)")
    parser.add_argument(
        "--budget-mib",
        type=_int_at_least(0),
        default=None,
        help="graph memory budget, MiB (default: the runner's, 1/64 of the device's memory, 256 MiB .. 4 GiB)",
    )
    parser.add_argument(
        "--churn-calls", type=_int_at_least(1), default=1200, help="calls of the churn stream (default 1200)"
    )
    parser.add_argument("--calls", type=_int_at_least(1), default=1500, help="calls of the mixed stream (default 1500)")
    parser.add_argument(
        "--random-calls", type=_int_at_least(1), default=2000, help="calls of the random stream (default 2000)"
    )
    parser.add_argument(
        "--max-side",
        type=_int_at_least(_MIN_MAX_SIDE_PX),
        default=DEFAULT_ONE_OFF_MAX_SIDE_PX,
        help=f"largest image side of one-offs and random layouts, px (default {DEFAULT_ONE_OFF_MAX_SIDE_PX}; "
        "4032 brings in 12 MP phone photos, 47,376 patches, and takes several times longer)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument(
        "--plot", type=Path, metavar="FILE", help="write bytes held and per-call latency to this PNG (needs matplotlib)"
    )


def run(args: argparse.Namespace) -> int:
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        print("rocm-vit bench-memory: --plot needs matplotlib: pip install rocm-vit[bench]", file=sys.stderr)
        return 2
    info = platform_info()
    if info.name == "cpu":
        print("rocm-vit bench-memory replays serving streams through CUDA/HIP graphs and needs a GPU; none is visible.")
        return 2
    tower = build_tower(args.preset, torch.device("cuda"), torch.bfloat16, None, args.seed)
    if args.budget_mib is None:
        budget_bytes = default_budget_bytes(torch.cuda.get_device_properties(tower.device).total_memory)
    else:
        budget_bytes = args.budget_mib * _MIB
    chosen = SCENARIOS if args.scenario == "all" else (args.scenario,)
    scenarios: dict[str, dict] = {}
    traces = Traces()
    with torch.inference_mode():
        if "mixed" in chosen:
            scenarios["mixed"] = mixed(tower, budget_bytes, args.calls, args.max_side, args.seed, traces)
            release_graphs(tower)
        if "random" in chosen:
            scenarios["random"] = random_layouts(
                tower, budget_bytes, args.random_calls, args.max_side, args.seed, traces
            )
            release_graphs(tower)
        if "streams" in chosen:
            scenarios["streams"] = streams(tower, budget_bytes, args.max_side, args.seed)
            release_graphs(tower)
        if "churn" in chosen:
            scenarios["churn"] = churn(args.preset, budget_bytes, args.churn_calls, args.seed)
        if "capture-stall" in chosen:
            scenarios["capture-stall"] = capture_stall(tower, args.seed)
            release_graphs(tower)
    report = {
        **build_info(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "device": info.device_name,
        "platform": info.name,
        "torch": torch.__version__,
        "preset": args.preset,
        "dtype": "bf16",
        "attention_backend": tower.attention.name,
        "budget_bytes": budget_bytes,
        "graph_defaults": {
            "capacity": DEFAULT_CAPACITY,
            "min_hits": DEFAULT_MIN_HITS,
            "max_tokens": DEFAULT_MAX_TOKENS,
        },
        "max_side_px": args.max_side,
        "seed": args.seed,
        "scenarios": scenarios,
    }
    report["rows"] = [dict(zip(ROW_FIELDS, row, strict=True)) for row in table_rows(report)]
    if args.plot:
        _plot(traces, budget_bytes, args.plot, f"{args.preset} bf16 on {info.device_name}")
    print(json.dumps(report, indent=2) if args.json else format_table(report))
    return exit_status(report)


def _int_at_least(least: int) -> Callable[[str], int]:
    def integer(text: str) -> int:
        value = int(text)
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
        return value

    return integer


# Report -----------------------------------------------------------------------------------------


def table_rows(report: dict) -> list[Row]:
    """What the table shows, targets evaluated: ``(scenario, metric, value, target, met)`` per line."""
    budget = report["budget_bytes"]
    within_budget = f"<= {_mib(budget)}"
    scenarios = report["scenarios"]
    rows: list[Row] = []
    if "mixed" in scenarios:
        mixed = scenarios["mixed"]
        graphs, eager = mixed["graph_run"], mixed["eager_run"]
        rows += [
            (
                "mixed",
                "calls",
                f"{mixed['calls']}: {mixed['hot_calls']} to {mixed['hot_layouts']} hot layouts, "
                f"{mixed['one_off_calls']} one-offs",
                "",
                None,
            ),
            (
                "mixed",
                "hit rate (replays / calls)",
                f"{mixed['hit_rate']:.1%} ({mixed['replays']} replays)",
                f">= {HIT_RATE_TARGET:.0%}",
                mixed["hit_rate"] >= HIT_RATE_TARGET,
            ),
            (
                "mixed",
                "max bytes held",
                _mib(mixed["max_bytes_held"]),
                within_budget,
                mixed["max_bytes_held"] <= budget,
            ),
            ("mixed", "final bytes held", _mib(mixed["final_bytes_held"]), "", None),
            *_counter_rows("mixed", mixed),
            ("mixed", "mean ms, graphs vs all-eager", f"{graphs['mean_ms']:.2f} vs {eager['mean_ms']:.2f}", "", None),
            (
                "mixed",
                "median ms, graphs vs all-eager",
                f"{graphs['median_ms']:.2f} vs {eager['median_ms']:.2f}",
                "",
                None,
            ),
            (
                "mixed",
                "total s, graphs vs all-eager",
                f"{graphs['total_s']:.1f} vs {eager['total_s']:.1f} ({eager['total_s'] / graphs['total_s']:.2f}x)",
                "",
                None,
            ),
            (
                "mixed",
                "peak reserved growth, graphs vs all-eager",
                f"{_mib(graphs['peak_reserved_growth_bytes'])} vs {_mib(eager['peak_reserved_growth_bytes'])}",
                "",
                None,
            ),
        ]
    if "random" in scenarios:
        random_run = scenarios["random"]
        growth = random_run["peak_reserved_growth_after_warm_up_bytes"]
        eager_growth = random_run["all_eager_peak_reserved_growth_after_warm_up_bytes"]
        rows += [
            (
                "random",
                "calls",
                f"{random_run['calls']}: {random_run['distinct_layouts']} distinct layouts, "
                f"hit rate {random_run['hit_rate']:.1%}",
                "",
                None,
            ),
            (
                "random",
                "max bytes held, after every call",
                f"{_mib(random_run['max_bytes_held'])} ({random_run['calls_over_budget']} calls over)",
                within_budget,
                random_run["max_bytes_held"] <= budget,
            ),
            (
                "random",
                f"reserved growth after {random_run['warm_up_calls']} warm-up calls",
                f"{_mib(growth)} peak, {_mib(random_run['reserved_growth_after_warm_up_bytes'])} at the end; "
                f"all-eager {_mib(eager_growth)} peak",
                "",
                None,
            ),
            (
                "random",
                "reserved growth graphs add over all-eager",
                _mib(growth - eager_growth),
                f"<= {_mib(RESERVED_GROWTH_TARGET_BYTES)}",
                growth - eager_growth <= RESERVED_GROWTH_TARGET_BYTES,
            ),
            (
                "random",
                "reserved by holder, after warm-up -> at the largest sample",
                ", ".join(
                    f"{holder} {_mib(random_run['reserved_after_warm_up_by_holder'].get(holder, 0))} -> {_mib(size)}"
                    for holder, size in random_run["reserved_at_the_largest_sample"]["by_holder"].items()
                )
                or "-",
                "",
                None,
            ),
            *_counter_rows("random", random_run),
        ]
    if "churn" in scenarios:
        churn = scenarios["churn"]
        rows.append(
            (
                "churn",
                "calls",
                f"{churn['calls']}: {churn['distinct_layouts']} distinct layouts up to {churn['largest_tokens']} "
                f"patches, {churn['depth']} blocks, capacity {CHURN_CAPACITY}, every layout captured at first sight",
                "",
                None,
            )
        )
        for name, run in churn["runs"].items():
            scenario = f"churn, {name} budget {_mib(run['budget_bytes'])}"
            refused_ok = run["refused_calls"] == 0 if name == "ample" else _refused_only_when_measured(run)
            rows += [
                (
                    scenario,
                    "calls refused over_budget",
                    f"{run['refused_calls']} (smallest {run['smallest_refused_tokens']} patches; measured over "
                    f"alone from {run['over_budget_from_tokens']})",
                    "0" if name == "ample" else "only layouts measured over the budget alone",
                    refused_ok,
                ),
                (
                    scenario,
                    "max bytes held",
                    _mib(run["max_bytes_held"]),
                    f"<= {_mib(run['budget_bytes'])}",
                    run["max_bytes_held"] <= run["budget_bytes"],
                ),
                (scenario, "outputs unequal to eager", f"{run['mismatches']}", "0", run["mismatches"] == 0),
                (
                    scenario,
                    "pool growth predicted vs measured",
                    f"mean error {_mib(run['pool_growth_prediction']['mean_absolute_error_bytes'])}, worst under "
                    f"{_mib(run['pool_growth_prediction']['worst_under_bytes'])} over "
                    f"{run['pool_growth_prediction']['captures']} captures",
                    "",
                    None,
                ),
                (
                    scenario,
                    "capture / verification ms each",
                    f"{1e3 * run['capture_seconds'] / max(1, run['captures']):.1f} / "
                    f"{1e3 * run['verify_seconds'] / max(1, run['captures']):.2f}",
                    "",
                    None,
                ),
                *_counter_rows(scenario, run),
            ]
    if "capture-stall" in scenarios:
        stall = scenarios["capture-stall"]
        alone = stall["alone"]
        rows.append(
            (
                "capture-stall",
                f"another thread's loop ({stall['loop']}), alone",
                f"p50 {alone['p50_ms']:.2f} ms, p99 {alone['p99_ms']:.2f} ms",
                "",
                None,
            )
        )
        for name in ("before", "now"):
            window = stall[name]
            ratio = window["p99_ms"] / window["p50_ms"] if window["p50_ms"] else float("inf")
            label = "torch.cuda.graph (before)" if name == "before" else "capture_begin on the runner's stream (now)"
            rows.append(
                (
                    "capture-stall",
                    f"its p50 / p99 while {window['captures']} captures run, {label}",
                    f"p50 {window['p50_ms']:.2f} ms, p99 {window['p99_ms']:.2f} ms ({ratio:.1f}x); "
                    f"{window['capture_ms_each']:.0f} ms per capture, {window['verify_ms_each']:.2f} ms verifying",
                    f"p99 <= {STALL_P99_TARGET:g} x p50" if name == "now" else "",
                    ratio <= STALL_P99_TARGET if name == "now" else None,
                )
            )
    if "streams" in scenarios:
        streams = scenarios["streams"]
        rows += [
            (
                "streams",
                "calls",
                f"{streams['threads']} threads x {streams['calls'] // streams['threads']} on their own streams, "
                f"{streams['hot_layouts']} hot layouts",
                "",
                None,
            ),
            ("streams", "replays", f"{streams['replays']}", "> 0", streams["replays"] > 0),
            (
                "streams",
                "outputs unequal to eager",
                f"{streams['mismatches']} of {streams['calls']} ({streams['mismatched_hot_calls']} hot)",
                "0",
                streams["mismatches"] == 0,
            ),
            ("streams", "failed calls", f"{streams['failed_calls']}", "0", streams["failed_calls"] == 0),
            *_counter_rows("streams", streams),
        ]
    return rows


def format_table(report: dict) -> str:
    """The table printed last: one line per metric, with its target and whether it was met."""
    cells = [
        (scenario, metric, value, target, "" if met is None else "yes" if met else "NO")
        for scenario, metric, value, target, met in table_rows(report)
    ]
    defaults = report["graph_defaults"]
    lines = [
        f"rocm-vit {report['rocm_vit']} bench-memory  {report['date']}  {report['device']}  "
        f"commit {report['commit']}  torch {report['torch']}",
        f"preset {report['preset']}  {report['dtype']}  attention {report['attention_backend']}  "
        f"budget {_mib(report['budget_bytes'])}  graph defaults: capacity {defaults['capacity']}, "
        f"min hits {defaults['min_hits']}, max tokens {defaults['max_tokens']}  "
        f"sides up to {report['max_side_px']} px  seed {report['seed']}",
        *table_lines(ROW_FIELDS, cells, left=True),
    ]
    streams = report["scenarios"].get("streams", {})
    lines += [f"streams: {failure}" for failure in streams.get("failures", [])]
    if streams.get("mismatched_layouts"):
        lines.append(f"streams: outputs unequal to eager for {', '.join(streams['mismatched_layouts'])}")
    return "\n".join(lines)


def exit_status(report: dict) -> int:
    """1 when any target was missed, else 0."""
    return 1 if any(met is False for *_, met in table_rows(report)) else 0


def _refused_only_when_measured(run: dict) -> bool:
    """Every refusal is of a layout at least as large as one measured alone over the budget."""
    if run["refused_calls"] == 0:
        return True
    return (
        run["over_budget_from_tokens"] is not None and run["smallest_refused_tokens"] >= run["over_budget_from_tokens"]
    )


def _counter_rows(scenario: str, measured: dict) -> list[Row]:
    eager_runs = ", ".join(f"{reason} {count}" for reason, count in sorted(measured["eager_runs"].items()))
    return [
        (
            scenario,
            "captures / evictions / pool releases",
            f"{measured['captures']} / {measured['evictions']} / {measured['pool_releases']}",
            "",
            None,
        ),
        (scenario, "eager runs by reason", eager_runs or "none", "", None),
    ]


def _mib(size_bytes: float) -> str:
    return f"{size_bytes / _MIB:.0f} MiB"


def _plot(traces: Traces, budget_bytes: int, path: Path, title: str) -> None:
    """Bytes held per call against the budget line; the mixed stream's per-call latency, graphs vs eager."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = int(bool(traces.bytes_held)) + int(bool(traces.graph_run_ms))
    if not panels:
        logger.warning("--plot: the streams scenario has no per-call series; no plot written")
        return
    figure, axes = plt.subplots(panels, 1, figsize=(8, 4 * panels), squeeze=False)
    axes = list(axes[:, 0])
    if traces.bytes_held:
        held_axes = axes.pop(0)
        for scenario, held in traces.bytes_held.items():
            held_axes.plot([size / _MIB for size in held], label=f"{scenario}: bytes held")
        held_axes.axhline(budget_bytes / _MIB, color="red", linestyle="--", label="budget")
        held_axes.set(xlabel="call", ylabel="MiB", title="graph memory held (staging + pool), per call")
        held_axes.legend()
        held_axes.grid(True, alpha=0.3)
    if traces.graph_run_ms:
        latency_axes = axes.pop(0)
        calls = range(len(traces.graph_run_ms))
        latency_axes.scatter(calls, traces.eager_run_ms, s=4, color="grey", alpha=0.5, label="all eager")
        for replayed, label, color in (
            (True, "graphs: replayed", "tab:blue"),
            (False, "graphs: ran eagerly", "tab:orange"),
        ):
            chosen = [index for index in calls if traces.replayed[index] is replayed]
            latency_axes.scatter(
                chosen, [traces.graph_run_ms[index] for index in chosen], s=4, color=color, label=label
            )
        latency_axes.set(yscale="log", xlabel="call", ylabel="ms", title="mixed stream: latency per call")
        latency_axes.legend(markerscale=3)
        latency_axes.grid(True, which="both", alpha=0.3)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    logger.info("plot written to %s", path)
