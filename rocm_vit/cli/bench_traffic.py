"""``rocm-vit bench-traffic``: what graph admission realizes of what graphs could save, per stream.

Each stream runs through the real ``ViTGraphRunner`` (a stand-in mechanism replays instantly) under each
of ``POLICIES``; every call is charged what the ``CostModel`` predicts for what the runner did, against
all-eager and a free-graph oracle, with #30's targets. Times are the model's, not measured; a deferred
capture's host work is charged to the calls served beside it (``_charge_contention``).
``--mode tower`` times the preset's real tower instead (``traffic_tower``).
Results: docs/benchmarks.md, "`rocm-vit bench-traffic` · simulated · 2026-12-01".
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from rocm_vit.cli.traffic import (
    Stream,
    latency_summary,
    oracle_by_sighting,
    sighting_lines,
    spread_capture_work,
    standard_streams,
)
from rocm_vit.cli.traffic_tower import TOWER_STREAMS, format_tower_table, measure_tower
from rocm_vit.cli.workload import progress, segment_lengths, table_lines
from rocm_vit.graphs import ViTGraphRunner
from rocm_vit.graphs.cost import CostModel
from rocm_vit.graphs.padding import Padding
from rocm_vit.layout import AttentionLayout, VisionLayout

BLOCKS = 27  # Qwen3-VL-8B
MERGE = 2  # its spatial merge: the layouts' default
SHARE_TARGET = 0.90  # of the possible saving on the mean, chat with a 1.3 MP cap
REPEATED_SHARE_TARGET = 0.80  # 6 x 640x360 in one call
MEAN_SLOWER_LIMIT = 1.01  # no stream slower than all-eager on the mean
P90_SLOWER_LIMIT = 1.02
_LIMITS = f"{MEAN_SLOWER_LIMIT - 1:.0%}, {P90_SLOWER_LIMIT - 1:.0%}"
# A deferred capture's wait beyond its layout's eager launches: checking its first replay (11 ms)
# and reading the pool's size. The H200 waited 35-39 ms a capture on hosts that launched a chat
# call in 15-23 ms (docs/benchmarks.md, "`rocm-vit bench-traffic --mode tower`", session 19).
CAPTURE_CHECK_MS = 18.0


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
        "--buckets-first",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="capture the padded buckets of one image and of two before each stream, as the SGLang plugin "
        "does at server start (charged nothing; the stream's counts leave them out; default on)",
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
        names = args.stream or TOWER_STREAMS
        report = measure_tower(
            args.preset, args.calls, args.seed, names, args.oracle_calls, args.idle_ms, args.buckets_first
        )
        print(json.dumps(report, indent=2) if args.json else "\n".join(format_tower_table(report)))
        return 0
    host = CostModel().with_launch_ms(args.launch_ms)
    streams = [stream for stream in standard_streams(args.calls, args.seed) if stream.name in (args.stream or names)]
    simulated = [simulate(stream, host, args.idle_ms, args.buckets_first) for stream in streams]
    report = {"launch_ms": args.launch_ms, "idle_ms": args.idle_ms, "buckets_first": args.buckets_first,
              "streams": simulated}  # fmt: skip
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


def simulate(stream: Stream, host: CostModel, idle_ms: float = 0.0, buckets_first: bool = False) -> dict[str, Any]:
    """``stream`` under all-eager, the oracle and each of ``POLICIES``: per-call times and counts;
    ``idle_ms`` of host time between calls (``_charge_contention``). ``buckets_first``: a policy
    that pads first serves the calls that capture its buckets (``Padding.bucket_call_grids``),
    charged nothing and left out of its counts, as a server's startup would."""
    seq_lens = [segment_lengths(grid) for grid in stream.calls]
    eager = [host.eager_ms(lens) for lens in seq_lens]
    oracle = [min(host.eager_ms(lens), host.replay_ms(lens)) for lens in seq_lens]
    result: dict[str, Any] = {"stream": stream.name, "calls": len(stream.calls), "eager": latency_summary(eager)}
    result["oracle"] = latency_summary(oracle)
    savings = [[e - o] for e, o in zip(eager, oracle, strict=True)]
    result["oracle_by_sighting"] = oracle_by_sighting(stream.calls, savings, _BENEFIT["max_tokens"])
    bound, captures = admission_bound(seq_lens, host, POLICIES["benefit"]["padding"].bucket_for, _BENEFIT["max_tokens"])
    result["bound"] = {**latency_summary(bound), "capture": captures, **_shares(eager, oracle, bound)}
    for name, options in POLICIES.items():
        mechanism = _InstantGraphs()
        runner = ViTGraphRunner(_toy_blocks, _no_attention, mechanism=mechanism, clock=_host_clock(host), **options)
        padding = options.get("padding")
        if buckets_first and padding is not None:
            for grids in padding.bucket_call_grids(MERGE):
                _call(runner, VisionLayout.from_grid_thw(grids, MERGE).attention)  # charged nothing
        captured_first = runner.stats()["captures"]
        kinds, run_lens, capture_launches = [], [], []
        for grid in progress(list(stream.calls), f"{stream.name}, {name}", "call"):
            layout = VisionLayout.from_grid_thw(list(grid)).attention
            warm_ups = mechanism.warm_ups
            kinds.append(_call(runner, layout))
            # A deferred capture launches the forward once, twice where it warms up a fresh pool.
            capture_launches.append((1 + mechanism.warm_ups - warm_ups) * (kinds[-1] == "deferred"))
            ran = padding.padded(layout) if padding is not None else None
            run_lens.append((ran or layout).segmentations["full"].seq_lens)  # padded calls cost their bucket
        counts = {"replay": kinds.count("replay"), "eager": len(kinds) - kinds.count("replay")}
        counts["capture"] = runner.stats()["captures"] - captured_first  # on the requests' path or not
        counts["padded"] = sum(len(ran) != len(lens) for ran, lens in zip(run_lens, seq_lens, strict=True))
        times = _charge_contention(host, kinds, run_lens, capture_launches, idle_ms)
        result[name] = {**latency_summary(times), **counts, **_shares(eager, oracle, times)}
    return result


