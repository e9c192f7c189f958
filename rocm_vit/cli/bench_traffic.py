"""``rocm-vit bench-traffic``: what graph admission realizes of what graphs could save, per stream.

Each stream runs through the real ``ViTGraphRunner`` on a stand-in mechanism, each call charged what
the ``CostModel`` predicts for how it was served, against all-eager, a free-graph oracle and a bound
on admission: the admission code itself is what is measured, in seconds, without a GPU. Times are the
model's. Results: docs/benchmarks.md, "`rocm-vit bench-traffic` · simulated".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import torch

from rocm_vit.cli.traffic_tower import TOWER_STREAMS, format_tower_table, measure_tower
from rocm_vit.graphs import ViTGraphRunner, admission
from rocm_vit.graphs.cost import MIN_SAVING_SHARE, CostModel
from rocm_vit.graphs.options import RunnerOptions
from rocm_vit.graphs.torch_graphs import HostGraphs
from rocm_vit.layout import AttentionLayout, VisionLayout
from rocm_vit.policy import runner_options
from rocm_vit.settings import Settings
from rocm_vit.workloads.traffic import (
    MEAN_SLOWER_LIMIT,
    P90_SLOWER_LIMIT,
    Stream,
    latency_summary,
    oracle_by_sighting,
    sighting_lines,
    slower_than_eager,
    standard_streams,
)
from rocm_vit.workloads.workload import progress, segment_lengths, table_lines

BLOCKS = 27  # Qwen3-VL-8B
MERGE = 2  # its spatial merge: the layouts' default
# The serving targets: share of the possible saving, no slower than all-eager on the mean and at p90.
SHARE_TARGET = 0.85  # of the oracle's saving on the mean, chat with a 1.3 MP cap (its p90 within the limit too)
REPEATED_SHARE_TARGET = 0.80  # 6 x 640x360 in one call
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
        "--buckets-first",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="capture the padded buckets of one image and of two before each stream, as the SGLang plugin "
        "does at server start (charged nothing; the stream's counts leave them out; default on)",
    )
    parser.add_argument(
        "--tuned",
        action="store_true",
        help="model mode: the runner's cost model and padding at --launch-ms, as a `rocm-vit tune` profile of "
        "that host resolves them (default: the untuned model's 10 ms launch, a server without a profile)",
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
        report = measure_tower(args.preset, args.calls, args.seed, names, args.oracle_calls, args.buckets_first)
        print(json.dumps(report, indent=2) if args.json else "\n".join(format_tower_table(report)))
        return 0
    host = CostModel().with_launch_ms(args.launch_ms)
    streams = [stream for stream in standard_streams(args.calls, args.seed) if stream.name in (args.stream or names)]
    tuned_ms = args.launch_ms if args.tuned else None
    simulated = [simulate(stream, host, args.buckets_first, tuned_ms) for stream in streams]
    report = {"launch_ms": args.launch_ms, "buckets_first": args.buckets_first, "tuned": args.tuned,
              "streams": simulated}  # fmt: skip
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print("\n".join(format_table(report)))
    return 0 if all(row["met"] for row in target_rows(report)) else 1


def policies(tuned_launch_ms: float | None = None) -> dict[str, RunnerOptions]:
    """Today's defaults (launch time untuned or ``tuned_launch_ms``), the same without padding, and
    admission by call count (the baseline before the cost model)."""
    defaults = runner_options(None, Settings(), BLOCKS, takes_device_offsets=True)
    if tuned_launch_ms is not None:
        model = defaults.cost_model.with_launch_ms(tuned_launch_ms)
        defaults = replace(defaults, cost_model=model, padding_model=model)
    return {
        "count": replace(defaults, max_tokens=4096, cost_model=None, padding_model=None),
        "benefit, exact": replace(defaults, padding_model=None),
        "benefit": defaults,
    }


POLICY_NAMES = tuple(policies())


def simulate(
    stream: Stream, host: CostModel, buckets_first: bool = False, tuned_launch_ms: float | None = None
) -> dict[str, Any]:
    """``stream`` under all-eager, the oracle, the bound and each policy: per-call times and counts.
    ``buckets_first``: bucket captures first, charged nothing, as at a server's start."""
    chosen = policies(tuned_launch_ms)
    max_tokens = chosen["benefit"].max_tokens
    seq_lens = [segment_lengths(grid) for grid in stream.calls]
    eager = [host.eager_ms(lens) for lens in seq_lens]
    oracle = [min(host.eager_ms(lens), host.replay_ms(lens)) for lens in seq_lens]
    result: dict[str, Any] = {"stream": stream.name, "calls": len(stream.calls), "eager": latency_summary(eager)}
    result["oracle"] = latency_summary(oracle)
    savings = [[e - o] for e, o in zip(eager, oracle, strict=True)]
    result["oracle_by_sighting"] = oracle_by_sighting(stream.calls, savings, max_tokens)
    bound, captures = admission_bound(seq_lens, host, chosen["benefit"].padding.bucket_for, max_tokens)
    result["bound"] = {**latency_summary(bound), "capture": captures, **_shares(eager, oracle, bound)}
    with _admission_unheard():
        for name, options in chosen.items():
            clock = _HostClock(host)
            runner = ViTGraphRunner(_toy_blocks, _no_attention, options, mechanism=HostGraphs(), clock=clock)
            padding = options.padding
            if buckets_first and padding is not None:
                for grids in padding.bucket_call_grids(MERGE):
                    layout = VisionLayout.from_grid_thw(grids, MERGE).attention
                    _call(runner, layout, clock, layout.segmentations["full"].seq_lens)  # charged nothing
            kinds, run_lens = [], []
            for grid in progress(list(stream.calls), f"{stream.name}, {name}", "call"):
                layout = VisionLayout.from_grid_thw(list(grid)).attention
                ran = padding.padded(layout) if padding is not None else None
                run_lens.append((ran or layout).segmentations["full"].seq_lens)  # padded calls cost their bucket
                kinds.append(_call(runner, layout, clock, run_lens[-1]))
            counts = {kind: kinds.count(kind) for kind in ("replay", "eager", "capture")}
            counts["padded"] = sum(len(ran) != len(lens) for ran, lens in zip(run_lens, seq_lens, strict=True))
            times = [_charge(host, kind, lens) for kind, lens in zip(kinds, run_lens, strict=True)]
            result[name] = {**latency_summary(times), **counts, **_shares(eager, oracle, times)}
    return result


