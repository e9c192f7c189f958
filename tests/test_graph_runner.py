"""ViTGraphRunner policy on CPU: keys, staging, admission, eviction, budget, failures, owned outputs, stats.

A real graph cannot exist on a CPU, so the mechanism is swapped for a stand-in whose "graph" re-runs
the captured function on the staging views at replay: it reads exactly what a real graph would
read, so stale staging or offsets show up as wrong results here too. Its pool reports the bytes a
real shared pool would hold: the largest warm-up's or capture's intermediates, in whole segments.
"""

from __future__ import annotations

import gc
import itertools
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
import torch

from rocm_vit.attention import AttnArgs, SegmentLengths, VarlenArgs, get_backend
from rocm_vit.graphs import CudaGraphs, ViTGraphRunner
from rocm_vit.graphs.cost import PAYBACK_SHARE, CostModel
from rocm_vit.graphs.memory import ScratchBounds
from rocm_vit.graphs.options import RunnerOptions
from rocm_vit.graphs.runner import LayoutArgs
from rocm_vit.graphs.torch_graphs import HostGraphs
from rocm_vit.layout import AttentionLayout, VisionLayout
from rocm_vit.models import preset, tower_class

_CAPTURING = threading.local()


def stand_in_capturing() -> bool:
    """Whether this thread is inside a stand-in capture (``torch.cuda.is_current_stream_capturing``)."""
    return getattr(_CAPTURING, "active", False)


def stand_in_graph_slots() -> list | None:
    """During a stand-in capture, the captured graph's list of device-side slots (what a captured
    kernel reads its pointers from, ``rank_data``); during a replay, an iterator over them; else
    ``None``. A stand-in communicator appends at capture and takes the next at replay."""
    return getattr(_CAPTURING, "slots", None)


@dataclass(eq=False)
class _StandInGraph:
    fn: Any
    output: torch.Tensor
    tokens: int
    pool: _StandInPool
    corrupt: bool
    replays: int = 0
    slots: list = field(default_factory=list)


@dataclass(eq=False)
class _StandInPool:
    """A shared caching pool: it grows to what a warm-up or capture needs beyond what it holds, in
    whole segments, and keeps what they free for the next ones."""

    reserved_bytes: int = 0
    live_graphs: int = 0
    captured_graphs: int = 0


