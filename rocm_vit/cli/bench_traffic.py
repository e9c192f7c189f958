"""``rocm-vit bench-traffic``: what graph admission realizes of what graphs could save, per stream.

Each stream runs through the real ``ViTGraphRunner`` (a stand-in mechanism replays instantly) under each
of ``POLICIES``; every call is charged what the ``CostModel`` predicts for what the runner did, against
all-eager and a free-graph oracle, with #30's targets. Times are the model's, not measured; a deferred
capture's host work is charged to the calls served beside it (``_charge_contention``).
``--mode tower`` times the preset's real tower instead, on this machine's GPU, eagerly and then under
the serving defaults (captures on the runner's thread, contention included), per stream.
Results: docs/benchmarks.md, "`rocm-vit bench-traffic` · simulated · 2026-12-01".
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from rocm_vit.cli.traffic import GridTHW, Stream, standard_streams
from rocm_vit.cli.workload import build_tower, progress, segment_lengths, table_lines
from rocm_vit.graphs import EAGER_REASONS, ViTGraphRunner
from rocm_vit.graphs.cost import MIN_SAVING_SHARE, CostModel
from rocm_vit.graphs.padding import Padding
from rocm_vit.layout import AttentionLayout, VisionLayout

BLOCKS = 27  # Qwen3-VL-8B
# A deferred capture's host work in eager calls of its layout: the warm-up's launches, the capture's.
_CAPTURE_LAUNCHES = 2
SHARE_TARGET = 0.90  # of the possible saving on the mean, chat with a 1.3 MP cap
REPEATED_SHARE_TARGET = 0.80  # 6 x 640x360 in one call
MEAN_SLOWER_LIMIT = 1.01  # no stream slower than all-eager on the mean
P90_SLOWER_LIMIT = 1.02
_LIMITS = f"{MEAN_SLOWER_LIMIT - 1:.0%}, {P90_SLOWER_LIMIT - 1:.0%}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calls", type=int, default=2000, help="calls of each chat stream (others: a quarter)")
    parser.add_argument("--launch-ms", type=float, default=12.0, help="the host's launch time of one eager forward")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument(
        "--mode",
        choices=("model", "tower"),
        default="model",
        help="model: simulate with the cost model (default); tower: time the preset's tower on this machine",
    )
    parser.add_argument("--preset", default="qwen3-vl-8b", help="--mode tower: the tower (default qwen3-vl-8b)")
    parser.add_argument(
        "--stream",
        action="append",
        metavar="NAME",
        help="run only this stream (repeatable; default: all, in tower mode all but chat at the checkpoint's limits)",
    )
    parser.add_argument(
        "--idle-ms",
        type=float,
        default=0.0,
        help="host time between calls that no call uses, which a deferred capture takes first (default 0: "
        "calls back to back; in tower mode the caller sleeps)",
    )
    parser.add_argument(
        "--oracle-calls",
        type=int,
        default=100,
        help="--mode tower: calls sampled per stream to time the oracle, each layout's own graph (default 100)",
    )


def run(args: argparse.Namespace) -> int:
    names = {stream.name for stream in standard_streams(1, 0)}
    unknown = sorted(set(args.stream or ()) - names)
    if unknown:
        raise SystemExit(f"bench-traffic: unknown stream {unknown}; streams: {sorted(names)}")
    if args.mode == "tower":
        names = args.stream or _TOWER_STREAMS
        report = measure_tower(args.preset, args.calls, args.seed, names, args.oracle_calls, args.idle_ms)
        print(json.dumps(report, indent=2) if args.json else "\n".join(format_tower_table(report)))
        return 0
    host = CostModel().with_launch_ms(args.launch_ms)
    streams = [stream for stream in standard_streams(args.calls, args.seed) if stream.name in (args.stream or names)]
    simulated = [simulate(stream, host, args.idle_ms) for stream in streams]
    report = {"launch_ms": args.launch_ms, "idle_ms": args.idle_ms, "streams": simulated}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print("\n".join(format_table(report)))
    return 0 if all(row["met"] for row in target_rows(report)) else 1


# Admission before #30; by benefit with captures on the requests' path; off it, exact layouts only;
# and today's defaults, small layouts padded to shared buckets by the policy's model (launch as resolved).
_MODEL = CostModel().for_blocks(BLOCKS)
_BENEFIT = {"capacity": 32, "min_hits": 2, "max_tokens": 8192, "cost_model": _MODEL}
POLICIES: dict[str, dict[str, Any]] = {
    "count": {"capacity": 32, "min_hits": 2, "max_tokens": 4096, "cost_model": None},
    "benefit, inline": {**_BENEFIT, "defer_captures": False},
    "benefit, exact": {**_BENEFIT, "defer_captures": True},
    "benefit": {**_BENEFIT, "defer_captures": True, "padding": Padding(_MODEL, 8192)},
}


def simulate(stream: Stream, host: CostModel, idle_ms: float = 0.0) -> dict[str, Any]:
    """``stream`` under all-eager, the oracle and each of ``POLICIES``: per-call times and counts;
    ``idle_ms`` of host time between calls (``_charge_contention``)."""
    seq_lens = [segment_lengths(grid) for grid in stream.calls]
    eager = [host.eager_ms(lens) for lens in seq_lens]
    oracle = [min(host.eager_ms(lens), host.replay_ms(lens)) for lens in seq_lens]
    result: dict[str, Any] = {"stream": stream.name, "calls": len(stream.calls), "eager": _summary(eager)}
    result["oracle"] = _summary(oracle)
    for name, options in POLICIES.items():
        runner = ViTGraphRunner(
            _toy_blocks, _no_attention, mechanism=_InstantGraphs(), clock=_host_clock(host), **options
        )
        padding = options.get("padding")
        kinds, run_lens = [], []
        for grid in progress(list(stream.calls), f"{stream.name}, {name}", "call"):
            layout = VisionLayout.from_grid_thw(list(grid)).attention
            kinds.append(_call(runner, layout))
            ran = padding.padded(layout) if padding is not None else None
            run_lens.append((ran or layout).segmentations["full"].seq_lens)  # padded calls cost their bucket
        counts = {"replay": kinds.count("replay"), "eager": len(kinds) - kinds.count("replay")}
        counts["capture"] = runner.stats()["captures"]  # on the requests' path or not
        counts["padded"] = sum(len(ran) != len(lens) for ran, lens in zip(run_lens, seq_lens, strict=True))
        times = _charge_contention(host, kinds, run_lens, idle_ms)
        half = len(times) // 2  # the steady state, most captures behind it, as tower mode shows it
        result[name] = {
            **_summary(times),
            **counts,
            "share": _share(eager, oracle, times),
            "second_half_share": _share(eager[half:], oracle[half:], times[half:]),
        }
    return result


def _no_attention(layout: Any, cu_seqlens: Any) -> dict:
    return {}  # the toy blocks attend to nothing


def _call(runner: ViTGraphRunner, layout: AttentionLayout) -> str:
    before = runner.stats()
    x = torch.ones(layout.num_patches, 1)
    runner.run(x, layout, x, x)
    runner.wait_for_captures()  # done at once here; its cost is charged by _charge_contention
    after = runner.stats()
    if after["eager_runs"]["capture_deferred"] > before["eager_runs"]["capture_deferred"]:
        return "deferred"  # served eagerly; the capture runs beside the next calls
    if after["captures"] > before["captures"]:
        return "capture"
    return "replay" if after["replays"] > before["replays"] else "eager"


def _charge_contention(
    host: CostModel, kinds: Sequence[str], run_lens: Sequence[Sequence[int]], idle_ms: float = 0.0
) -> list[float]:
    """Each call's ms, where a deferred capture's host work (its warm-up's and its capture's launches:
    ``_CAPTURE_LAUNCHES`` eager calls of its layout) takes the ``idle_ms`` before each call first,
    then shares the host with the calls after it: each pays as much again as its own time until
    that work is done, and is served eagerly meanwhile. On the H200 calls back to back beside a
    capture took 16-37 ms more than eagerly, about two per capture (docs/benchmarks.md,
    "`rocm-vit bench-traffic --mode tower`")."""
    times, capture_work = [], 0.0
    for kind, lens in zip(kinds, run_lens, strict=True):
        capture_work = max(0.0, capture_work - idle_ms)
        own = _charge(host, "eager" if capture_work > 0 else kind, lens)
        beside = min(capture_work, own)
        capture_work -= beside
        times.append(own + beside)
        if kind == "deferred":
            capture_work += _CAPTURE_LAUNCHES * host.eager_ms(lens)
    return times


def _charge(host: CostModel, kind: str, seq_lens: Sequence[int]) -> float:
    if kind in ("eager", "deferred"):
        return host.eager_ms(seq_lens)
    if kind == "replay":
        return host.replay_ms(seq_lens)
    return host.eager_ms(seq_lens) + host.capture_ms + host.replay_ms(seq_lens)  # on the call's own path


def _share(eager: list[float], oracle: list[float], times: list[float]) -> float | None:
    possible = statistics.fmean(eager) - statistics.fmean(oracle)
    return None if possible <= 1e-9 else (statistics.fmean(eager) - statistics.fmean(times)) / possible


def _summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "mean_ms": statistics.fmean(times),
        "p50_ms": ordered[len(ordered) // 2],
        "p90_ms": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
    }


def _toy_blocks(x: torch.Tensor, attn_args: dict, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + sin


def _host_clock(host: CostModel) -> Callable[[], float]:
    """A clock under which each eager run (two reads) takes the host's launch time."""
    reads = iter(range(1 << 62))
    return lambda: next(reads) * host.launch_ms / 1e3