@contextlib.contextmanager
def _admission_unheard() -> Iterator[None]:
    """Silence admission's far-from-the-model warning: a simulated host is far from it on purpose."""
    log = logging.getLogger(admission.__name__)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def admission_bound(
    seq_lens: Sequence[Sequence[int]], host: CostModel, bucket_for: Callable[[int], int | None], max_tokens: int
) -> tuple[list[float], int]:
    """Per call, the ms of the best admission that knows every layout's calls in advance: per layout,
    the better of all calls padded (bucket graphs free) or all replayed from its own graph, captured
    in its first call. No capacity: a ceiling on what any admission policy realizes."""
    calls: dict[tuple[int, ...], list[int]] = {}
    for index, lengths in enumerate(seq_lens):
        calls.setdefault(tuple(lengths), []).append(index)
    times, captures = [0.0] * len(seq_lens), 0
    for lengths, indexes in calls.items():
        eager, tokens = host.eager_ms(lengths), sum(lengths)
        bucket = bucket_for(tokens)
        padded = eager if bucket is None else min(eager, host.replay_ms((*lengths, bucket - tokens)))
        own, capture_call = min(eager, host.replay_ms(lengths)), _charge(host, "capture", lengths)
        repays = tokens <= max_tokens and capture_call + (len(indexes) - 1) * own < len(indexes) * padded
        for order, index in enumerate(indexes):
            times[index] = (own if order else capture_call) if repays else padded
        captures += repays
    return times, captures


