"""``rocm-vit bench-traffic --mode tower``: the preset's real tower on this machine's GPU, each stream
all-eager and then under the serving defaults (captures on the runner's thread, contention
included), with an oracle timed on sampled calls and each call recorded by how the runner served it.
Results: docs/benchmarks.md, "`rocm-vit bench-traffic --mode tower`".
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch

from rocm_vit.cli.traffic import GridTHW, Stream, latency_summary, standard_streams
from rocm_vit.cli.workload import build_tower, progress, table_lines
from rocm_vit.graphs import EAGER_REASONS
from rocm_vit.graphs.cost import MIN_SAVING_SHARE

_ORACLE_REPEATS = 7  # eager calls and replays per layout the oracle times
_SLOWER_CALL = 1.1  # a call this much slower than its eager twin is counted in ``by_kind``
_MAX_PATCHES = 65536  # the oracle's largest graph (a 32-frame 720p clip: 57,600 patches)
# The streams timed on a real tower: all but chat at the checkpoint's limits (12 MP photos, minutes).
TOWER_STREAMS = ("chat, 1.3 MP cap", "6 x 640x360 per call", "8 x 640x360 per call", "1 x 1.3 MP per call",
                 "1 x 1080p per call", "video")  # fmt: skip


def measure_tower(
    preset_name: str,
    calls: int,
    seed: int,
    names: Sequence[str] = TOWER_STREAMS,
    oracle_calls: int = 100,
    idle_ms: float = 0.0,
) -> dict[str, Any]:
    """Each stream in ``names`` through the preset's tower, all-eager and then with the serving defaults
    (a fresh runner per stream): per-call wall ms with the caller's stream synchronized around each
    call, after one untimed eager pass that compiles every kernel variant the stream needs. Then the
    oracle on ``oracle_calls`` sampled calls (see ``_oracle_saving``). The second half of each stream
    is also given alone: the runner's steady state, most of its captures behind it. ``idle_ms``: the
    caller sleeps that long before each timed call, eager and under graphs."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    tower = build_tower(preset_name, device, dtype, None, seed=seed)
    streams = [stream for stream in standard_streams(calls, seed) if stream.name in names]
    results = []
    with torch.inference_mode():
        for stream in streams:
            _timed_calls(tower, stream.calls, seed, use_graphs=False, label=f"{stream.name}, compiles")
            eager = _timed_calls(
                tower, stream.calls, seed, use_graphs=False, label=f"{stream.name}, eager", idle_ms=idle_ms
            )
            runner = tower.enable_graphs()
            half = len(stream.calls) // 2
            served: list[tuple[str, bool]] = []
            label = f"{stream.name}, graphs"
            graphed = _timed_calls(
                tower, stream.calls[:half], seed, use_graphs=True, label=label, served=served, idle_ms=idle_ms
            )
            at_half = runner.stats()
            graphed += _timed_calls(
                tower, stream.calls[half:], seed, use_graphs=True, label=label, served=served, idle_ms=idle_ms
            )
            runner.wait_for_captures()
            stats = runner.stats()
            tower.disable_graphs()
            # The host's launch time drifts within a process: all-eager again, after the graphs.
            label = f"{stream.name}, eager again"
            eager_after = _timed_calls(tower, stream.calls, seed, use_graphs=False, label=label, idle_ms=idle_ms)
            timed_oracle = oracle_calls > 0 and device.type == "cuda"  # a CPU has no graphs to time
            possible = _oracle_saving(tower, stream, seed, oracle_calls) if timed_oracle else None
            counts = {k: stats[k] for k in ("replays", "captures")}
            results.append(
                {
                    "stream": stream.name,
                    "calls": len(stream.calls),
                    **_compared(eager, graphed, counts, possible),
                    "second_half": _compared(
                        eager[half:], graphed[half:], {k: stats[k] - at_half[k] for k in counts}, possible
                    ),
                    "eager_after": latency_summary(eager_after),
                    "possible_saving_ms": possible,
                    "launch_ms": stats["launch_ms"],
                    "eager_runs": {reason: count for reason, count in stats["eager_runs"].items() if count},
                    "pool_releases": stats["pool_releases"],
                    "evictions": stats["evictions"],
                    "bytes_held": stats["bytes_held"],
                    "by_kind": by_kind(eager, graphed, served, eager_after),
                    "second_half_by_kind": by_kind(eager[half:], graphed[half:], served[half:], eager_after[half:]),
                }
            )
    return {"mode": "tower", "preset": preset_name, "device": str(device), "idle_ms": idle_ms, "streams": results}