@dataclass
class StandInGraphs(HostGraphs):
    """CPU stand-in for ``CudaGraphs``, on ``HostGraphs``: records what happens, models a caching
    pool, can fail captures.

    ``corrupt_captures`` captures end without an error but record a graph that computes something
    else (HIP before ROCm 7.14 could swallow a capture error). A capture into a pool whose graphs
    were all retired fails, as torch >= 2.11's does (its pinned-host pool died with the last graph).
    ``pool_bytes_offset`` makes this process's allocator report every pool that much larger (ranks
    whose allocators disagree). ``fail_warm_ups``, ``fail_captures`` and ``fail_replays`` fail that many
    before they run anything; ``fail_later_replays`` fails that many replays of graphs replayed before
    (a serving replay, not a new graph's check).
    """

    fail_warm_ups: int = 0
    fail_captures: int = 0
    fail_replays: int = 0
    fail_later_replays: int = 0
    fail_retires: int = 0
    corrupt_captures: int = 0
    scratch_bytes_per_token: int = 0  # intermediates a capture needs beside its output
    segment_bytes: int = 1  # pools grow in whole segments of this size
    pool_bytes_offset: int = 0
    total_memory_bytes: int = 64 << 30
    events: list[str] = field(default_factory=list)
    caller_stream: str = "caller-stream"  # what current_stream answers: set it to switch the caller's
    capture_pools: list[_StandInPool] = field(default_factory=list)
    warm_up_pools: list[_StandInPool] = field(default_factory=list)
    releases: int = 0
    retired: int = 0

    def total_memory(self, device: torch.device) -> int:
        return self.total_memory_bytes

    def new_pool(self, device: torch.device) -> _StandInPool:
        return _StandInPool()

    def new_stream(self, device: torch.device) -> str:
        return "runner-stream"

    def current_stream(self, device: torch.device) -> str:
        return self.caller_stream

    def mark(self, stream: str, marker: object) -> str:
        self.events.append(f"mark {stream}")
        return f"marker on {stream}"

    def follow(self, stream: str, marker: str) -> None:
        self.events.append(f"{stream} waits for {marker}")

    @contextmanager
    def on_stream(self, stream: str) -> Iterator[None]:
        assert stream == "runner-stream"
        self.events.append("enter")
        yield
        self.events.append("exit")

    def warm_up(self, fn, pool: _StandInPool, stream) -> torch.Tensor:
        assert stream == "runner-stream"
        self.events.append("warm_up")
        if self.fail_warm_ups:
            self.fail_warm_ups -= 1
            raise RuntimeError("stand-in: the warm-up failed")
        self.warm_up_pools.append(pool)
        output = fn()
        # Allocated in the pool and freed before the capture: the pool keeps its peak reserved.
        self._grow(pool, output.nbytes + self.scratch_bytes_per_token * output.shape[0])
        return output

    def capture(self, fn, pool: _StandInPool, stream):
        assert stream == "runner-stream"
        self.events.append("capture")
        self.capture_pools.append(pool)
        if pool.captured_graphs and not pool.live_graphs:
            raise RuntimeError("stand-in: it->second->use_count > 0 INTERNAL ASSERT FAILED (CachingHostAllocator.h)")
        if self.fail_captures:
            self.fail_captures -= 1
            raise torch.OutOfMemoryError("stand-in: out of memory during capture")
        _CAPTURING.active, _CAPTURING.slots, slots = True, [], []
        try:
            output = fn()  # the runner's staging: only the forward's own result and scratch are in the pool
        finally:
            _CAPTURING.active, slots, _CAPTURING.slots = False, _CAPTURING.slots, None
        tokens = output.shape[0]
        self._grow(pool, output.nbytes + self.scratch_bytes_per_token * tokens)
        pool.live_graphs += 1
        pool.captured_graphs += 1
        corrupt = self.corrupt_captures > 0
        self.corrupt_captures -= corrupt
        return _StandInGraph(fn, output, tokens, pool, corrupt, slots=slots), output

    def _grow(self, pool: _StandInPool, need: int) -> None:
        """Reserve ``need`` bytes in whole segments, unless the pool already holds them."""
        if need > pool.reserved_bytes:
            pool.reserved_bytes = -(-need // self.segment_bytes) * self.segment_bytes

    def replay(self, graph: _StandInGraph) -> None:
        self.events.append("replay")
        graph.replays += 1
        if self.fail_later_replays and graph.replays > 1:
            self.fail_later_replays -= 1
            raise RuntimeError("stand-in: a later replay failed")
        if self.fail_replays:
            self.fail_replays -= 1
            raise RuntimeError("stand-in: the replay failed")
        _CAPTURING.slots = iter(graph.slots)
        try:
            graph.output.copy_(graph.fn() + 1 if graph.corrupt else graph.fn())
        finally:
            _CAPTURING.slots = None

    def retire(self, graph: _StandInGraph) -> None:
        if self.fail_retires:
            self.fail_retires -= 1
            raise RuntimeError("stand-in: the graph could not be reset")
        self.retired += 1
        graph.pool.live_graphs -= 1

    def pool_bytes(self, pool: _StandInPool, device) -> int:
        return pool.reserved_bytes + self.pool_bytes_offset if pool.reserved_bytes else 0

    def release_pools(self, pools: list[_StandInPool], device) -> None:
        assert all(pool.live_graphs == 0 for pool in pools), "a pool released under a live graph"
        self.releases += 1
        for pool in pools:
            pool.reserved_bytes = 0


HIDDEN = 8


def _toy_forward_blocks(x: torch.Tensor, attn_args: dict, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Depends on every input and on the segment boundaries, like real attention does."""
    seq_lens = attn_args["full"].seq_lens
    segment_sums = torch.cat([part.sum(0, keepdim=True).expand_as(part) for part in x.split(list(seq_lens))])
    return x * cos[:, :HIDDEN] + segment_sums + sin[:, :HIDDEN]


def _launches_taking(milliseconds: float) -> Any:
    """A host clock under which every eager run takes ``milliseconds`` (read once before, once after)."""
    ticks = itertools.count()
    return lambda: next(ticks) * milliseconds / 1e3


def _runner(**kwargs: Any) -> tuple[ViTGraphRunner, StandInGraphs]:
    """A runner of the toy blocks; ``kwargs``: ``RunnerOptions`` fields (``min_hits`` 1 unless given)
    and the runner's own keywords."""
    mechanism = kwargs.pop("mechanism", None) or StandInGraphs()
    own = {name: kwargs.pop(name) for name in ("clock", "agree_max", "prepare_capture") if name in kwargs}
    options = RunnerOptions(**{"min_hits": 1, **kwargs})
    runner = ViTGraphRunner(_toy_forward_blocks, get_backend("sdpa").layout_args, options, mechanism=mechanism, **own)
    return runner, mechanism


def _inputs(layout: AttentionLayout, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    n = layout.num_patches
    return (
        torch.randn(n, HIDDEN, generator=generator),
        torch.randn(n, HIDDEN, generator=generator),
        torch.randn(n, HIDDEN, generator=generator),
    )


def _eager(layout: AttentionLayout, x, cos, sin) -> torch.Tensor:
    return _toy_forward_blocks(x, {"full": SegmentLengths(layout.segmentations["full"].seq_lens)}, cos, sin)


def _layout(*grid: tuple[int, int, int]) -> AttentionLayout:
    return VisionLayout.from_grid_thw(list(grid)).attention


def _with_layout(layout: AttentionLayout, generator: torch.Generator) -> tuple:
    x, cos, sin = _inputs(layout, generator)
    return x, layout, cos, sin


def _run_checked(runner: ViTGraphRunner, layout: AttentionLayout, generator: torch.Generator) -> None:
    x, cos, sin = _inputs(layout, generator)
    assert torch.equal(runner.run(x, layout, cos, sin), _eager(layout, x, cos, sin))


def test_replay_matches_eager_and_reads_new_inputs(generator: torch.Generator) -> None:
    runner, mechanism = _runner()
    layout = _layout((1, 4, 4), (1, 2, 6))
    for _ in range(3):
        _run_checked(runner, layout, generator)
    # Capture runs inside on_stream on the runner's stream (after the caller's work, before its later
    # work); replays run on the caller's stream, which waits for the runner's stream once, and each
    # device step leaves a marker behind it.
    assert mechanism.events == [
        "enter", "warm_up", "capture", "mark runner-stream", "exit",
        "caller-stream waits for marker on runner-stream", "replay", "mark caller-stream",
        *["replay", "mark caller-stream"] * 2,
    ]  # fmt: skip
    assert (runner.stats()["captures"], runner.stats()["replays"]) == (1, 3)


def test_a_caller_on_another_stream_waits_for_the_runners_last_work(generator: torch.Generator) -> None:
    """Staging and pool are shared: replays from two streams must not overlap on the device."""
    runner, mechanism = _runner()
    layout = _layout((1, 4, 4))
    _run_checked(runner, layout, generator)  # capture and first replay on "caller-stream"
    mechanism.events.clear()
    for stream in ("stream-b", "stream-b", "caller-stream"):
        mechanism.caller_stream = stream
        _run_checked(runner, layout, generator)
    assert mechanism.events == [
        "stream-b waits for marker on caller-stream", "replay", "mark stream-b",
        "replay", "mark stream-b",  # the same stream: ordered by the stream itself
        "caller-stream waits for marker on stream-b", "replay", "mark caller-stream",
    ]  # fmt: skip


def test_a_capture_waits_for_replays_on_other_streams_and_leaves_a_marker(generator: torch.Generator) -> None:
    """Capture writes staging on the runner's stream; a failed one too, so both leave a marker."""
    runner, mechanism = _runner()
    first, failing, third = _layout((1, 4, 4)), _layout((1, 2, 6)), _layout((1, 6, 6))
    _run_checked(runner, first, generator)
    mechanism.events.clear()
    mechanism.fail_captures = 1
    _run_checked(runner, failing, generator)  # fails, served eagerly on the caller's stream
    _run_checked(runner, third, generator)
    assert mechanism.events == [
        "enter", "runner-stream waits for marker on caller-stream", "warm_up", "capture", "mark runner-stream",
        "enter", "warm_up", "capture", "mark runner-stream", "exit",
        "caller-stream waits for marker on runner-stream", "replay", "mark caller-stream",
    ]  # fmt: skip
    # Each warm-up allocates in the pool its capture goes to: the failed one's, then a fresh one.
    assert mechanism.warm_up_pools == mechanism.capture_pools
    assert mechanism.warm_up_pools[1] is not mechanism.warm_up_pools[2]


def test_equal_token_counts_with_other_boundaries_get_their_own_graph(generator: torch.Generator) -> None:
    runner, _ = _runner()
    first = _layout((1, 4, 4), (1, 2, 2))  # 16 + 4 patches
    second = _layout((1, 2, 2), (1, 4, 4))  # 4 + 16 patches
    assert first.num_patches == second.num_patches
    assert first.graph_key != second.graph_key
    for layout in (first, second, first, second):
        _run_checked(runner, layout, generator)
    assert runner.stats()["graphs"] == 2


def test_replay_output_survives_other_graphs(generator: torch.Generator) -> None:
    runner, _ = _runner()
    layout_a, layout_b = _layout((1, 2, 4)), _layout((1, 4, 2))
    x, cos, sin = _inputs(layout_a, generator)
    kept = runner.run(x, layout_a, cos, sin)
    expected = kept.clone()
    for layout in (layout_a, layout_b, layout_a):
        runner.run(*_with_layout(layout, generator))
    assert torch.equal(kept, expected)


def _offsets_forward(x: torch.Tensor, attn_args: dict, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    offsets = attn_args["full"].cu_seqlens.tolist()  # what the "device" holds at replay time
    lengths = [end - start for start, end in itertools.pairwise(offsets)]
    return torch.cat([part.cumsum(0) for part in x.split(lengths)]) * cos[:, :HIDDEN] + sin[:, :HIDDEN]


class _RecordingOffsets:
    """A varlen-style ``layout_args``: the offsets tensor itself, read when the graph runs (as a GPU
    kernel reads it); records each offsets tensor it was given."""

    def __init__(self) -> None:
        self.built_on: list[torch.Tensor] = []

    def __call__(self, layout: AttentionLayout, cu_seqlens: Mapping[str, torch.Tensor]) -> dict[str, VarlenArgs]:
        self.built_on.extend(cu_seqlens[name] for name in layout.segmentations)
        return {name: VarlenArgs(cu_seqlens[name], seg.max_seqlen) for name, seg in layout.segmentations.items()}


def test_replays_read_their_own_offsets_which_nothing_writes_after_capture(generator: torch.Generator) -> None:
    """Equal token counts, other boundaries, alternating: each replay reads its own offsets, and no
    copy lands in them between the capture and any replay (on MI355X a host-to-device copy right
    before a replay was read stale: docs/rocm.md, "Hazards")."""
    layout_args = _RecordingOffsets()
    runner = ViTGraphRunner(_offsets_forward, layout_args, RunnerOptions(min_hits=1), mechanism=StandInGraphs())
    layouts = [_layout((1, 4, 4), (1, 2, 2)), _layout((1, 2, 2), (1, 4, 4)), _layout((1, 2, 10))]
    for layout in layouts * 3 + layouts[:1] * 2:
        x, cos, sin = _inputs(layout, generator)
        expected = _offsets_forward(x, {"full": VarlenArgs(layout.cu_seqlens_tensor("cpu"), None)}, cos, sin)
        assert torch.equal(runner.run(x, layout, cos, sin), expected)
        # Written once before the warm-up read them (version 1 for a fresh tensor), never again.
        assert [offsets._version for offsets in layout_args.built_on] == [1] * len(layout_args.built_on)
    assert (runner.stats()["captures"], runner.stats()["replays"]) == (3, 11)
    graphs_offsets = {id(graph.offsets["full"]) for graph in runner._store.graphs.values()}
    assert {id(offsets) for offsets in layout_args.built_on} == graphs_offsets and len(graphs_offsets) == 3


def _free_captures() -> CostModel:
    """The default model with captures that cost nothing: every layout that saves repays one at once."""
    return CostModel(capture_ms=0.0)


def test_at_capacity_the_least_used_graph_makes_way_only_for_a_layout_called_more(
    generator: torch.Generator,
) -> None:
    """One-offs must not flush graphs that are used (W-TinyLFU's admission, in front of the LRU)."""
    runner, _ = _runner(capacity=2, cost_model=_free_captures(), clock=_launches_taking(10.0))
    a, b, c, d = (_layout((1, 2, 2 * i)) for i in range(1, 5))
    for layout in (a, b, a, c):  # c called once, as often as b, the least used: eager
        _run_checked(runner, layout, generator)
    stats = runner.stats()
    assert (stats["graphs"], stats["captures"], stats["evictions"], stats["eager_runs"]["over_capacity"]) == (
        2,
        2,
        0,
        1,
    )
    _run_checked(runner, c, generator)  # called twice now, more than b: b evicted, c captured
    assert (runner.stats()["captures"], runner.stats()["evictions"]) == (3, 1)
    _run_checked(runner, a, generator)  # a, called most, is still held: a replay
    assert runner.stats()["captures"] == 3
    for _ in range(2):
        _run_checked(runner, d, generator)  # twice, as often as c: c, the least used, stays
    _run_checked(runner, b, generator)  # b's count went with its graph: one call now
    assert (runner.stats()["captures"], runner.stats()["eager_runs"]["over_capacity"]) == (3, 4)


def test_call_counts_age_so_that_old_popularity_fades(generator: torch.Generator) -> None:
    runner, _ = _runner(capacity=1, cost_model=_free_captures(), clock=_launches_taking(10.0))
    old, new = _layout((1, 2, 2)), _layout((1, 2, 4))
    for _ in range(20):
        _run_checked(runner, old, generator)  # counted 20, halved at the 16th call (16 per graph): 12
    for _ in range(12):
        _run_checked(runner, new, generator)  # the 32nd call halves both: old 6, new 5 + 1 = 6, not more
    assert runner.stats()["captures"] == 1
    _run_checked(runner, new, generator)  # 7 calls now outnumber old's 6
    assert (runner.stats()["captures"], runner.stats()["evictions"]) == (2, 1)


def test_capacity_zero_never_captures(generator: torch.Generator) -> None:
    runner, mechanism = _runner(capacity=0)
    runner.run(*_with_layout(_layout((1, 2, 2)), generator))
    assert mechanism.events == []
    assert runner.stats()["eager_runs"]["over_capacity"] == 1


def test_min_hits_keeps_one_off_layouts_out(generator: torch.Generator) -> None:
    runner, _ = _runner(min_hits=2)
    hot = _layout((1, 2, 4))
    for index in range(10):
        _run_checked(runner, _layout((1, 2, 6 + 2 * index)), generator)  # each seen once
        _run_checked(runner, hot, generator)
    stats = runner.stats()
    assert (stats["graphs"], stats["captures"], stats["replays"]) == (1, 1, 9)
    assert stats["eager_runs"]["below_min_hits"] == 11


def test_cache_filled_by_one_off_layouts_recovers_when_traffic_changes(generator: torch.Generator) -> None:
    runner, _ = _runner(capacity=4, min_hits=1)
    for index in range(4):
        _run_checked(runner, _layout((1, 2, 2 + 2 * index)), generator)
    hot = [_layout((1, 2, 10 + 2 * index)) for index in range(3)]  # token counts none of the one-offs has
    for _ in range(5):
        for layout in hot:
            _run_checked(runner, layout, generator)
    stats = runner.stats()
    assert stats["graphs"] == 4 and stats["evictions"] == 3
    assert stats["replays"] == 4 + 15  # every hot call after the first replays
    assert {layout.graph_key for layout in hot} <= {key[0] for key in runner._store.graphs}


def test_max_tokens_runs_large_layouts_eagerly(generator: torch.Generator) -> None:
    runner, _ = _runner(max_tokens=16)
    runner.run(*_with_layout(_layout((1, 4, 4)), generator))
    runner.run(*_with_layout(_layout((1, 4, 6)), generator))
    stats = runner.stats()
    assert stats["graphs"] == 1
    assert stats["eager_runs"]["over_max_tokens"] == 1


def test_a_loose_bound_from_a_small_capture_does_not_refuse_a_larger_layout(generator: torch.Generator) -> None:
    """A 4-token capture that grew the pool by a whole 4 KiB segment bounds scratch at ~1 KiB per
    token; carried to 40 tokens that is over the budget, but 40 tokens really need 4 KiB."""
    mechanism = StandInGraphs(scratch_bytes_per_token=64, segment_bytes=4 << 10)
    runner, _ = _runner(mechanism=mechanism, max_tokens=64, budget_bytes=16 << 10)
    for layout in (_layout((1, 2, 2)), _layout((1, 4, 10)), _layout((1, 4, 10))):
        _run_checked(runner, layout, generator)
    stats = runner.stats()
    assert (stats["captures"], stats["replays"], stats["eager_runs"]["over_budget"]) == (2, 3, 0)


def test_scratch_bounds_use_a_larger_capture_and_scale_the_tightest_rate_past_the_largest() -> None:
    bounds = ScratchBounds()
    assert bounds.bound(4) is None
    bounds.observe(4, 100)
    bounds.observe(8, 150)
    bounds.observe(6, 200)  # 8 tokens needed less: nothing learned
    bounds.observe(2, 500)  # likewise
    assert [bounds.bound(tokens) for tokens in (1, 4, 5, 8)] == [100, 100, 150, 150]
    assert bounds.bound(16) == 300  # 150 / 8 tokens, the lowest rate, times 16
    bounds.observe(8, 120)
    bounds.observe(3, 40)
    assert [bounds.bound(tokens) for tokens in (3, 4, 8, 16)] == [40, 100, 120, 214]  # ceil(16 * 40 / 3)


def test_failed_capture_is_remembered_served_eagerly_and_runner_keeps_working(
    generator: torch.Generator, caplog: pytest.LogCaptureFixture
) -> None:
    runner, mechanism = _runner(mechanism=StandInGraphs(fail_captures=1))
    bad, good = _layout((1, 2, 6)), _layout((1, 4, 4))
    for layout in (bad, bad, good, good):
        _run_checked(runner, layout, generator)
    stats = runner.stats()
    assert stats["eager_runs"]["capture_failed"] == 2
    assert (stats["graphs"], stats["failed_layouts"], stats["replays"]) == (1, 1, 2)
    assert mechanism.events.count("capture") == 2  # the failed layout is not captured again
    # The capture after a failure goes to a fresh pool: the failed one may be left mid-capture.
    assert mechanism.capture_pools[0] is not mechanism.capture_pools[1]
    assert "is not used (capture_failed: OutOfMemoryError" in caplog.text


def test_a_failure_while_making_room_drops_every_graph_and_serves_the_call(generator: torch.Generator) -> None:
    """Graphs were evicted before the error on this rank alone: every rank (here one) starts again
    from none, so the ranks' graphs never differ; the call is served eagerly, the runner goes on."""
    runner, mechanism = _runner(mechanism=StandInGraphs(), capacity=2)
    first, second, third = _layout((1, 2, 6)), _layout((1, 4, 4)), _layout((1, 2, 4))
    _run_checked(runner, first, generator)  # captured
    _run_checked(runner, second, generator)  # captured
    mechanism.fail_retires = 1  # evicting one of them for the third layout fails
    _run_checked(runner, third, generator)
    stats = runner.stats()
    assert (stats["graphs"], stats["pool_releases"], stats["eager_runs"]["capture_failed"]) == (0, 1, 1)
    _run_checked(runner, first, generator)  # captured again
    assert runner.stats()["graphs"] == 1


def test_a_capture_whose_first_replay_differs_from_its_warm_up_is_never_used(
    generator: torch.Generator, caplog: pytest.LogCaptureFixture
) -> None:
    """A capture that ends without an error can still record a wrong graph (HIP before ROCm 7.14
    swallowed some capture errors): its first replay is compared with the warm-up, bit for bit."""
    runner, mechanism = _runner(mechanism=StandInGraphs(corrupt_captures=1))
    broken, good = _layout((1, 2, 6)), _layout((1, 4, 4))
    for layout in (broken, broken, good, good, broken):
        _run_checked(runner, layout, generator)  # every output equals eager
    stats = runner.stats()
    assert stats["eager_runs"]["capture_unverified"] == 3
    # Replays count the calls a replay served: not the broken graph's check.
    assert (stats["graphs"], stats["failed_layouts"], stats["captures"], stats["replays"]) == (1, 1, 2, 2)
    assert mechanism.events.count("capture") == 2  # the broken layout is not captured again
    assert mechanism.events.count("replay") == 3
    assert caplog.text.count("capture_unverified") == 1
    assert stats["verify_seconds"] > 0


def _failing_forward(x: torch.Tensor, attn_args: dict, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    if x.isnan().any():
        raise RuntimeError("stand-in: the model rejects this input")
    return _toy_forward_blocks(x, attn_args, cos, sin)


def _adding_into_its_input(x: torch.Tensor, attn_args: dict, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """As SGLang's blocks do: the block's output added into its input, in place."""
    return x.add_(_toy_forward_blocks(x, attn_args, cos, sin))


def test_the_callers_input_is_never_written_eagerly_in_a_capture_after_a_failure_or_replayed(
    generator: torch.Generator,
) -> None:
    """``forward_blocks`` that write their input in place never write the caller's ``x``, on any path:
    a caller's fallback after a failure (the SGLang adapter's eager blocks) starts from its input."""
    mechanism = StandInGraphs(fail_captures=1)
    runner = ViTGraphRunner(_adding_into_its_input, get_backend("sdpa").layout_args, mechanism=mechanism)
    failing, captured = _layout((1, 2, 6)), _layout((1, 4, 4))
    for layout in (failing, failing, captured, captured, captured):  # eager, failed capture; eager, capture, replay
        x, cos, sin = _inputs(layout, generator)
        given = x.clone()
        out = runner.run(x, layout, cos, sin)
        assert torch.equal(x, given)
        assert torch.equal(
            out,
            _adding_into_its_input(
                given.clone(), {"full": SegmentLengths(layout.segmentations["full"].seq_lens)}, cos, sin
            ),
        )
    counters = runner.counters()
    assert (counters["capture_failed"], counters["below_min_hits"], counters["captures"], counters["replays"]) == (
        1,
        2,
        1,
        2,
    )


def test_input_that_fails_eagerly_too_raises_and_marks_nothing(generator: torch.Generator) -> None:
    runner = ViTGraphRunner(
        _failing_forward, get_backend("sdpa").layout_args, RunnerOptions(min_hits=1), mechanism=StandInGraphs()
    )
    layout = _layout((1, 2, 4))
    x, cos, sin = _inputs(layout, generator)
    with pytest.raises(RuntimeError, match="rejects this input"):
        runner.run(x.fill_(float("nan")), layout, cos, sin)
    assert runner.stats()["failed_layouts"] == 0
    _run_checked(runner, layout, generator)  # the same layout with good input is captured and replays
    assert (runner.stats()["captures"], runner.stats()["replays"]) == (1, 1)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("rows", "x has 5 rows but the layout describes 4 patches"),
        ("cos_rows", "cos has 3 rows but the layout describes 4 patches"),
        ("device", "inputs\\[0\\] is on meta, x on cpu"),
    ],
)
def test_bad_input_raises_before_anything_runs(generator: torch.Generator, change: str, message: str) -> None:
    runner, mechanism = _runner()
    layout = _layout((1, 2, 2))
    x, cos, sin = _inputs(layout, generator)
    extra: tuple = ()
    if change == "rows":
        x = torch.randn(5, HIDDEN, generator=generator)
    elif change == "cos_rows":
        cos = cos[:3]
    else:
        extra = (torch.empty(4, 1, device="meta"),)
    before = runner.stats()
    with pytest.raises(ValueError, match=message):
        runner.run(x, layout, cos, sin, *extra)
    assert runner.stats() == before and mechanism.events == [] and not runner._admission._hits


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"capacity": -1}, "capacity = -1"),
        ({"min_hits": 0}, "min_hits = 0"),
        ({"max_tokens": -1}, "max_tokens = -1"),
        ({"max_tokens": None}, "max_tokens = None"),
        ({"budget_bytes": -1}, "budget_bytes = -1"),
    ],
)
def test_invalid_options_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _runner(**kwargs)


