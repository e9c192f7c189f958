"""``rocm-vit bench-traffic --mode tower``: the real tower, each call of a stream timed all-eager and
under the serving defaults back to back, so the host's drift cancels; a capturing call's wall time
holds its whole capture. Results: docs/benchmarks.md, "`rocm-vit bench-traffic --mode tower`".
"""

from __future__ import annotations

import functools
import random
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import torch

from rocm_vit.graphs import EAGER_REASONS
from rocm_vit.graphs.cost import MIN_SAVING_SHARE, capturable
from rocm_vit.workloads.traffic import (
    GridTHW,
    latency_summary,
    oracle_by_sighting,
    sighting_lines,
    standard_streams,
)
from rocm_vit.workloads.workload import build_tower, progress, segment_lengths, table_lines

_ORACLE_REPEATS = 7  # replays per layout the oracle times
_SLOWER_CALL = 1.1  # a call this much slower than its eager twin is counted in ``by_kind``
_MAX_PATCHES = 65536  # the oracle's largest graph (a 32-frame 720p clip: 57,600 patches)
_T = TypeVar("_T")
# The streams timed on a real tower: all but chat at the checkpoint's limits (12 MP photos, minutes).
TOWER_STREAMS = ("chat, 1.3 MP cap", "6 x 640x360 per call", "8 x 640x360 per call", "1 x 1.3 MP per call",
                 "1 x 1080p per call", "video")  # fmt: skip


def measure_tower(
    preset_name: str,
    calls: int,
    seed: int,
    names: Sequence[str] = TOWER_STREAMS,
    oracle_calls: int = 100,
    buckets_first: bool = False,
) -> dict[str, Any]:
    """Each stream, every call timed all-eager on a twin tower and under the serving defaults in
    alternating order, so both meet the same host (its launch time drifted up to 23 % within a
    process, more than the margins compared); then the oracle on ``oracle_calls`` sampled calls. The
    second half is also given alone: the steady state. ``buckets_first``: padded buckets captured
    before the stream, as a server does at start."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    tower = build_tower(preset_name, device, dtype, None, seed=seed)
    twin = build_tower(preset_name, device, dtype, None, seed=seed)
    streams = [stream for stream in standard_streams(calls, seed) if stream.name in names]
    results = []
    with torch.inference_mode():
        for stream in streams:
            for grid, pixels in _calls(tower, progress(list(stream.calls), f"{stream.name}, compiles", "call"), seed):
                _timed(tower, pixels, grid)
            runner = tower.enable_graphs()
            captured_first = tower.capture_padded_buckets() if buckets_first else 0
            first = runner.stats()
            half = len(stream.calls) // 2
            timed = _paired_calls(tower, twin, stream.calls, seed, f"{stream.name}, paired")
            at_half, stats = _since(first, timed.stats_at_half), _since(first, runner.stats())
            tower.disable_graphs()
            eager, graphed, kinds = timed.eager, timed.graphs, timed.served
            oracle, pairing_ms = _oracle_savings(tower, twin, stream.calls, timed.eager, oracle_calls, seed)
            possible = _mean_saving(oracle)
            counts = {k: stats[k] for k in ("replays", "captures")}
            results.append(
                {
                    "stream": stream.name,
                    "calls": len(stream.calls),
                    "captured_first": captured_first,
                    **_compared(eager, graphed, counts, possible),
                    "second_half": _compared(
                        eager[half:],
                        graphed[half:],
                        {k: stats[k] - at_half[k] for k in counts},
                        _mean_saving(oracle[half:]),
                    ),
                    # The oracle's replays timed back to back less those timed paired with a twin's call.
                    "oracle_back_to_back_less_paired_ms": pairing_ms,
                    # Inside the calls that captured: capturing (the pool measured too) and
                    # checking first replays (their device time too).
                    "runner_capture_ms": 1e3 * stats["capture_seconds"],
                    "runner_verify_ms": 1e3 * stats["verify_seconds"],
                    "launch_ms": stats["launch_ms"],
                    # The eager runs the learned launch time is the median of (host, model device, taught).
                    "launch_samples": [
                        {name: None if ms is None else round(ms, 3) for name, ms in asdict(sample).items()}
                        for sample in runner.launch_samples()
                    ],
                    "eager_runs": {reason: count for reason, count in stats["eager_runs"].items() if count},
                    "pool_releases": stats["pool_releases"],
                    "evictions": stats["evictions"],
                    "bytes_held": stats["bytes_held"],
                    "oracle_by_sighting": oracle_by_sighting(stream.calls, oracle, stats["max_tokens"]),
                    "oracle_under_margin": oracle_under_margin(stream.calls, eager, oracle),
                    "by_kind": by_kind(eager, graphed, kinds, oracle),
                    "second_half_by_kind": by_kind(eager[half:], graphed[half:], kinds[half:], oracle[half:]),
                    "per_call": per_call(stream.calls, eager, graphed, kinds, oracle),
                }
            )
    return {"mode": "tower", "preset": preset_name, "device": str(device), "buckets_first": buckets_first,
            "streams": results}  # fmt: skip


def _since(first: dict[str, Any], last: dict[str, Any]) -> dict[str, Any]:
    """The runner's ``stats()`` counted from ``first`` on."""
    since = dict(last)
    for name in ("replays", "captures", "capture_seconds", "verify_seconds", "pool_releases", "evictions"):
        since[name] = last[name] - first[name]
    since["eager_runs"] = {reason: runs - first["eager_runs"][reason] for reason, runs in last["eager_runs"].items()}
    return since