def _compared(eager: list[float], graphed: list[float], counts: dict[str, int], possible: float | None) -> dict:
    """Summaries of the same calls all-eager and under graphs, and the share of the oracle's saving
    realized (where that saving is over 5 % of eager: below, noise would decide the share)."""
    realized = statistics.fmean(eager) - statistics.fmean(graphed)
    worth = possible is not None and possible > MIN_SAVING_SHARE * statistics.fmean(eager)
    return {
        "calls": len(eager),
        "eager": latency_summary(eager),
        "graphs": {**latency_summary(graphed), **counts},
        "share": realized / possible if worth else None,
    }


def _oracle_saving(tower: Any, stream: Stream, seed: int, sample: int) -> float:
    """Mean ms a graph of each call's own layout, captured for free, would save on ``stream``: on
    ``sample`` calls drawn at random, the median of eager calls less the median of replays, at
    least 0 (the oracle runs eagerly where eager is faster). Eager calls and replays alternate, so
    both meet the same host (three of each were too few: on the H200 they overstated a saving by
    40 %). Each distinct layout is captured once, with no admission limit; one graph is held."""
    rng = random.Random(seed)
    grids = [stream.calls[rng.randrange(len(stream.calls))] for _ in range(sample)]
    saving: dict[tuple, float] = {}
    runner = tower.enable_graphs(capacity=1, min_hits=1, max_tokens=_MAX_PATCHES, budget_bytes=1 << 40,
                                 by_benefit=False, padded=False)  # fmt: skip
    for grid in progress(sorted(set(grids)), f"{stream.name}, oracle", "layout"):
        _timed_calls(tower, (grid,), seed, use_graphs=True)  # the capture
        replays_before = runner.stats()["replays"]
        eager, replays = [], []
        for _ in range(_ORACLE_REPEATS):
            eager += _timed_calls(tower, (grid,), seed, use_graphs=False)
            replays += _timed_calls(tower, (grid,), seed, use_graphs=True)
        if runner.stats()["replays"] != replays_before + _ORACLE_REPEATS:
            raise RuntimeError(f"bench-traffic: the oracle's graph of {grid} did not replay")
        saving[grid] = max(0.0, statistics.median(eager) - statistics.median(replays))
    tower.disable_graphs()
    return statistics.fmean(saving[grid] for grid in grids)


def _timed_calls(
    tower: Any,
    grids: Sequence[tuple[GridTHW, ...]],
    seed: int,
    use_graphs: bool,
    label: str | None = None,
    served: list[tuple[str, bool]] | None = None,
    idle_ms: float = 0.0,
) -> list[float]:
    """Wall ms of a tower call on each of ``grids``, its pixels made (and the device idle) before the
    clock starts; a progress bar where ``label`` is given. ``served`` gets, per call, how the tower's
    runner served it and whether a deferred capture was pending or under way meanwhile
    (``served_as``), read without the runner's lock, so the record leaves captures to contend.
    ``idle_ms``: a sleep before each call, outside the clock (host time a deferred capture may take)."""
    config, device = tower.config, tower.device
    width = config.in_channels * config.temporal_patch_size * config.patch_size**2
    generator = torch.Generator(device=device).manual_seed(seed)
    times = []
    for grid in progress(list(grids), label, "call") if label else grids:
        patches = sum(t * h * w for t, h, w in grid)
        pixels = torch.randn(patches, width, generator=generator, device=device, dtype=tower.dtype)
        # The caller's stream, as a server waits for its own work: a device-wide synchronize while the
        # runner's thread captures would fail (and break that capture).
        _synchronize_stream(device)
        if idle_ms:
            time.sleep(idle_ms / 1e3)
        before = tower.graph_runner.counters() if served is not None else None
        started = time.perf_counter()
        tower(pixels, list(grid), use_graphs=use_graphs)
        _synchronize_stream(device)
        times.append((time.perf_counter() - started) * 1e3)
        if before is not None:
            served.append(served_as(before, tower.graph_runner.counters()))
    return times


def served_as(before: dict[str, int], after: dict[str, int]) -> tuple[str, bool]:
    """How one call was served, from the runner's ``counters`` around it: ``replay`` or its eager
    reason, prefixed ``padded`` where it ran padded; and whether a capture other than the one this
    call handed over was pending or under way meanwhile."""
    changed = [name for name in ("replays", *EAGER_REASONS) if after[name] > before[name]]
    kind = "replay" if changed == ["replays"] else (changed or ["unknown"])[0]
    if after["padded"] > before["padded"]:
        kind = f"padded {kind}"
    own_marks = int(kind.endswith("capture_deferred"))  # its hand-over begins a capture
    beside = before["capture_marks"] % 2 == 1 or after["capture_marks"] - before["capture_marks"] > own_marks
    return kind, beside