def admission_bound(
    seq_lens: Sequence[Sequence[int]], host: CostModel, bucket_for: Callable[[int], int | None], max_tokens: int
) -> tuple[list[float], int]:
    """Per call, the ms of the best admission with these graphs that knows every layout's calls in
    advance, and its captures: for each layout the better of two choices the static rule could make,
    every call padded to its bucket (``bucket_for``: ``Padding.bucket_for``; bucket graphs free, taken
    where they beat eager), or its first call eager and the rest replayed from its own graph (within
    ``max_tokens``), the capture charged one eager call and ``CAPTURE_CHECK_MS`` at the second call.
    No contention, no capacity: a ceiling on what any admission policy realizes with this mechanism."""
    calls: dict[tuple[int, ...], list[int]] = {}
    for index, lengths in enumerate(seq_lens):
        calls.setdefault(tuple(lengths), []).append(index)
    times, captures = [0.0] * len(seq_lens), 0
    for lengths, indexes in calls.items():
        eager, tokens = host.eager_ms(lengths), sum(lengths)
        bucket = bucket_for(tokens)
        padded = eager if bucket is None else min(eager, host.replay_ms((*lengths, bucket - tokens)))
        own = min(eager, host.replay_ms(lengths))
        capture_ms = eager + CAPTURE_CHECK_MS
        with_own_graph = eager + (len(indexes) - 1) * own + capture_ms
        repays = len(indexes) > 1 and tokens <= max_tokens and with_own_graph < len(indexes) * padded
        for order, index in enumerate(indexes):
            times[index] = (own if order else eager) if repays else padded
        if repays:
            times[indexes[1]] += capture_ms
            captures += 1
    return times, captures


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
    host: CostModel,
    kinds: Sequence[str],
    run_lens: Sequence[Sequence[int]],
    capture_launches: Sequence[int],
    idle_ms: float = 0.0,
) -> list[float]:
    """Each call's ms, the host work of the capture a call deferred (``capture_launches`` eager calls
    of its layout: the capture's, and a warm-up's; then ``CAPTURE_CHECK_MS``) charged to the calls
    behind it by ``spread_capture_work``."""
    eager = [host.eager_ms(lens) for lens in run_lens]
    served = [_charge(host, kind, lens) for kind, lens in zip(kinds, run_lens, strict=True)]
    work = [
        launches * ms + (CAPTURE_CHECK_MS if launches else 0.0)
        for launches, ms in zip(capture_launches, eager, strict=True)
    ]
    return spread_capture_work(served, eager, work, idle_ms)[0]


def _charge(host: CostModel, kind: str, seq_lens: Sequence[int]) -> float:
    if kind in ("eager", "deferred"):
        return host.eager_ms(seq_lens)
    if kind == "replay":
        return host.replay_ms(seq_lens)
    return host.eager_ms(seq_lens) + host.capture_ms + host.replay_ms(seq_lens)  # on the call's own path


def _shares(eager: list[float], oracle: list[float], times: list[float]) -> dict[str, float | None]:
    """The share of the oracle's saving ``times`` realize over the stream and over its second half
    (the steady state, most captures behind it, as tower mode shows it)."""
    half = len(times) // 2
    return {
        "share": _share(eager, oracle, times),
        "second_half_share": _share(eager[half:], oracle[half:], times[half:]),
    }


def _share(eager: list[float], oracle: list[float], times: list[float]) -> float | None:
    possible = statistics.fmean(eager) - statistics.fmean(oracle)
    return None if possible <= 1e-9 else (statistics.fmean(eager) - statistics.fmean(times)) / possible


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

    def __init__(self) -> None:
        self.warm_ups = 0

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
        self.warm_ups += 1
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


def _bound_lines(report: dict[str, Any]) -> list[str]:
    """Per stream, what the serving default realizes of the bound's saving (``admission_bound``)."""
    lines = []
    for stream in report["streams"]:
        bound, now = stream["bound"]["share"], stream["benefit"]["share"]
        if bound and now is not None:
            lines.append(f"{stream['stream']}: the serving default realizes {now / bound:.0%} of the bound's saving")
    note = "(bound: the best admission with these graphs, knowing each layout's calls in advance)"
    return [*lines, note] if lines else []


def format_table(report: dict[str, Any]) -> list[str]:
    header = ["stream", "calls", "policy", "replay %", "padded %", "captures", "mean ms", "p50 ms", "p90 ms"]
    header += ["share of saving", "its 2nd half"]
    cells = []
    for stream in report["streams"]:
        for name in ("eager", "oracle", "bound", *POLICIES):
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
    first = ", padded buckets captured first" if report.get("buckets_first") else ""
    host = f"host launch {report['launch_ms']} ms{idle}{first}"
    lines = [f"rocm-vit bench-traffic: Qwen3-VL-8B cost model, {host} (simulated)", ""]
    lines += table_lines(header, cells)
    lines += ["", *sighting_lines(report), *_bound_lines(report)]
    lines += [
        "",
        *table_lines(
            ["target", "value", "met"],
            [[r["target"], r["value"], "yes" if r["met"] else "NO"] for r in target_rows(report)],
            left=True,
        ),
    ]
    return lines