@dataclass
class _InstantGraph:
    fn: Callable[[], torch.Tensor]


class _InstantGraphs:
    """A mechanism whose graphs re-run their function at replay, on the CPU; no memory is modeled."""

    def available(self, device: torch.device) -> bool:
        return True

    def total_memory(self, device: torch.device) -> int:
        return 141 << 30

    def new_pool(self, device: torch.device) -> object:
        return object()

    def new_stream(self, device: torch.device) -> str:
        return "runner"

    @contextmanager
    def on_stream(self, stream: object) -> Iterator[None]:
        yield

    def current_stream(self, device: torch.device) -> str:
        return "caller"

    def mark(self, stream: object, marker: object) -> object:
        return marker

    def follow(self, stream: object, marker: object) -> None:
        pass

    def warm_up(self, fn: Callable[[], torch.Tensor], pool: object, stream: object) -> torch.Tensor:
        return fn()

    def capture(
        self, fn: Callable[[], torch.Tensor], pool: object, stream: object
    ) -> tuple[_InstantGraph, torch.Tensor]:
        return _InstantGraph(fn), fn()

    def replay(self, graph: _InstantGraph) -> None:
        graph.fn()

    def retire(self, graph: object) -> None:
        pass

    def pool_bytes(self, pool: object, device: torch.device) -> int:
        return 0

    def release_pools(self, pools: list[object], device: torch.device) -> None:
        pass


