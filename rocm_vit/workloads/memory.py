"""The serving scenarios ``rocm-vit bench-memory`` measures on a GPU: streams of calls through a
tower's graph runner, and what its memory and outputs did (docs/benchmarks.md, "`rocm-vit bench-memory`").
"""

from __future__ import annotations

import gc
import statistics
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import torch

from rocm_vit.graphs import CudaGraphs
from rocm_vit.graphs.torch_graphs import GraphMechanism
from rocm_vit.models import VisionTower
from rocm_vit.workloads.workload import (
    Workload,
    build_tower,
    churn_stream,
    mixed_stream,
    progress,
    revisiting_workloads,
)

HOLDERS = ("graph pools", "runner's stream (staging)", "default stream (eager calls)", "other streams (side)")
# random: reserved memory is measured against its level after this share of the calls.
WARM_UP_SHARE = 0.1
CHURN_DEPTH = 4
CHURN_CAPACITY = 16
CHURN_MAX_TOKENS = 65536
CHURN_AMPLE_BUDGET_BYTES = 64 << 30
CAPTURE_STALL_LAYOUTS = 24
LOOP_MATMULS = 4
LOOP_SIDE = 4096
STREAM_THREADS = 4
CALLS_PER_THREAD = 50
STREAM_HOT_LAYOUTS = 4


@dataclass
class Traces:
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


def mixed(tower: VisionTower, budget_bytes: int, calls: int, max_side_px: int, seed: int, traces: Traces) -> dict:
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


def random_layouts(
    tower: VisionTower, budget_bytes: int, calls: int, max_side_px: int, seed: int, traces: Traces
) -> dict:
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
    release_graphs(tower)
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


def streams(tower: VisionTower, budget_bytes: int, max_side_px: int, seed: int) -> dict:
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


def churn(preset_name: str, default_budget: int, calls: int, seed: int) -> dict:
    """Random layouts through a shallow tower, each captured at its first call, with an ample budget
    and the default; every output compared with its eager run bit for bit."""
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
        release_graphs(tower)
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
    """Another thread's stream kept busy (allocate, multiply, wait), each iteration's time recorded."""

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


def capture_stall(tower: VisionTower, seed: int) -> dict:
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
                release_graphs(tower)
    finally:
        sys.setswitchinterval(switch_interval)
    return {"layouts": len(layouts), "loop": f"{LOOP_MATMULS} x {LOOP_SIDE}^2 bf16 matmuls", **results}


# Measuring --------------------------------------------------------------------------------------


def _reserved_by_holder(runner: object) -> dict[str, int]:
    """Reserved bytes by holder: private pools, the runner's stream, the default stream, other streams."""
    held: Counter[str] = Counter({name: 0 for name in HOLDERS})
    default_stream = torch.cuda.default_stream().cuda_stream
    store = getattr(runner, "_store", None)  # the runner's graphs and staging, and the stream they were made on
    runner_stream = getattr(getattr(store, "stream", None), "cuda_stream", None)
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
    """One random device buffer; call ``index`` reads rows from ``index`` on, so every call gets other
    pixels (a replay reading stale staging shows as a mismatch) and nothing is copied while timed."""

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
        torch.cuda.current_stream().synchronize()  # the call's own work, as a server waits for it
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


def release_graphs(tower: VisionTower) -> None:
    """Drop the runner, its graphs and pool, so the next scenario starts from an empty cache."""
    tower.disable_graphs()
    _settled_reserved()