def _oracle_savings(
    tower: Any, twin: Any, grids: Sequence[tuple[GridTHW, ...]], eager: Sequence[float], oracle_calls: int, seed: int
) -> tuple[list[list[float]], float | None]:
    """Per call, the oracle's saving each time it was sampled (paired eager ms less its own graph's
    paired replay, at least 0), and what pairing the replays changes. None on a CPU."""
    savings: list[list[float]] = [[] for _ in grids]
    if oracle_calls <= 0 or tower.device.type != "cuda":
        return savings, None
    sampled = random.Random(seed).choices(range(len(grids)), k=oracle_calls)
    replays = _oracle_replay_ms(tower, twin, [grids[index] for index in sampled], seed)
    for index in sampled:
        savings[index].append(max(0.0, eager[index] - replays[grids[index]].paired_ms))
    pairing_ms = statistics.fmean(replay.back_to_back_ms - replay.paired_ms for replay in replays.values())
    return savings, pairing_ms


def _mean_saving(oracle: Sequence[Sequence[float]]) -> float | None:
    """The oracle's mean saving over the sampled calls; ``None`` where none was sampled."""
    savings = [saving for samples in oracle for saving in samples]
    return statistics.fmean(savings) if savings else None


def oracle_under_margin(
    grids: Sequence[tuple[GridTHW, ...]], eager: Sequence[float], oracle: Sequence[Sequence[float]]
) -> float | None:
    """The share of the oracle's saving on layouts under the runner's margin, which admission leaves
    eager by design (the margin is the model's error): the defaults' share stays near or below one
    less this. ``None`` where nothing was sampled."""
    samples: dict[tuple[int, ...], list[float]] = defaultdict(list)
    eager_ms: dict[tuple[int, ...], list[float]] = defaultdict(list)
    for grid, call_ms, call_samples in zip(grids, eager, oracle, strict=True):
        lengths = segment_lengths(grid)
        samples[lengths].extend(call_samples)
        eager_ms[lengths].append(call_ms)
    total = sum(sum(saved) for saved in samples.values())
    if not total:
        return None
    under = sum(
        sum(saved)
        for lengths, saved in samples.items()
        if saved and not capturable(statistics.fmean(saved), statistics.fmean(eager_ms[lengths]))
    )
    return under / total


def _compared(eager: list[float], graphed: list[float], counts: dict[str, int], possible: float | None) -> dict:
    """The same calls all-eager and under graphs, and the share of the oracle's saving realized (only
    where it is over 5 % of eager: below, noise would decide it)."""
    realized = statistics.fmean(eager) - statistics.fmean(graphed)
    worth = possible is not None and possible > MIN_SAVING_SHARE * statistics.fmean(eager)
    return {
        "calls": len(eager),
        "eager": latency_summary(eager),
        "graphs": {**latency_summary(graphed), **counts},
        "possible_saving_ms": possible,
        "share": realized / possible if worth else None,
    }