def target_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, each with what today's defaults gave."""
    rows = []
    for stream in report["streams"]:
        name, now, eager = stream["stream"], stream["benefit"], stream["eager"]
        rows.append(
            {
                "target": f"{name}: mean, p90 within {_LIMITS} of all-eager",
                "value": f"mean {now['mean_ms'] / eager['mean_ms']:.3f}x, p90 {now['p90_ms'] / eager['p90_ms']:.3f}x",
                "met": not slower_than_eager(eager, now),
            }
        )
        if name.endswith("1.3 MP cap"):
            rows.append(_share_row(name, now, SHARE_TARGET))
        elif name.startswith("6 x"):
            rows.append(_share_row(name, now, REPEATED_SHARE_TARGET))
        elif name.startswith(("8 x", "1 x")):
            possible = 1 - stream["oracle"]["mean_ms"] / eager["mean_ms"]
            value = f"{now['capture']} captures (the oracle saves {possible:.0%})"
            rows.append({"target": f"{name}: left eager", "value": value, "met": now["capture"] == 0})
    return rows


def slower_than_eager(eager: dict[str, Any], graphs: dict[str, Any]) -> bool:
    """Whether summaries of the same calls under graphs are past the limits against all-eager."""
    return (
        graphs["mean_ms"] > MEAN_SLOWER_LIMIT * eager["mean_ms"]
        or graphs["p90_ms"] > P90_SLOWER_LIMIT * eager["p90_ms"]
    )


def _share_row(name: str, now: dict[str, Any], target: float) -> dict[str, Any]:
    share = now["share"]
    return {
        "target": f"{name}: >= {target:.0%} of the possible saving on the mean",
        "value": "-" if share is None else f"{share:.0%}",
        "met": share is not None and share >= target,
    }


