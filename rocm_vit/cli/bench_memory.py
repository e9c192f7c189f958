"""``rocm-vit bench-memory``: the graph runner's defaults (and ``--budget-mib``) under serving streams.

Scenarios (``SCENARIOS``), each with its targets:

- ``mixed``: 80 % of the calls to 20 hot small layouts, through graphs then all-eager: hit rate, bytes held;
- ``random``: random layouts, half revisited: bytes held, reserved-memory growth after the warm-up share;
- ``streams``: threads on their own streams replay shared graphs: every output equal to eager;
- ``churn``: #27's stream, every layout captured at first sight: refusals, outputs equal to eager;
- ``capture-stall``: another thread's stream while layouts are captured: its p99 against its p50.

Exit status 1 when a target is missed, 2 without a GPU. Figures: docs/benchmarks.md, "`rocm-vit bench-memory`".
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import logging
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch

from rocm_vit.graphs import (
    DEFAULT_CAPACITY,
    DEFAULT_MAX_TOKENS,
    DEFAULT_MIN_HITS,
    CudaGraphs,
    default_budget_bytes,
)
from rocm_vit.graphs.capture import GraphMechanism
from rocm_vit.models import VisionTower, preset_names
from rocm_vit.platform import platform_info
from rocm_vit.version import build_info
from rocm_vit.workloads.workload import (
    DEFAULT_ONE_OFF_MAX_SIDE_PX,
    Workload,
    build_tower,
    churn_stream,
    mixed_stream,
    progress,
    revisiting_workloads,
    table_lines,
)

logger = logging.getLogger(__name__)

SCENARIOS = ("mixed", "random", "streams", "churn", "capture-stall")
# Who holds reserved memory (``_reserved_by_holder``).
HOLDERS = ("graph pools", "runner's stream (staging)", "default stream (eager calls)", "other streams (side)")
HIT_RATE_TARGET = 0.75
# random: reserved memory may grow past its level after this share of the calls by at most this much.
WARM_UP_SHARE = 0.1
RESERVED_GROWTH_TARGET_BYTES = 256 << 20
# churn: #27's stream through a CHURN_DEPTH-block tower, every layout captured at its first call.
CHURN_DEPTH = 4
CHURN_CAPACITY = 16
CHURN_MAX_TOKENS = 65536
CHURN_AMPLE_BUDGET_BYTES = 64 << 30
# capture-stall: another thread's matmul loop; its p99 within STALL_P99_TARGET times its p50.
CAPTURE_STALL_LAYOUTS = 24
LOOP_MATMULS = 4
LOOP_SIDE = 4096
STALL_P99_TARGET = 2.0
STREAM_THREADS = 4
CALLS_PER_THREAD = 50
STREAM_HOT_LAYOUTS = 4
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
    traces = _Traces()
    with torch.inference_mode():
        if "mixed" in chosen:
            scenarios["mixed"] = _mixed(tower, budget_bytes, args.calls, args.max_side, args.seed, traces)
            _release_graphs(tower)
        if "random" in chosen:
            scenarios["random"] = _random(tower, budget_bytes, args.random_calls, args.max_side, args.seed, traces)
            _release_graphs(tower)
        if "streams" in chosen:
            scenarios["streams"] = _streams(tower, budget_bytes, args.max_side, args.seed)
            _release_graphs(tower)
        if "churn" in chosen:
            scenarios["churn"] = _churn(args.preset, budget_bytes, args.churn_calls, args.seed)
        if "capture-stall" in chosen:
            scenarios["capture-stall"] = _capture_stall(tower, args.seed)
            _release_graphs(tower)
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


# Scenarios --------------------------------------------------------------------------------------


@dataclass
class _Traces:
    """Per-call series for ``--plot``, kept out of the JSON: bytes held by scenario, mixed latencies."""

    bytes_held: dict[str, list[int]] = field(default_factory=dict)
    graph_run_ms: list[float] = field(default_factory=list)
    eager_run_ms: list[float] = field(default_factory=list)
    replayed: list[bool] = field(default_factory=list)


@dataclass
class _TimedRun:
    call_ms: list[float]
    replayed: list[bool]  # empty for an all-eager run
    bytes_held: list[int]
    total_s: float
    peak_reserved_growth_bytes: int

    def summary(self) -> dict:
        return {
            "mean_ms": statistics.fmean(self.call_ms),
            "median_ms": statistics.median(self.call_ms),
            "total_s": self.total_s,
            "peak_reserved_growth_bytes": self.peak_reserved_growth_bytes,
        }


def _mixed(tower: VisionTower, budget_bytes: int, calls: int, max_side_px: int, seed: int, traces: _Traces) -> dict:
    """The mixed stream through graphs, then the same calls all-eager for the latency baseline."""
    stream = mixed_stream(calls, seed, tower.config, max_side_px=max_side_px)
    pixels = _PixelRows(stream, tower, seed)
    hot_layouts = [workload for workload, count in Counter(stream).items() if count > 1]
    # Outside both timed runs: kernels compile (Triton, fa4) on the shapes the runs share.
    for workload in [*hot_layouts, max(stream, key=lambda workload: workload.patches)]:
        _call(tower, pixels, 0, workload, use_graphs=False)
    runner = tower.enable_graphs(budget_bytes=budget_bytes)
    graph_run = _timed_run(tower, stream, pixels, use_graphs=True, desc="mixed, graphs")
    stats = runner.stats()
    eager_run = _timed_run(tower, stream, pixels, use_graphs=False, desc="mixed, all eager")
    traces.bytes_held["mixed"] = graph_run.bytes_held
    traces.graph_run_ms, traces.eager_run_ms, traces.replayed = graph_run.call_ms, eager_run.call_ms, graph_run.replayed
    hot_set = set(hot_layouts)
    hot_calls = sum(workload in hot_set for workload in stream)
    return {
        "calls": calls,
        "hot_layouts": len(hot_layouts),
        "hot_calls": hot_calls,
        "one_off_calls": calls - hot_calls,
        "replays": stats["replays"],
        "hit_rate": stats["replays"] / calls,
        "max_bytes_held": max(graph_run.bytes_held),
        "final_bytes_held": graph_run.bytes_held[-1],
        **_runner_counters(stats),
        "graph_run": graph_run.summary(),
        "eager_run": eager_run.summary(),
    }


def _random(tower: VisionTower, budget_bytes: int, calls: int, max_side_px: int, seed: int, traces: _Traces) -> dict:
    """Random layouts, half of them repeats: bytes held after every call, reserved growth after warm-up."""
    stream = revisiting_workloads(calls, seed, tower.config, max_side_px)
    pixels = _PixelRows(stream, tower, seed)
    # The allocator caches the eager high-water mark before anything is measured, so what reserved
    # memory gains after warm-up is what graphs add (or leak), not a larger eager call.
    _call(tower, pixels, 0, max(stream, key=lambda workload: workload.patches), use_graphs=False)
    runner = tower.enable_graphs(budget_bytes=budget_bytes)
    warm_up_calls = max(1, round(calls * WARM_UP_SHARE))
    bytes_held = []
    reserved_after_warm_up = 0
    holders_after_warm_up: dict[str, int] = {}
    peak_sample: tuple[int, dict[str, int]] = (0, {})
    for index, workload in enumerate(progress(stream, "random", "call")):
        _call(tower, pixels, index, workload, use_graphs=True)
        bytes_held.append(runner.stats()["bytes_held"])
        if index + 1 == warm_up_calls:
            torch.cuda.synchronize()
            reserved_after_warm_up = torch.cuda.memory_reserved()
            holders_after_warm_up = _reserved_by_holder(runner)
            torch.cuda.reset_peak_memory_stats()
        if index + 1 > warm_up_calls and torch.cuda.memory_reserved() > peak_sample[0]:
            peak_sample = (torch.cuda.memory_reserved(), _reserved_by_holder(runner))
    torch.cuda.synchronize()
    stats = runner.stats()
    traces.bytes_held["random"] = bytes_held
    peak_growth = torch.cuda.max_memory_reserved() - reserved_after_warm_up
    end_growth = torch.cuda.memory_reserved() - reserved_after_warm_up
    _release_graphs(tower)
    return {
        "calls": calls,
        "distinct_layouts": len(set(stream)),
        "warm_up_calls": warm_up_calls,
        "replays": stats["replays"],
        "hit_rate": stats["replays"] / calls,
        "max_bytes_held": max(bytes_held),
        "calls_over_budget": sum(held > budget_bytes for held in bytes_held),
        **_runner_counters(stats),
        "reserved_after_warm_up_bytes": reserved_after_warm_up,
        "reserved_growth_after_warm_up_bytes": end_growth,
        "peak_reserved_growth_after_warm_up_bytes": peak_growth,
        "reserved_after_warm_up_by_holder": holders_after_warm_up,
        "reserved_at_the_largest_sample": {"bytes": peak_sample[0], "by_holder": peak_sample[1]},
        "all_eager_peak_reserved_growth_after_warm_up_bytes": _eager_growth(tower, stream, pixels, warm_up_calls),
    }


def _eager_growth(tower: VisionTower, stream: list[Workload], pixels: _PixelRows, warm_up_calls: int) -> int:
    """The same stream all-eager from an empty cache: how far the eager calls' own cache grows after
    warm-up, which no graph setting can change (the allocator's fragmentation over random sizes)."""
    _call(tower, pixels, 0, max(stream, key=lambda workload: workload.patches), use_graphs=False)
    reserved_after_warm_up = 0
    for index, workload in enumerate(progress(stream, "random, all-eager", "call")):
        _call(tower, pixels, index, workload, use_graphs=False)
        if index + 1 == warm_up_calls:
            torch.cuda.synchronize()
            reserved_after_warm_up = torch.cuda.memory_reserved()
            torch.cuda.reset_peak_memory_stats()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_reserved() - reserved_after_warm_up


def _streams(tower: VisionTower, budget_bytes: int, max_side_px: int, seed: int) -> dict:
    """Four threads on four streams share the runner; each output against an eager reference, bitwise."""
    calls = mixed_stream(
        STREAM_THREADS * CALLS_PER_THREAD, seed, tower.config, hot=STREAM_HOT_LAYOUTS, max_side_px=max_side_px
    )
    pixels = _PixelRows(calls, tower, seed)
    references = [_call(tower, pixels, index, workload, use_graphs=False) for index, workload in enumerate(calls)]
    torch.cuda.synchronize()
    runner = tower.enable_graphs(budget_bytes=budget_bytes)
    outputs: list[torch.Tensor | None] = [None] * len(calls)
    failures: list[str] = []
    start_together = threading.Barrier(STREAM_THREADS)

    def serve(thread_index: int) -> None:
        start_together.wait()
        try:
            # Each thread's own stream: the runner must order its shared staging and pool against all of them.
            stream = torch.cuda.Stream(tower.device)
            with torch.inference_mode(), torch.cuda.stream(stream):
                for index in range(thread_index, len(calls), STREAM_THREADS):
                    outputs[index] = _call(tower, pixels, index, calls[index], use_graphs=True)
            stream.synchronize()
        except Exception as error:  # reported as failed calls, not raised from a thread
            failures.append(f"thread {thread_index}: {type(error).__name__}: {error}")

    threads = [threading.Thread(target=serve, args=(index,)) for index in range(STREAM_THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    torch.cuda.synchronize()  # also the streams of threads that failed midway
    hot_layouts = {workload for workload, count in Counter(calls).items() if count > 1}
    mismatched = [
        index
        for index, (output, reference) in enumerate(zip(outputs, references, strict=True))
        if output is not None and not torch.equal(output, reference)
    ]
    stats = runner.stats()
    return {
        "threads": STREAM_THREADS,
        "calls": len(calls),
        "hot_layouts": len(hot_layouts),
        "replays": stats["replays"],
        **_runner_counters(stats),
        "mismatches": len(mismatched),
        "mismatched_hot_calls": sum(calls[index] in hot_layouts for index in mismatched),
        "mismatched_layouts": sorted({calls[index].spec for index in mismatched}),
        "failed_calls": sum(output is None for output in outputs),
        "failures": failures,
    }


def _churn(preset_name: str, default_budget: int, calls: int, seed: int) -> dict:
    """#27's stream: random layouts through a shallow tower of the preset's widths, every layout
    captured at its first call; once with an ample budget, once with the default. Every output is
    compared with the eager run of the same call, bit for bit."""
    tower = build_tower(preset_name, torch.device("cuda"), torch.bfloat16, None, seed, depth=CHURN_DEPTH)
    stream = churn_stream(calls, seed, tower.config)
    pixels = _PixelRows(stream, tower, seed)
    runs = {}
    for name, budget in (("ample", CHURN_AMPLE_BUDGET_BYTES), ("default", default_budget)):
        runner = tower.enable_graphs(
            capacity=CHURN_CAPACITY, min_hits=1, max_tokens=CHURN_MAX_TOKENS, budget_bytes=budget, by_benefit=False
        )
        mismatches, max_held, refused = 0, 0, []
        for index, workload in enumerate(progress(stream, f"churn, {name} budget", "call")):
            refused_before = runner.stats()["eager_runs"]["over_budget"]
            output = _call(tower, pixels, index, workload, use_graphs=True)
            stats = runner.stats()
            max_held = max(max_held, stats["bytes_held"])
            if stats["eager_runs"]["over_budget"] > refused_before:
                refused.append(workload.patches)
            mismatches += not torch.equal(output, _call(tower, pixels, index, workload, use_graphs=False))
        stats = runner.stats()
        runs[name] = {
            "budget_bytes": budget,
            "max_bytes_held": max_held,
            "mismatches": mismatches,
            "refused_calls": len(refused),
            "smallest_refused_tokens": min(refused, default=None),
            "over_budget_from_tokens": stats["over_budget_from_tokens"],
            "replays": stats["replays"],
            "capture_seconds": stats["capture_seconds"],
            "verify_seconds": stats["verify_seconds"],
            "pool_growth_prediction": stats["pool_growth_prediction"],
            **_runner_counters(stats),
        }
        _release_graphs(tower)
    return {
        "depth": CHURN_DEPTH,
        "calls": calls,
        "distinct_layouts": len(set(stream)),
        "largest_tokens": max(workload.patches for workload in stream),
        "runs": runs,
    }


class _SyncingGraphs(CudaGraphs):
    """Captures through ``torch.cuda.graph``, which synchronizes the device and empties the allocator's
    cache on entry: how rocm-vit captured before, kept to measure what that costs others."""

    def capture(self, fn, pool, stream):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode=self.capture_error_mode):
            output = fn()
        return graph, output


class _SteadyLoop:
    """Another thread's stream kept busy: each iteration allocates and multiplies, then waits for its
    stream; the host time of every iteration is recorded with when it ended."""

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._stop = threading.Event()
        self.iterations: list[tuple[float, float]] = []  # (end, milliseconds)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _SteadyLoop:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        stream = torch.cuda.Stream(self._device)
        with torch.inference_mode(), torch.cuda.stream(stream):
            a = torch.randn(LOOP_SIDE, LOOP_SIDE, device=self._device, dtype=torch.bfloat16)
            while not self._stop.is_set():
                started = time.perf_counter()
                for _ in range(LOOP_MATMULS):
                    a = torch.mm(a, a).div_(LOOP_SIDE**0.5)  # a fresh output each time, through the allocator
                stream.synchronize()
                ended = time.perf_counter()
                self.iterations.append((ended, (ended - started) * 1e3))

    def percentiles(self, since: float, until: float) -> dict[str, float]:
        window = sorted(ms for ended, ms in self.iterations if since <= ended <= until)
        if not window:
            return {"iterations": 0, "p50_ms": 0.0, "p99_ms": 0.0}
        return {
            "iterations": len(window),
            "p50_ms": window[len(window) // 2],
            "p99_ms": window[min(len(window) - 1, round(0.99 * (len(window) - 1)))],
        }


def _capture_stall(tower: VisionTower, seed: int) -> dict:
    """How long captures hold up another thread's stream: its loop alone, then while this thread
    captures new layouts, with torch.cuda.graph (before) and with the runner's own capture (now)."""
    layouts = [
        Workload(f"1x{side}", ((1, side // tower.config.patch_size, side // tower.config.patch_size),))
        for side in range(64, 64 + 32 * CAPTURE_STALL_LAYOUTS, 32)
    ]
    pixels = _PixelRows(layouts, tower, seed)
    # The switch interval bounds how long the loop's thread waits for the GIL behind this one's
    # Python: what is measured is the device and the allocator, not the interpreter.
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(0.0002)
    results = {}
    try:
        with _SteadyLoop(tower.device) as loop:
            time.sleep(1.0)
            results["alone"] = loop.percentiles(time.perf_counter() - 0.8, time.perf_counter())
            mechanisms: list[tuple[str, GraphMechanism]] = [("before", _SyncingGraphs()), ("now", CudaGraphs())]
            for name, mechanism in mechanisms:
                runner = tower.enable_graphs(capacity=len(layouts), min_hits=1, mechanism=mechanism, by_benefit=False)
                started = time.perf_counter()
                for index, workload in enumerate(layouts):
                    _call(tower, pixels, index, workload, use_graphs=True)
                torch.cuda.synchronize()
                window = loop.percentiles(started, time.perf_counter())
                stats = runner.stats()
                results[name] = {
                    **window,
                    "captures": stats["captures"],
                    "seconds": time.perf_counter() - started,
                    "capture_ms_each": 1e3 * stats["capture_seconds"] / max(1, stats["captures"]),
                    "verify_ms_each": 1e3 * stats["verify_seconds"] / max(1, stats["captures"]),
                }
                _release_graphs(tower)
    finally:
        sys.setswitchinterval(switch_interval)
    return {"layouts": len(layouts), "loop": f"{LOOP_MATMULS} x {LOOP_SIDE}^2 bf16 matmuls", **results}


# Measuring --------------------------------------------------------------------------------------


def _reserved_by_holder(runner: object) -> dict[str, int]:
    """Reserved bytes by holder: private pools (the graphs' and their warm-ups'), the runner's stream
    (its staging), the default stream (this command's eager calls), other streams (a tower's side
    stream)."""
    held: Counter[str] = Counter({name: 0 for name in HOLDERS})
    default_stream = torch.cuda.default_stream().cuda_stream
    runner_stream = getattr(getattr(runner, "_stream", None), "cuda_stream", None)
    for segment in torch.cuda.memory_snapshot():
        if tuple(segment.get("segment_pool_id", (0, 0))) != (0, 0):
            held[HOLDERS[0]] += segment["total_size"]
        elif segment.get("stream") == runner_stream:
            held[HOLDERS[1]] += segment["total_size"]
        elif segment.get("stream") == default_stream:
            held[HOLDERS[2]] += segment["total_size"]
        else:
            held[HOLDERS[3]] += segment["total_size"]
    return dict(held)


class _PixelRows:
    """One random buffer on the device; call ``index`` reads its rows from ``index`` on.

    Every call gets other pixels (a replay reading another call's staging shows up as a mismatch),
    and nothing is allocated or copied from the host while calls are timed.
    """

    def __init__(self, workloads: list[Workload], tower: VisionTower, seed: int) -> None:
        config = tower.config
        width = config.in_channels * config.temporal_patch_size * config.patch_size**2
        rows = max(workload.patches for workload in workloads) + len(workloads)
        generator = torch.Generator(device=tower.device).manual_seed(seed)
        self.rows = torch.randn(rows, width, generator=generator, device=tower.device, dtype=tower.dtype)

    def for_call(self, index: int, workload: Workload) -> torch.Tensor:
        return self.rows[index : index + workload.patches]


def _call(tower: VisionTower, pixels: _PixelRows, index: int, workload: Workload, use_graphs: bool) -> torch.Tensor:
    return tower(pixels.for_call(index, workload), list(workload.grid_thw), use_graphs=use_graphs)


def _timed_run(
    tower: VisionTower, stream: list[Workload], pixels: _PixelRows, use_graphs: bool, desc: str
) -> _TimedRun:
    """Each call timed alone (device synchronised before and after); with graphs, what it replayed and held."""
    runner = tower.graph_runner
    baseline = _settled_reserved()
    torch.cuda.reset_peak_memory_stats()
    call_ms: list[float] = []
    replayed: list[bool] = []
    bytes_held: list[int] = []
    started = time.perf_counter()
    for index, workload in enumerate(progress(stream, desc, "call")):
        replays_before = runner.stats()["replays"] if use_graphs else 0
        torch.cuda.synchronize()
        call_started = time.perf_counter()
        _call(tower, pixels, index, workload, use_graphs)
        torch.cuda.current_stream().synchronize()  # not the device: a capture may run
        call_ms.append((time.perf_counter() - call_started) * 1e3)
        if use_graphs:
            stats = runner.stats()
            replayed.append(stats["replays"] > replays_before)
            bytes_held.append(stats["bytes_held"])
    total_s = time.perf_counter() - started
    return _TimedRun(call_ms, replayed, bytes_held, total_s, torch.cuda.max_memory_reserved() - baseline)


def _runner_counters(stats: dict) -> dict:
    return {
        "captures": stats["captures"],
        "evictions": stats["evictions"],
        "pool_releases": stats["pool_releases"],
        "graphs_held": stats["graphs"],
        "eager_runs": {reason: count for reason, count in stats["eager_runs"].items() if count},
    }


def _settled_reserved() -> int:
    """Reserved bytes once freed cache is handed back: what the next run's growth is measured from."""
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.memory_reserved()


def _release_graphs(tower: VisionTower) -> None:
    """Drop the runner, its graphs and pool, so the next scenario starts from an empty cache."""
    tower.disable_graphs()
    _settled_reserved()


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


def _plot(traces: _Traces, budget_bytes: int, path: Path, title: str) -> None:
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