@dataclass
class _Paired:
    """Per call: ms all-eager, ms under graphs (a capture's included), how it was served."""

    eager: list[float] = field(default_factory=list)
    graphs: list[float] = field(default_factory=list)
    served: list[str] = field(default_factory=list)
    stats_at_half: dict[str, Any] = field(default_factory=dict)


def _paired_calls(tower: Any, twin: Any, grids: Sequence[tuple[GridTHW, ...]], seed: int, label: str) -> _Paired:
    """Each call on ``twin`` (all-eager) and through ``tower``'s runner, in alternating order."""
    runner = tower.graph_runner
    timed = _Paired(stats_at_half=runner.stats())  # a stream of one call has an empty first half
    for index, (grid, pixels) in enumerate(_calls(tower, progress(list(grids), label, "call"), seed)):
        under_graphs = functools.partial(_time_under_graphs, tower, pixels, grid, timed)
        eager_ms, _ = _in_turn(index, functools.partial(_timed, twin, pixels, grid), under_graphs)
        timed.eager.append(eager_ms)
        if index + 1 == len(grids) // 2:
            timed.stats_at_half = runner.stats()
    return timed


def _in_turn(index: int, on_twin: Callable[[], float], under_graphs: Callable[[], _T]) -> tuple[float, _T]:
    """Both calls of ``index``, the twin first on even calls, so neither order's cost falls on one side."""
    if index % 2 == 0:
        eager_ms = on_twin()
        return eager_ms, under_graphs()
    graphed = under_graphs()
    return on_twin(), graphed


def _time_under_graphs(tower: Any, pixels: torch.Tensor, grid: tuple[GridTHW, ...], timed: _Paired) -> None:
    """One call through ``tower``'s runner: its ms and how it was served."""
    runner = tower.graph_runner
    before = runner.counters()
    timed.graphs.append(_timed(tower, pixels, grid))
    timed.served.append(served_as(before, runner.counters()))


def _calls(tower: Any, grids: Iterable[tuple[GridTHW, ...]], seed: int) -> Iterator[tuple[tuple, torch.Tensor]]:
    """Each grid with pixels made as it is reached (a stream's at once would take tens of GB)."""
    config, device = tower.config, tower.device
    width = config.in_channels * config.temporal_patch_size * config.patch_size**2
    generator = torch.Generator(device=device).manual_seed(seed)
    for grid in grids:
        patches = sum(t * h * w for t, h, w in grid)
        yield grid, torch.randn(patches, width, generator=generator, device=device, dtype=tower.dtype)


def _timed(tower: Any, pixels: torch.Tensor, grid: tuple[GridTHW, ...]) -> float:
    """Wall ms of one call from an idle device, its stream synchronized as a server waits for its work."""
    _synchronize_stream(tower.device)
    started = time.perf_counter()
    tower(pixels, list(grid))
    _synchronize_stream(tower.device)
    return (time.perf_counter() - started) * 1e3


@dataclass(frozen=True)
class _OracleReplay:
    """Median ms of a layout's replays of its own graph, paired with twin calls, and back to back."""

    paired_ms: float
    back_to_back_ms: float


def _oracle_replay_ms(
    tower: Any, twin: Any, grids: Sequence[tuple[GridTHW, ...]], seed: int
) -> dict[tuple, _OracleReplay]:
    """Per distinct grid, its replays of its own graph, captured for free (one graph held). Raises
    ``RuntimeError`` where a timed call was not a replay."""
    replay_ms: dict[tuple, _OracleReplay] = {}
    runner = tower.enable_graphs(capacity=1, min_hits=1, max_tokens=_MAX_PATCHES, budget_bytes=1 << 40,
                                 by_benefit=False, padded=False)  # fmt: skip
    for grid, pixels in _calls(tower, progress(sorted(set(grids)), "oracle", "layout"), seed):
        _timed(tower, pixels, grid)  # the capture
        replays_before = runner.stats()["replays"]
        on_twin = functools.partial(_timed, twin, pixels, grid)
        replayed = functools.partial(_timed, tower, pixels, grid)
        # In the order ``_paired_calls`` times the stream's calls.
        paired = [_in_turn(index, on_twin, replayed)[1] for index in range(_ORACLE_REPEATS)]
        back_to_back = [_timed(tower, pixels, grid) for _ in range(_ORACLE_REPEATS)]
        if runner.stats()["replays"] != replays_before + 2 * _ORACLE_REPEATS:
            raise RuntimeError(f"bench-traffic: the oracle's graph of {grid} did not replay")
        replay_ms[grid] = _OracleReplay(statistics.median(paired), statistics.median(back_to_back))
    tower.disable_graphs()
    return replay_ms