def test_concurrent_callers_are_serialised(generator: torch.Generator) -> None:
    runner, _ = _runner(capacity=3)
    layouts = [_layout((1, 2, 2 * i)) for i in range(1, 7)]
    jobs = [(layout, *_inputs(layout, generator)) for layout in layouts * 4]
    errors: list[str] = []

    def worker(chunk: list) -> None:
        for layout, x, cos, sin in chunk:
            if not torch.equal(runner.run(x, layout, cos, sin), _eager(layout, x, cos, sin)):
                errors.append(f"mismatch for {layout.graph_key}")

    threads = [threading.Thread(target=worker, args=(jobs[i::4],)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    stats = runner.stats()
    assert stats["graphs"] == 3
    assert stats["replays"] + sum(stats["eager_runs"].values()) == len(jobs)


def test_real_mechanism_on_cpu_runs_eagerly_with_reason(generator: torch.Generator) -> None:
    runner = ViTGraphRunner(_toy_forward_blocks, get_backend("sdpa").layout_args, mechanism=CudaGraphs())
    layout = _layout((1, 2, 4))
    _run_checked(runner, layout, generator)
    assert runner.stats()["eager_runs"]["no_gpu"] == 1
    assert runner.stats()["bytes_held"] == 0


# Per tower: layouts in call order, the graphs they need and the segmentations each graph holds. A
# repeat replays; so does a layout whose attention metadata equals an earlier one's but whose
# positions (Qwen3-VL) or window order (Qwen2.5-VL) differ: those reach the graph as per-call inputs.
TOWER_CASES = {
    "tiny": ([[(1, 4, 6)], [(1, 2, 2), (2, 4, 4)], [(1, 4, 6)], [(1, 6, 4)]], 2, ["full"]),
    # Partial windows, a video, a repeat, the transposed grid (other windows, other graph), then two
    # grids with equal windows in another order (one graph).
    "qwen2.5-vl-tiny": (
        [[(1, 12, 20)], [(1, 2, 2), (2, 10, 14)], [(1, 12, 20)], [(1, 20, 12)], [(1, 8, 16)], [(1, 16, 8)]],
        4,
        ["full", "window"],
    ),
}


@pytest.mark.parametrize("name", list(TOWER_CASES))
@torch.no_grad()
def test_tower_with_graphs_equals_eager_bitwise(name: str, generator: torch.Generator) -> None:
    grids, graphs, segmentations = TOWER_CASES[name]
    config = preset(name)
    tower = tower_class(config)(config, attention_backend="sdpa").eval()
    width = config.in_channels * config.temporal_patch_size * config.patch_size**2
    pixels = [torch.randn(sum(t * h * w for t, h, w in g), width, generator=generator) for g in grids]
    eager = [tower(p, g) for p, g in zip(pixels, grids, strict=True)]
    runner = tower.enable_graphs(capacity=8, min_hits=1, mechanism=StandInGraphs(), by_benefit=False)
    graphed = [tower(p, g) for p, g in zip(pixels, grids, strict=True)]
    tower.disable_graphs()
    assert all(torch.equal(a, b) for a, b in zip(eager, graphed, strict=True))
    assert (runner.stats()["captures"], runner.stats()["replays"]) == (graphs, len(grids))
    assert all(list(graph.offsets) == segmentations for graph in runner._store.graphs.values())


def test_immutable_inputs_are_copied_again_whenever_another_tensor_is_passed(generator: torch.Generator) -> None:
    """Two layouts share a graph but not their cos/sin (like a 16x32 and a 32x16 image): staging
    must follow the tensor passed, call after call."""
    runner, _ = _runner()
    layout = _layout((1, 4, 4))
    first, second = _inputs(layout, generator)[1:], _inputs(layout, generator)[1:]
    for cos, sin in (first, second, first, first, second):
        x = torch.randn(layout.num_patches, HIDDEN, generator=generator)
        out = runner.run(x, layout, cos, sin, immutable=True)
        assert torch.equal(out, _eager(layout, x, cos, sin))
    assert runner.stats()["graphs"] == 1


def test_immutable_inputs_passed_again_are_not_copied_but_x_always_is(generator: torch.Generator) -> None:
    """What the promise buys: staging keeps the copy of the very tensor passed before. Writing to
    it afterwards breaks the promise, and the replay shows the copy was skipped; x is always read."""
    layout = _layout((1, 4, 4))
    for immutable in (False, True):
        runner, _ = _runner()
        x, cos, sin = _inputs(layout, generator)
        runner.run(x, layout, cos, sin, immutable=immutable)
        original_cos = cos.clone()
        cos.add_(1.0)
        x.mul_(2.0)
        out = runner.run(x, layout, cos, sin, immutable=immutable)
        expected_cos = original_cos if immutable else cos
        assert torch.equal(out, _eager(layout, x, expected_cos, sin)), immutable


def test_tower_layouts_sharing_a_graph_differ_in_their_embedding_inputs() -> None:
    """The premise of TOWER_CASES' shared graphs: equal keys, other per-call embedding inputs."""
    for name, (first, second) in {"tiny": ((1, 4, 6), (1, 6, 4)), "qwen2.5-vl-tiny": ((1, 8, 16), (1, 16, 8))}.items():
        config = preset(name)
        tower = tower_class(config)(config, attention_backend="sdpa")
        a, b = (tower._prepare([grid], grid[1] * grid[2]) for grid in (first, second))
        assert a.layout.graph_key == b.layout.graph_key, name
        assert len(a.embed_inputs) == len(b.embed_inputs) > 0, name
        assert any(not torch.equal(x, y) for x, y in zip(a.embed_inputs, b.embed_inputs, strict=True)), name


def test_other_input_dtypes_get_their_own_graph(generator: torch.Generator) -> None:
    runner, _ = _runner()
    layout = _layout((1, 2, 4))
    x, cos, _ = _inputs(layout, generator)
    for angles in (cos, cos.double(), cos):
        eager = _eager(layout, x, angles, angles)
        out = runner.run(x, layout, angles, angles)
        assert out.dtype == eager.dtype and torch.equal(out, eager)
    assert (runner.stats()["captures"], runner.stats()["replays"]) == (2, 3)


class _RecordingSdpa:
    """sdpa's ``layout_args``, recording the ``cu_seqlens`` tensor each segmentation's arguments were built on."""

    def __init__(self) -> None:
        self.built_on: list[torch.Tensor] = []
        self._sdpa = get_backend("sdpa")

    def __call__(self, layout: AttentionLayout, cu_seqlens: Mapping[str, torch.Tensor]) -> AttnArgs:
        self.built_on.extend(cu_seqlens[name] for name in layout.segmentations)
        return self._sdpa.layout_args(layout, cu_seqlens)


def _windowed_toy_forward_blocks(x: torch.Tensor, attn_args: dict, cos: torch.Tensor, sin: torch.Tensor):
    """A window "block" then a full one: the output depends on both segmentations' boundaries."""
    for name in ("window", "full"):
        seq_lens = attn_args[name].seq_lens
        x = x * cos[:, :HIDDEN] + torch.cat([part.cumsum(0) for part in x.split(list(seq_lens))]) + sin[:, :HIDDEN]
    return x


def _windowed(*grid: tuple[int, int, int]) -> AttentionLayout:
    return VisionLayout.from_grid_thw(list(grid), window_merge_blocks=4).attention


def _windowed_runner(layout_args: LayoutArgs | None = None) -> ViTGraphRunner:
    layout_args = layout_args or get_backend("sdpa").layout_args
    return ViTGraphRunner(
        _windowed_toy_forward_blocks, layout_args, RunnerOptions(min_hits=1), mechanism=StandInGraphs()
    )


def test_windowed_graph_owns_offsets_per_segmentation(generator: torch.Generator) -> None:
    layout_args = _RecordingSdpa()
    runner = _windowed_runner(layout_args)
    layout = _windowed((1, 12, 20), (1, 4, 4))
    for _ in range(2):
        x, cos, sin = _inputs(layout, generator)
        eager_args = {name: SegmentLengths(seg.seq_lens) for name, seg in layout.segmentations.items()}
        assert torch.equal(runner.run(x, layout, cos, sin), _windowed_toy_forward_blocks(x, eager_args, cos, sin))
    (graph,) = runner._store.graphs.values()
    assert list(graph.offsets) == ["full", "window"]
    # The captured arguments were built on the graph's own offsets, holding this layout's.
    assert len(layout_args.built_on) == 2
    for name, built_on in zip(("full", "window"), layout_args.built_on, strict=True):
        assert built_on.dtype == torch.int32
        assert built_on.data_ptr() == graph.offsets[name].data_ptr()
        assert built_on.tolist() == list(layout.segmentations[name].cu_seqlens)


def test_equal_token_counts_with_other_windows_get_their_own_graph(generator: torch.Generator) -> None:
    runner = _windowed_runner()
    wide, squarer = _windowed((1, 8, 24)), _windowed((1, 12, 16))
    assert wide.segmentations["full"] == squarer.segmentations["full"]
    for layout in (wide, squarer, wide, squarer):
        x, cos, sin = _inputs(layout, generator)
        eager_args = {name: SegmentLengths(seg.seq_lens) for name, seg in layout.segmentations.items()}
        assert torch.equal(runner.run(x, layout, cos, sin), _windowed_toy_forward_blocks(x, eager_args, cos, sin))
    assert (runner.stats()["graphs"], runner.stats()["replays"]) == (2, 4)


@torch.no_grad()
def test_moving_or_casting_a_tower_drops_its_graphs_and_prepared_layouts(generator: torch.Generator) -> None:
    config = preset("tiny")
    tower = tower_class(config)(config, attention_backend="sdpa").eval()
    width = config.in_channels * config.temporal_patch_size * config.patch_size**2
    grid = [(1, 4, 6)]
    pixels = torch.randn(24, width, generator=generator)
    tower.enable_graphs(mechanism=StandInGraphs())
    tower(pixels, grid)
    assert tower._layouts and tower.graph_runner is not None
    tower.double()
    # The cached fp32 cos/sin and the graphs (which read the old weights' memory) are gone; the
    # next call prepares the layout again, in the new dtype.
    assert not tower._layouts and tower.graph_runner is None
    out = tower(pixels.double(), grid)
    assert out.dtype == torch.float64
    assert tower._layouts[next(iter(tower._layouts))].cos.dtype == torch.float64


@pytest.mark.parametrize(
    ("pixels", "message"),
    [
        (torch.randn(24, 100), r"pixel_values has shape \(24, 100\); expected \[num_patches, 1536\]"),
        (torch.randint(0, 255, (24, 1536)), "pixel_values has dtype torch.int64"),
        (torch.randn(24, 1536, device="meta"), "pixel_values is on meta; the tower is on cpu"),
        (torch.randn(20, 1536), "pixel_values has 20 rows but grid_thw"),
    ],
)
def test_tower_refuses_bad_pixels_before_anything_runs(pixels: torch.Tensor, message: str) -> None:
    config = preset("tiny")
    tower = tower_class(config)(config, attention_backend="sdpa").eval()
    runner = tower.enable_graphs(min_hits=1, mechanism=StandInGraphs())
    with pytest.raises(ValueError, match=message):
        tower(pixels, [(1, 4, 6)])
    assert not tower._layouts and runner.stats()["captures"] == 0 and not runner._admission._hits


def _per_token_model() -> CostModel:
    """One block whose device time is one millisecond per token: the launch time decides. A capture
    costs 10 ms: any layout that saves repays a fifth of it (``PAYBACK_SHARE``) at its first call."""
    return CostModel(
        blocks=1, launch_ms=10.0, device_base_ms=0.0, device_ms_per_token=1.0, device_ms_per_square=0.0, capture_ms=10.0
    )


def test_a_layout_is_captured_only_where_a_replay_is_predicted_to_save_time(generator: torch.Generator) -> None:
    runner, _ = _runner(min_hits=2, cost_model=_per_token_model(), clock=_launches_taking(10.0))
    small, large = _layout((1, 2, 2)), _layout((1, 4, 6))  # 4 and 24 ms on the device against 10 to launch
    for _ in range(3):
        _run_checked(runner, small, generator)
        _run_checked(runner, large, generator)
    stats = runner.stats()
    assert (stats["captures"], stats["replays"], stats["eager_runs"]["no_saving"]) == (1, 2, 3)
    assert stats["launch_ms"] == 10.0  # the model's until enough eager runs were timed


def test_an_exact_layout_waits_until_its_calls_predicted_savings_repay_a_share_of_a_capture(
    generator: torch.Generator,
) -> None:
    """A one-off must not be captured for a sliver, nor a repeated layout be kept waiting: capture once
    ``PAYBACK_SHARE`` of a 100 ms capture (20 ms) is repaid, at 8.9 ms a call for one token (the third
    call) and 6.1 for four (the fourth)."""
    model = replace(_per_token_model(), capture_ms=100.0)
    runner, _ = _runner(min_hits=2, cost_model=model, clock=_launches_taking(10.0))
    one, four = VisionLayout.from_grid_thw([(1, 1, 1)], spatial_merge_size=1).attention, _layout((1, 2, 2))
    captures, waiting = [], []
    for _ in range(4):
        for layout in (one, four):
            _run_checked(runner, layout, generator)
            captures.append(runner.stats()["captures"])
            waiting.append(runner.stats()["eager_runs"]["below_payback"])
    assert PAYBACK_SHARE * model.capture_ms == 20.0
    assert captures == [0, 0, 0, 0, 1, 1, 1, 2]
    assert waiting == [0, 0, 1, 2, 2, 3, 3, 3]  # from each layout's second call, its min_hits met


def test_the_launch_time_is_learned_from_this_hosts_eager_runs(generator: torch.Generator) -> None:
    """Hosts launch the same tower in 9 to 15 ms: the saving is the serving host's, not the model's.
    Runs of 20 ms of device work timed at 30 ms teach the launch time under which the model's eager
    time is 30 ms, (30^3 - 20^3)^(1/3) = 26.68 ms."""
    runner, _ = _runner(min_hits=1, cost_model=_per_token_model(), clock=_launches_taking(30.0))
    large = _layout((1, 4, 6))
    for _ in range(8):  # a layout of 20 tokens saves under 5 % at 10 ms: eager, timed at 30 ms
        _run_checked(runner, _layout((1, 2, 10)), generator)
    _run_checked(runner, large, generator)  # 24 ms on the device: 1.15 x 26.68 = 30.6 eager, a fifth saved
    assert (runner.stats()["captures"], runner.stats()["launch_ms"]) == (1, 26.684)


def record_offsets_reaching_the_device(monkeypatch: pytest.MonkeyPatch, mechanism: StandInGraphs) -> None:
    """Log in ``mechanism.events`` each read of a layout's pinned host offsets or of their device copy."""
    for name in ("cu_seqlens_host", "cu_seqlens_tensor"):
        method = getattr(AttentionLayout, name)

        def spy(self: AttentionLayout, *args: Any, method: Any = method, name: str = name) -> torch.Tensor:
            mechanism.events.append(name)
            return method(self, *args)

        monkeypatch.setattr(AttentionLayout, name, spy)


def on_the_capture_stream(events: list[str]) -> list[str]:
    """The offsets reads logged between a ``mechanism.on_stream``'s enter and exit."""
    inside, seen = False, []
    for event in events:
        inside = event == "enter" or (inside and event != "exit")
        if inside and event.startswith("cu_seqlens"):
            seen.append(event)
    return seen


def test_a_new_graphs_offsets_reach_the_device_on_the_callers_stream(
    generator: torch.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Never on the capture stream: the host allocator records a pinned block's free on every stream
    that copied from it, and a free during a later capture records a captured event there, on which
    the next pinned allocation of any thread fails (H200: a request raised, and a capture was lost)."""
    runner, mechanism = _runner()
    record_offsets_reaching_the_device(monkeypatch, mechanism)
    for layout in (_layout((1, 2, 4)), _layout((1, 4, 4), (1, 2, 2))):
        _run_checked(runner, layout, generator)
    assert mechanism.events.count("capture") == 2
    assert "cu_seqlens_host" in mechanism.events  # an exact graph's offsets come from pinned memory
    assert on_the_capture_stream(mechanism.events) == []


@pytest.mark.parametrize("defer_captures", [None, "1"])
@pytest.mark.parametrize("mode", ["inference_mode", "no_grad"])
def test_a_tower_captures_in_its_callers_thread_and_grad_mode(
    mode: str, defer_captures: str | None, generator: torch.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Captures run inside the call that triggers them, on its thread, in its grad mode (a capture in
    another mode failed on a tower called under inference_mode: in-place writes to views of inference
    tensors); every graph verified. ``SGLANG_VIT_CUDA_GRAPH_DEFER_CAPTURES=1``, which once moved
    captures to a thread of the runner's own, changes none of it. A padded tower: tests/test_padding.py."""
    if defer_captures is not None:
        monkeypatch.setenv("SGLANG_VIT_CUDA_GRAPH_DEFER_CAPTURES", defer_captures)
    config = preset("tiny")
    tower = tower_class(config)(config, attention_backend="sdpa").eval()
    width = config.in_channels * config.temporal_patch_size * config.patch_size**2
    grid = [(1, 4, 6), (1, 2, 4)]
    pixels = torch.randn(32, width, generator=generator)
    mechanism = StandInGraphs()
    seen: list[tuple[str, str, bool, bool]] = []  # (step, thread, inference mode, grad) at each warm-up and capture

    def recording(step: str, run: Callable) -> Callable:
        def recorded(*args: Any) -> Any:
            mode_now = (torch.is_inference_mode_enabled(), torch.is_grad_enabled())
            seen.append((step, threading.current_thread().name, *mode_now))
            return run(*args)

        return recorded

    for step in ("warm_up", "capture"):
        setattr(mechanism, step, recording(step, getattr(mechanism, step)))
    runner = tower.enable_graphs(mechanism=mechanism)  # the serving defaults
    with torch.inference_mode() if mode == "inference_mode" else torch.no_grad():
        expected = tower(pixels, grid, use_graphs=False)
        for _ in range(3):  # eager; captured in the call whose savings repay a capture; replayed
            assert torch.equal(tower(pixels, grid), expected)
    stats = runner.stats()
    assert stats["captures"] == 1 and stats["replays"] >= 1
    assert stats["eager_runs"]["capture_failed"] == stats["eager_runs"]["capture_unverified"] == 0
    caller = threading.current_thread().name
    assert seen == [
        ("warm_up", caller, mode == "inference_mode", False),
        ("capture", caller, mode == "inference_mode", False),
    ]


def test_the_launch_time_is_agreed_across_ranks_now_and_then_not_on_every_call(generator: torch.Generator) -> None:
    """A collective per admission would cost every eager call; stats() must never run one (a rank
    that logs alone would wait for the others forever)."""
    calls: list[list[int]] = []

    def agree_max(values: list[int]) -> list[int]:
        calls.append(list(values))
        return list(values)

    model, clock = _per_token_model(), _launches_taking(20.0)
    runner, _ = _runner(min_hits=100, cost_model=model, clock=clock, agree_max=agree_max)
    for _ in range(40):  # 12 tokens, launch-bound at 20 ms: (20^3 - 12^3)^(1/3) = 18.442; never captured
        _run_checked(runner, _layout((1, 2, 6)), generator)
    launch_agreements = [values for values in calls if values == [18_442]]
    assert len(launch_agreements) == 2  # at the admission that finds 8 samples, then 24
    before = len(calls)
    assert runner.stats()["launch_ms"] == 18.442 and len(calls) == before


def _launches_in(milliseconds: list[float]) -> Any:
    """A host clock under which the eager runs take ``milliseconds`` in turn, round and round."""
    ends = itertools.accumulate(itertools.cycle(milliseconds))
    reads = itertools.chain.from_iterable(
        (end - duration, end) for end, duration in zip(ends, itertools.cycle(milliseconds))
    )
    return lambda: next(reads) / 1e3


def test_slow_runs_of_a_device_bound_layout_do_not_teach_the_launch_time(generator: torch.Generator) -> None:
    """Seen on the H200: 1 x 1.3 MP, 19.7 ms predicted on the device, ran in 18.4 ms, and the runs
    noise made slower than 19.7 / 0.9 taught a launch time of 23.8 ms. Judged by the layout's
    typical run, none teaches; a layout whose typical run is launch-bound (6 x 640x360: 11.6 ms
    predicted, 13.6 on the host) teaches from its third run on: 13.6 / 1.148 = 11.85 ms, as its
    device time is past 0.8 of that, where the model's eager time is 1.148 times the launch time."""
    runner, _ = _runner(min_hits=100, cost_model=_per_token_model(), clock=_launches_in([18.0, 18.0, 18.0, 24.0]))
    device_bound = _layout((1, 2, 10))  # 20 ms on the device
    for _ in range(16):
        _run_checked(runner, device_bound, generator)
    runner._admission.launch_ms()
    assert runner.stats()["launch_ms"] == 10.0  # the model's: nothing launch-bound was timed
    runner._clock = _launches_in([13.6])
    close = _layout((1, 2, 6))  # 12 ms on the device
    for _ in range(18):
        _run_checked(runner, close, generator)
    runner._admission.launch_ms()
    assert runner.stats()["launch_ms"] == 11.849


def test_device_bound_eager_runs_do_not_teach_the_launch_time(generator: torch.Generator) -> None:
    """A device-bound call's host time is its device time (the host waits for the launch queue): 30
    token layouts (30 ms on the device) timed at 30 ms must not raise the launch time admission uses;
    4 token ones timed at 12 ms do teach it: (12^3 - 4^3)^(1/3) = 11.85 ms."""
    runner, _ = _runner(min_hits=100, cost_model=_per_token_model(), clock=_launches_taking(30.0))
    for index in range(16):
        _run_checked(runner, _layout((1, 2, 14), (1, 2, 2 * index + 2)), generator)  # 32 or more tokens
    runner._admission.launch_ms()
    assert runner.stats()["launch_ms"] == 10.0  # the model's: nothing launch-bound was timed
    runner._clock = _launches_taking(12.0)
    for _ in range(16):
        _run_checked(runner, _layout((1, 2, 2)), generator)
    runner._admission.launch_ms()
    assert runner.stats()["launch_ms"] == 11.85


class _RecordingCUDAGraph:
    """``torch.cuda.CUDAGraph`` without a GPU: the capture's begin and end only."""

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        pass

    def capture_end(self) -> None:
        pass


@pytest.mark.parametrize("enabled_before", [True, False])
def test_no_cyclic_collection_runs_inside_a_capture(monkeypatch: pytest.MonkeyPatch, enabled_before: bool) -> None:
    """A collection on the capturing thread that destroys a graph (a dropped tower's) invalidates the
    capture: the collector is off while ``fn`` is captured, and as the caller had it afterwards."""
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _RecordingCUDAGraph)
    seen = []

    def fn() -> torch.Tensor:
        seen.append(gc.isenabled())
        return torch.zeros(1)

    (gc.enable if enabled_before else gc.disable)()
    try:
        CudaGraphs().capture(fn, pool=(0, 1), stream=None)
        after = gc.isenabled()
    finally:
        gc.enable()
    assert seen == [False]
    assert after == enabled_before


def test_the_collector_stays_off_until_the_last_of_overlapping_captures_ends() -> None:
    """Two threads may capture at once, each through its own runner: the first to end must not turn
    the collector back on under the other."""
    from rocm_vit.graphs.torch_graphs import _no_cyclic_collection

    first_in, second_done = threading.Event(), threading.Event()
    seen = []

    def first() -> None:
        with _no_cyclic_collection():
            first_in.set()
            second_done.wait(10)
            seen.append(gc.isenabled())

    thread = threading.Thread(target=first)
    thread.start()
    assert first_in.wait(10)
    with _no_cyclic_collection():
        pass
    seen.append(gc.isenabled())
    second_done.set()
    thread.join(10)
    assert seen == [False, False]
    assert gc.isenabled()


def test_a_tower_takes_its_runner_options_from_the_builder_the_sglang_adapter_uses(monkeypatch) -> None:
    """``VisionTower.enable_graphs`` and the adapter build their options in one place
    (``rocm_vit.policy.runner_options``): the SGLANG_VIT_CUDA_GRAPH_* limits reach a tower too, and
    arguments given to ``enable_graphs`` win."""
    from rocm_vit.workloads.workload import build_tower

    monkeypatch.setenv("SGLANG_VIT_CUDA_GRAPH_CACHE_CAPACITY", "5")
    monkeypatch.setenv("SGLANG_VIT_CUDA_GRAPH_MIN_HITS", "3")
    monkeypatch.setenv("SGLANG_VIT_CUDA_GRAPH_MEMORY_BUDGET_MB", "64")
    tower = build_tower("tiny", torch.device("cpu"), torch.float32, None, seed=0)
    runner = tower.enable_graphs()
    assert (runner.capacity, runner.min_hits, runner.stats()["budget_bytes"]) == (5, 3, 64 << 20)
    runner = tower.enable_graphs(capacity=9, max_tokens=512)
    assert (runner.capacity, runner.min_hits, runner.max_tokens) == (9, 3, 512)