def _no_attention(layout: Any, cu_seqlens: Any) -> dict:
    return {}  # the toy blocks attend to nothing


def _call(runner: ViTGraphRunner, layout: AttentionLayout, clock: _HostClock, run_lens: Sequence[int]) -> str:
    """How ``runner`` served a call of ``layout``; an eager run takes the host's time of ``run_lens``."""
    clock.run_ms = clock.host.eager_ms(run_lens)
    before = runner.stats()
    x = torch.ones(layout.num_patches, 1)
    runner.run(x, layout, x, x)
    after = runner.stats()
    if after["captures"] > before["captures"]:
        return "capture"
    return "replay" if after["replays"] > before["replays"] else "eager"


def _charge(host: CostModel, kind: str, seq_lens: Sequence[int]) -> float:
    """The ms of one call served as ``kind``; a capturing call pays warm-up, capture and first replay."""
    if kind == "eager":
        return host.eager_ms(seq_lens)
    if kind == "replay":
        return host.replay_ms(seq_lens)
    return host.eager_ms(seq_lens) + host.capture_ms + host.replay_ms(seq_lens)


def _shares(eager: list[float], oracle: list[float], times: list[float]) -> dict[str, float | None]:
    """The share of the oracle's saving realized over the stream and over its second half."""
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


class _HostClock:
    """Each eager run (two reads) takes the host's eager time of the call's layout, so launch-time
    learning sees what it sees on a tower (a device-bound run takes more than the launch)."""

    def __init__(self, host: CostModel) -> None:
        self.host = host
        self.run_ms = host.launch_ms
        self._now_s = 0.0

    def __call__(self) -> float:
        self._now_s += self.run_ms / 1e3
        return self._now_s


def target_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The serving targets, each with what today's defaults gave."""
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
            rows.append(_share_row(name, now, eager, SHARE_TARGET, p90_too=True))
        elif name.startswith("6 x"):
            rows.append(_share_row(name, now, eager, REPEATED_SHARE_TARGET))
        elif name.startswith(("8 x", "1 x")):
            possible = 1 - stream["oracle"]["mean_ms"] / eager["mean_ms"]
            if possible >= MIN_SAVING_SHARE:  # launch-bound on this host: a graph pays
                rows.append(_share_row(name, now, eager, REPEATED_SHARE_TARGET))
                continue
            value = f"{now['capture']} captures (the oracle saves {possible:.0%})"
            rows.append({"target": f"{name}: left eager", "value": value, "met": now["capture"] == 0})
    return rows


def _share_row(
    name: str, now: dict[str, Any], eager: dict[str, Any], target: float, p90_too: bool = False
) -> dict[str, Any]:
    """``now`` realizes at least ``target`` of the oracle's mean saving (where that is nothing: loses
    nothing against eager); ``p90_too``: its p90 within ``P90_SLOWER_LIMIT`` too."""
    share = now["share"]
    if share is None:
        met, value = now["mean_ms"] <= eager["mean_ms"], "the oracle saves nothing"
    else:
        met, value = share >= target, f"{share:.0%}"
    wanted = f">= {target:.0%} of the possible saving on the mean"
    if p90_too:
        p90 = now["p90_ms"] / eager["p90_ms"]
        wanted = f"p90 within {P90_SLOWER_LIMIT - 1:.0%} of all-eager and {wanted}"
        value, met = f"p90 {p90:.3f}x, {value}", met and p90 <= P90_SLOWER_LIMIT
    return {"target": f"{name}: {wanted}", "value": value, "met": met}


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
        for name in ("eager", "oracle", "bound", *POLICY_NAMES):
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
    first = ", padded buckets captured first" if report.get("buckets_first") else ""
    tuned = ", the policy tuned to it" if report.get("tuned") else ""
    host = f"host launch {report['launch_ms']} ms{tuned}{first}"
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