def per_call(
    grids: Sequence[tuple[GridTHW, ...]],
    eager: Sequence[float],
    graphed: Sequence[float],
    served: Sequence[str],
    oracle: Sequence[Sequence[float]],
) -> list[dict[str, Any]]:
    """Every call's raw record (``--json``), so a question the summaries miss needs no second run."""
    calls = zip(grids, eager, graphed, served, oracle, strict=True)
    return [
        {
            "grid": [list(image) for image in grid],
            "eager_ms": round(eager_ms, 3),
            "graph_ms": round(graph_ms, 3),
            "served": kind,
            "oracle_saving_ms": [round(saving, 3) for saving in savings],
        }
        for grid, eager_ms, graph_ms, kind, savings in calls
    ]


def served_as(before: dict[str, int], after: dict[str, int]) -> str:
    """How one call was served, from the runner's ``counters()`` around it: its eager reason, else
    ``capture``, else ``replay``; prefixed ``padded`` where it ran padded."""
    reasons = [reason for reason in EAGER_REASONS if after[reason] > before[reason]]
    if reasons:
        kind = reasons[0]
    elif after["captures"] > before["captures"]:
        kind = "capture"
    else:
        kind = "replay" if after["replays"] > before["replays"] else "unknown"
    return f"padded {kind}" if after["padded"] > before["padded"] else kind


def by_kind(
    eager: Sequence[float],
    graphed: Sequence[float],
    served: Sequence[str],
    oracle: Sequence[Sequence[float]],
) -> list[dict]:
    """Calls grouped by how they were served, with their times and the oracle's saving on them: where
    a share is lost."""
    groups: dict[str, list[tuple[float, float, Sequence[float]]]] = {}
    for eager_ms, graph_ms, kind, savings in zip(eager, graphed, served, oracle, strict=True):
        groups.setdefault(kind, []).append((eager_ms, graph_ms, savings))
    rows = []
    for kind, calls in sorted(groups.items(), key=lambda item: -len(item[1])):
        slower = [graph_ms - eager_ms for eager_ms, graph_ms, _ in calls if graph_ms > _SLOWER_CALL * eager_ms]
        sampled = [saving for _, _, savings in calls for saving in savings]
        rows.append(
            {
                "kind": kind,
                "calls": len(calls),
                "eager_mean_ms": statistics.fmean(eager_ms for eager_ms, _, _ in calls),
                "graphs_mean_ms": statistics.fmean(graph_ms for _, graph_ms, _ in calls),
                "slower_calls": len(slower),
                "slower_excess_ms": sum(slower),
                "oracle_samples": len(sampled),
                "oracle_saving_ms": statistics.fmean(sampled) if sampled else None,
            }
        )
    return rows