def by_kind(
    eager: Sequence[float],
    graphed: Sequence[float],
    served: Sequence[tuple[str, bool]],
    eager_after: Sequence[float],
) -> list[dict]:
    """Calls grouped by how they were served and whether beside a capture: how many, their mean ms
    under graphs and all-eager (before the graphs and after), and how many were over 10 % slower
    than eager before, with the ms over."""
    groups: dict[tuple[str, bool], list[tuple[float, float, float]]] = {}
    for eager_ms, graph_ms, how, after_ms in zip(eager, graphed, served, eager_after, strict=True):
        groups.setdefault(how, []).append((eager_ms, graph_ms, after_ms))
    rows = []
    for (kind, beside), calls in sorted(groups.items(), key=lambda item: -len(item[1])):
        slower = [graph_ms - eager_ms for eager_ms, graph_ms, _ in calls if graph_ms > _SLOWER_CALL * eager_ms]
        rows.append(
            {
                "kind": kind,
                "beside_capture": beside,
                "calls": len(calls),
                "eager_mean_ms": statistics.fmean(eager_ms for eager_ms, _, _ in calls),
                "graphs_mean_ms": statistics.fmean(graph_ms for _, graph_ms, _ in calls),
                "eager_after_mean_ms": statistics.fmean(after_ms for _, _, after_ms in calls),
                "slower_calls": len(slower),
                "slower_excess_ms": sum(slower),
            }
        )
    return rows


def _synchronize_stream(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def format_tower_table(report: dict[str, Any]) -> list[str]:
    header = ["stream", "calls", "replays", "captures", "eager mean / p90", "graphs mean / p90", "ratio mean / p90",
              "oracle saves", "share"]  # fmt: skip
    cells = []
    for stream in report["streams"]:
        possible, half = stream["possible_saving_ms"], stream["second_half"]
        for name, compared in ((stream["stream"], stream), (f"  its last {half['calls']}", half)):
            eager, graphs, share = compared["eager"], compared["graphs"], compared["share"]
            cells.append(
                [
                    name,
                    str(compared["calls"]),
                    str(graphs["replays"]),
                    str(graphs["captures"]),
                    f"{eager['mean_ms']:.2f} / {eager['p90_ms']:.2f}",
                    f"{graphs['mean_ms']:.2f} / {graphs['p90_ms']:.2f}",
                    f"{graphs['mean_ms'] / eager['mean_ms']:.3f}x / {graphs['p90_ms'] / eager['p90_ms']:.3f}x",
                    "-" if possible is None else f"{possible:.2f} ms",
                    "-" if share is None else f"{share:.0%}",
                ]
            )
    drift = []
    for stream in report["streams"]:
        before, after = stream["eager"], stream["eager_after"]
        drift.append(
            f"{stream['stream']}: all-eager again after the graphs {after['mean_ms']:.2f} / {after['p90_ms']:.2f} ms "
            f"({after['mean_ms'] / before['mean_ms'] - 1:+.1%} on the mean: the host's drift)"
        )
    kinds = []
    for stream in report["streams"]:
        for row in stream["second_half_by_kind"]:
            kinds.append(
                [
                    stream["stream"],
                    row["kind"] + (", beside a capture" if row["beside_capture"] else ""),
                    str(row["calls"]),
                    f"{row['eager_mean_ms']:.2f}",
                    f"{row['graphs_mean_ms']:.2f}",
                    f"{row['slower_calls']} (+{row['slower_excess_ms']:.0f} ms)",
                ]
            )
    kinds_header = ["stream", "second half: served as", "calls", "eager mean", "graphs mean", "over 10 % slower"]
    idle = f", {report['idle_ms']:g} ms idle between calls" if report.get("idle_ms") else ""
    title = f"rocm-vit bench-traffic --mode tower: {report['preset']} on {report['device']}{idle} (measured)"
    notes = ["", "oracle saves: mean ms a graph of each call's own layout would save (sampled calls); share: of that,",
             "what the defaults realized on the mean (shown where the oracle saves over 5 % of eager);",
             "its last N: the stream's second half, the runner's steady state"]  # fmt: skip
    return [title, "", *table_lines(header, cells), *notes, "", *drift, "", *table_lines(kinds_header, kinds)]