def format_table(report: dict[str, Any]) -> list[str]:
    header = ["stream", "calls", "policy", "replay %", "padded %", "captures", "mean ms", "p50 ms", "p90 ms"]
    header += ["share of saving", "its 2nd half"]
    cells = []
    for stream in report["streams"]:
        for name in ("eager", "oracle", *POLICIES):
            measured = stream[name]
            replayed = f"{100 * measured['replay'] / stream['calls']:.1f}" if "replay" in measured else ""
            padded = f"{100 * measured['padded'] / stream['calls']:.1f}" if "padded" in measured else ""
            share, steady = measured.get("share"), measured.get("second_half_share")
            cells.append(
                [
                    stream["stream"] if name == "eager" else "",
                    str(stream["calls"]) if name == "eager" else "",
                    name,
                    replayed,
                    padded,
                    str(measured.get("capture", "")),
                    f"{measured['mean_ms']:.2f}",
                    f"{measured['p50_ms']:.2f}",
                    f"{measured['p90_ms']:.2f}",
                    "" if share is None else f"{share:.0%}",
                    "" if steady is None else f"{steady:.0%}",
                ]
            )
    idle = f", {report['idle_ms']:g} ms idle between calls" if report.get("idle_ms") else ""
    host = f"host launch {report['launch_ms']} ms{idle}"
    lines = [f"rocm-vit bench-traffic: Qwen3-VL-8B cost model, {host} (simulated)", ""]
    lines += table_lines(header, cells)
    lines += [
        "",
        *table_lines(
            ["target", "value", "met"],
            [[r["target"], r["value"], "yes" if r["met"] else "NO"] for r in target_rows(report)],
            left=True,
        ),
    ]
    return lines


# --mode tower: measured, not modelled --------------------------------------------------------------

_ORACLE_REPEATS = 7  # eager calls and replays per layout the oracle times
_SLOWER_CALL = 1.1  # a call this much slower than its eager twin is counted in ``by_kind``
_MAX_PATCHES = 65536  # the oracle's largest graph (a 32-frame 720p clip: 57,600 patches)
# The streams timed on a real tower: all but chat at the checkpoint's limits (12 MP photos, minutes).
_TOWER_STREAMS = ("chat, 1.3 MP cap", "6 x 640x360 per call", "8 x 640x360 per call", "1 x 1.3 MP per call",
                  "1 x 1080p per call", "video")  # fmt: skip


def measure_tower(
    preset_name: str,
    calls: int,
    seed: int,
    names: Sequence[str] = _TOWER_STREAMS,
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
                    "possible_saving_ms": possible,
                    "launch_ms": stats["launch_ms"],
                    "eager_runs": {reason: count for reason, count in stats["eager_runs"].items() if count},
                    "pool_releases": stats["pool_releases"],
                    "evictions": stats["evictions"],
                    "bytes_held": stats["bytes_held"],
                    "second_half_by_kind": by_kind(eager[half:], graphed[half:], served[half:]),
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
        "eager": _summary(eager),
        "graphs": {**_summary(graphed), **counts},
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


def by_kind(eager: Sequence[float], graphed: Sequence[float], served: Sequence[tuple[str, bool]]) -> list[dict]:
    """Calls grouped by how they were served and whether beside a capture: how many, their mean ms
    under graphs and all-eager, and how many were over 10 % slower than eager, with the ms over."""
    groups: dict[tuple[str, bool], list[tuple[float, float]]] = {}
    for eager_ms, graph_ms, how in zip(eager, graphed, served, strict=True):
        groups.setdefault(how, []).append((eager_ms, graph_ms))
    rows = []
    for (kind, beside), pairs in sorted(groups.items(), key=lambda item: -len(item[1])):
        slower = [graph_ms - eager_ms for eager_ms, graph_ms in pairs if graph_ms > _SLOWER_CALL * eager_ms]
        rows.append(
            {
                "kind": kind,
                "beside_capture": beside,
                "calls": len(pairs),
                "eager_mean_ms": statistics.fmean(eager_ms for eager_ms, _ in pairs),
                "graphs_mean_ms": statistics.fmean(graph_ms for _, graph_ms in pairs),
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
    return [title, "", *table_lines(header, cells), *notes, "", *table_lines(kinds_header, kinds)]