def _synchronize_stream(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def _latencies(summary: dict[str, float]) -> str:
    return " / ".join(f"{summary[key]:.2f}" for key in ("mean_ms", "p50_ms", "p90_ms", "p99_ms"))


def _launch_line(stream: dict[str, Any]) -> str | None:
    """Which eager runs taught the stream's launch time; ``None`` where none did."""
    samples = stream.get("launch_samples")
    if not samples:
        return None

    def spread(name: str) -> str:
        values = [sample[name] for sample in samples if sample[name] is not None]
        if len(values) < 2:
            return " / ".join(f"{value:.1f}" for value in values) or "-"
        deciles = statistics.quantiles(values, n=10, method="inclusive")
        return f"{deciles[0]:.1f} / {statistics.median(values):.1f} / {deciles[-1]:.1f}"

    return (
        f"{stream['stream']}: launch time {stream['launch_ms']:.1f} ms, learned from {len(samples)} launch-bound eager "
        f"runs (p10 / p50 / p90: host {spread('host_ms')} ms, the model's device time {spread('device_ms')}, "
        f"taught {spread('launch_ms')})"
    )


def _margin_line(stream: dict[str, Any]) -> str | None:
    """How much of the oracle's saving lies under admission's margin; ``None`` where none was sampled."""
    under = stream.get("oracle_under_margin")
    if under is None:
        return None
    return (
        f"{stream['stream']}: {under:.0%} of the oracle's saving lies on layouts that measured under "
        f"{MIN_SAVING_SHARE:.0%} of their eager time, which admission leaves eager (its margin)"
    )


def format_tower_table(report: dict[str, Any]) -> list[str]:
    header = ["stream", "calls", "replays", "captures", "eager mean / p50 / p90 / p99",
              "graphs mean / p50 / p90 / p99", "ratio mean / p90", "oracle saves", "share"]  # fmt: skip
    cells = []
    for stream in report["streams"]:
        half = stream["second_half"]
        for name, compared in ((stream["stream"], stream), (f"  its last {half['calls']}", half)):
            eager, graphs, share, possible = (compared[k] for k in ("eager", "graphs", "share", "possible_saving_ms"))
            cells.append(
                [
                    name,
                    str(compared["calls"]),
                    str(graphs["replays"]),
                    str(graphs["captures"]),
                    _latencies(eager),
                    _latencies(graphs),
                    f"{graphs['mean_ms'] / eager['mean_ms']:.3f}x / {graphs['p90_ms'] / eager['p90_ms']:.3f}x",
                    "-" if possible is None else f"{possible:.2f} ms",
                    "-" if share is None else f"{share:.0%}",
                ]
            )
    captures = [
        f"{stream['stream']}: {stream['graphs']['captures']} captures inside their calls (the runner: "
        f"{stream['runner_capture_ms']:.0f} ms capturing, {stream['runner_verify_ms']:.0f} ms checking first replays)"
        + (f"; {stream['captured_first']} captured before the stream" if stream.get("captured_first") else "")
        for stream in report["streams"]
    ]
    captures += [
        f"{stream['stream']}: the oracle's replays back to back took {pairing:+.2f} ms against those paired "
        "with the twin"
        for stream in report["streams"]
        if (pairing := stream.get("oracle_back_to_back_less_paired_ms")) is not None
    ]
    captures += [line for stream in report["streams"] if (line := _launch_line(stream))]
    kinds = []
    for stream in report["streams"]:
        for row in stream["second_half_by_kind"]:
            saving = row["oracle_saving_ms"]
            kinds.append(
                [
                    stream["stream"],
                    row["kind"],
                    str(row["calls"]),
                    f"{row['eager_mean_ms']:.2f}",
                    f"{row['graphs_mean_ms']:.2f}",
                    f"{row['slower_calls']} (+{row['slower_excess_ms']:.0f} ms)",
                    "-" if saving is None else f"{saving:.2f} ({row['oracle_samples']})",
                ]
            )
    kinds_header = ["stream", "second half: served as", "calls", "eager mean", "graphs mean", "over 10 % slower",
                    "oracle saves (samples)"]  # fmt: skip
    first = ", padded buckets captured first" if report.get("buckets_first") else ""
    title = f"rocm-vit bench-traffic --mode tower: {report['preset']} on {report['device']}{first} (measured)"
    notes = ["", "oracle saves: mean ms a graph of each call's own layout would save (sampled calls; its replays",
             "paired with eager calls on the twin, as the stream's calls are); share: of that,",
             "what the defaults realized on the mean (shown where the oracle saves over 5 % of eager);",
             "its last N: the stream's second half, the runner's steady state"]  # fmt: skip
    margins = [line for stream in report["streams"] if (line := _margin_line(stream))]
    return [title, "", *table_lines(header, cells), *notes, "", *captures, "", *sighting_lines(report), *margins,
            "", *table_lines(kinds_header, kinds)]  # fmt: skip
