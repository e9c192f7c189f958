"""The graphs a runner holds and their memory (rocm_vit/graphs/store.py, staging.py), through the
runner on a CPU stand-in: one staging set that never grows, one pool as large as the largest capture,
the byte budget (refusal only by measurement), eviction and release, bytes counted from snapshots."""

from __future__ import annotations

import random
from fractions import Fraction
from typing import Any

import pytest
import torch
from test_graph_runner import (
    HIDDEN,
    StandInGraphs,
    _eager,
    _inputs,
    _layout,
    _run_checked,
    _runner,
    _toy_forward_blocks,
    _with_layout,
)

from rocm_vit.attention import SegmentLengths, get_backend
from rocm_vit.graphs import CudaGraphs, ViTGraphRunner, default_budget_bytes
from rocm_vit.graphs.options import RunnerOptions
from rocm_vit.graphs.store import Graph, GraphStore
from rocm_vit.graphs.torch_graphs import HostGraphs
from rocm_vit.layout import AttentionLayout

snapshot_calls: list[dict[str, Any]] = []  # what each stand-in snapshot was asked for


def test_all_graphs_read_one_staging_set_that_never_grows(generator: torch.Generator) -> None:
    runner, _ = _runner(max_tokens=64)
    layouts = [_layout((1, 2, 2 * i)) for i in range(1, 9)]
    staging_bytes = None
    for layout in layouts + layouts:
        _run_checked(runner, layout, generator)
        if staging_bytes is None:
            staging_bytes = runner.stats()["staging_bytes"]
        assert runner.stats()["staging_bytes"] == staging_bytes  # allocated once, at the ceiling
    (staging,) = runner._store.staging.values()
    # x, cos, sin and the output at 64 rows of 8 fp32 values; each graph holds its own offsets (one
    # segment: 2 int32).
    assert staging_bytes == 4 * 64 * HIDDEN * 4
    assert runner.stats()["offsets_bytes"] == 8 * 2 * 4
    assert all(buffer.shape[0] == 64 for buffer in (*staging.inputs, *staging.outputs.values()))
    assert (runner.stats()["captures"], runner.stats()["replays"]) == (8, 16)


def test_a_runner_that_evicts_its_pools_last_graph_still_captures_every_layout(generator: torch.Generator) -> None:
    """torch >= 2.11 fails a capture into a pool whose graphs are all gone (the stand-in does too):
    with room for one graph, every capture after the first evicts the pool's last graph."""
    runner, mechanism = _runner(capacity=1)
    layouts = [_layout((1, 2, 2 * i)) for i in range(1, 5)]
    for layout in layouts:
        for _ in range(2):
            _run_checked(runner, layout, generator)
    stats = runner.stats()
    assert (stats["captures"], stats["replays"], stats["evictions"], stats["failed_layouts"]) == (4, 8, 3, 0)
    assert len(set(map(id, mechanism.capture_pools))) == 1  # one pool throughout
    assert mechanism.retired == 3 and runner._store.pool_keeper is None  # each, once the next capture began


def test_graphs_share_one_pool_as_large_as_the_largest_capture(generator: torch.Generator) -> None:
    """Graphs hold nothing in the pool between calls: 16 graphs take the pool of the largest one."""
    mechanism = StandInGraphs(scratch_bytes_per_token=256)
    runner, _ = _runner(mechanism=mechanism, max_tokens=64, budget_bytes=28 << 10, capacity=100)
    stream = [_layout((1, 2, 2 * random.Random(seed).randint(1, 16))) for seed in range(200)]
    for layout in stream:
        _run_checked(runner, layout, generator)
        stats = runner.stats()
        assert stats["bytes_held"] <= stats["budget_bytes"] == 28 << 10
    stats = runner.stats()
    assert (stats["graphs"], stats["evictions"], stats["pool_releases"]) == (16, 0, 0)
    assert stats["pool_bytes"] == 64 * (HIDDEN * 4 + 256)  # 64 tokens: the forward's output and scratch
    assert (stats["captures"], stats["replays"]) == (16, len(stream))


def test_staging_over_the_budget_means_no_graphs(generator: torch.Generator, caplog) -> None:
    runner, mechanism = _runner(max_tokens=4096, budget_bytes=1 << 10)
    for _ in range(2):
        _run_checked(runner, _layout((1, 2, 2)), generator)
    assert mechanism.events == []
    assert runner.stats()["eager_runs"]["over_budget"] == 2
    assert runner.stats()["bytes_held"] == 0
    assert caplog.text.count("over the 0 MiB budget") == 1


def test_capture_alone_over_the_budget_releases_the_pool_and_refuses_it_and_larger_ones(
    generator: torch.Generator,
) -> None:
    mechanism = StandInGraphs(scratch_bytes_per_token=4096)
    runner, _ = _runner(mechanism=mechanism, max_tokens=64, budget_bytes=32 << 10)
    small, large, larger = _layout((1, 2, 2)), _layout((1, 4, 8)), _layout((1, 6, 6))
    for _ in range(2):
        _run_checked(runner, large, generator)  # 32 tokens x 4 KiB of intermediates: over on its own
    _run_checked(runner, larger, generator)  # more tokens: refused by that measurement, not captured
    stats = runner.stats()
    assert mechanism.releases == 1 and stats["pool_releases"] == 1
    assert (stats["graphs"], stats["bytes_held"] <= stats["budget_bytes"]) == (0, True)
    assert stats["eager_runs"]["over_budget"] == 2  # the capture measured it, then the two refusals
    assert mechanism.events.count("capture") == 1
    for _ in range(2):
        _run_checked(runner, small, generator)  # 4 tokens fit: captured in a fresh pool, replayed
    assert (runner.stats()["graphs"], runner.stats()["replays"]) == (1, 3)
    assert mechanism.capture_pools[0] is not mechanism.capture_pools[1]


def test_a_layout_bounded_over_the_budget_is_tried_alone_and_refused_only_when_measured_over(
    generator: torch.Generator,
) -> None:
    """Bounds are upper bounds: where one says a layout may not fit even alone, every graph is
    dropped with the pool to measure it; only that measurement refuses it."""
    mechanism = StandInGraphs(scratch_bytes_per_token=512)
    runner, _ = _runner(mechanism=mechanism, max_tokens=64, budget_bytes=20 << 10)
    for layout in (_layout((1, 2, 2)), _layout((1, 2, 4))):
        _run_checked(runner, layout, generator)
    large = _layout((1, 8, 8))  # 64 tokens x (512 + 32) B: over on its own
    _run_checked(runner, large, generator)
    stats = runner.stats()
    assert (stats["graphs"], stats["evictions"], stats["pool_releases"], stats["captures"]) == (0, 0, 2, 3)
    _run_checked(runner, large, generator)
    assert runner.stats()["eager_runs"]["over_budget"] == 1 and runner.stats()["captures"] == 3
    medium = _layout((1, 4, 4))  # bounded by the large one's measurement, but it fits: captured
    for _ in range(2):
        _run_checked(runner, medium, generator)
    stats = runner.stats()
    assert (stats["graphs"], stats["captures"], stats["eager_runs"]["over_budget"]) == (1, 4, 1)


def _churn(generator: torch.Generator, calls: int, seed: int) -> list[AttentionLayout]:
    """1-6 images of 2a x 2b patches (a, b in 1..8); 35 % of the calls repeat one of 20 hot layouts."""
    rng = random.Random(seed)

    def layout() -> AttentionLayout:
        return _layout(*[(1, 2 * rng.randint(1, 8), 2 * rng.randint(1, 8)) for _ in range(rng.randint(1, 6))])

    hot = [layout() for _ in range(20)]
    return [rng.choice(hot) if rng.random() < 0.35 else layout() for _ in range(calls)]


def test_churn_with_an_ample_budget_never_refuses_a_capture(generator: torch.Generator) -> None:
    """Churn (many layouts, each captured at its first call): a small capture into a pool with free
    space must not teach the runner that every token needs that much. Every call is a capture or a
    replay, graph memory stays within the budget, and predicted pool growth is never short of the
    measured by more than a segment."""
    mechanism = StandInGraphs(scratch_bytes_per_token=8, segment_bytes=4 << 10)
    runner, _ = _runner(mechanism=mechanism, capacity=16, max_tokens=2048, budget_bytes=2 << 20)
    stream = _churn(generator, 600, seed=3)
    for layout in stream:
        _run_checked(runner, layout, generator)
        assert runner.stats()["bytes_held"] <= 2 << 20
    stats = runner.stats()
    assert sum(stats["eager_runs"].values()) == 0 and stats["replays"] == len(stream)
    assert stats["pool_bytes"] < 1 << 20  # the budget is ample: twice what the pool ever took
    assert stats["evictions"] > 0 and stats["pool_growth_prediction"]["captures"] > 0
    assert stats["pool_growth_prediction"]["worst_under_bytes"] < 4 << 10


def test_a_budget_just_above_one_capture_keeps_every_graph_of_that_size(generator: torch.Generator) -> None:
    mechanism = StandInGraphs(scratch_bytes_per_token=256)
    staging = 4 * 64 * HIDDEN * 4  # x, cos, sin and the output
    one_capture = 16 * (HIDDEN * 4 + 256)  # 16 tokens: the forward's output and intermediates
    offsets = 3 * 4 * 3  # two graphs' offsets, up to three int32 each
    runner, _ = _runner(mechanism=mechanism, max_tokens=64, budget_bytes=staging + one_capture + offsets)
    first, second = _layout((1, 4, 4)), _layout((1, 2, 2), (1, 2, 6))  # 16 tokens each, other boundaries
    for layout in (first, second) * 4:
        _run_checked(runner, layout, generator)
        assert runner.stats()["bytes_held"] <= runner.stats()["budget_bytes"]
    stats = runner.stats()
    assert (stats["captures"], stats["replays"], stats["eager_runs"]["over_budget"]) == (2, 8, 0)


def test_default_budget_is_a_fraction_of_the_device_memory(generator: torch.Generator) -> None:
    assert default_budget_bytes(141 << 30) == (141 << 30) // 64
    assert default_budget_bytes(8 << 30) == 256 << 20
    assert default_budget_bytes(288 << 30) == 4 << 30
    runner, _ = _runner(mechanism=StandInGraphs(total_memory_bytes=128 << 30))
    assert runner.stats()["budget_bytes"] is None  # decided at the first capture, from its device
    runner.run(*_with_layout(_layout((1, 2, 2)), generator))
    assert runner.stats()["budget_bytes"] == 2 << 30


def test_bytes_held_counts_the_pool_graphs_were_captured_into_before_a_failed_capture(
    generator: torch.Generator,
) -> None:
    mechanism = StandInGraphs(scratch_bytes_per_token=64)
    runner, _ = _runner(mechanism=mechanism, max_tokens=64)
    _run_checked(runner, _layout((1, 2, 4)), generator)
    mechanism.fail_captures = 1
    _run_checked(runner, _layout((1, 2, 6)), generator)  # fails: later captures go to a fresh pool
    _run_checked(runner, _layout((1, 2, 8)), generator)
    old_pool, failed_pool, new_pool = mechanism.capture_pools
    assert old_pool is failed_pool and new_pool is not old_pool
    stats = runner.stats()
    assert stats["graphs"] == 2
    old_bytes, new_bytes = mechanism.pool_bytes(old_pool, None), mechanism.pool_bytes(new_pool, None)
    assert old_bytes > 0 and stats["pool_bytes"] == old_bytes + new_bytes


def test_rotary_staging_keeps_the_dtype_the_model_passed(generator: torch.Generator) -> None:
    runner, _ = _runner()
    layout = _layout((1, 2, 2))
    x = torch.randn(4, HIDDEN, generator=generator, dtype=torch.float64).to(torch.bfloat16)
    cos = torch.randn(4, HIDDEN, generator=generator)
    runner.run(x, layout, cos, cos)
    (staging,) = runner._store.staging.values()
    assert [t.dtype for t in staging.inputs] == [torch.bfloat16, torch.float32, torch.float32]
    (graph,) = runner._store.graphs.values()
    assert graph.offsets["full"].dtype == torch.int32


def test_a_mutable_call_between_two_immutable_ones_drops_stagings_claim(generator: torch.Generator) -> None:
    """Immutable A, then B passed as mutable, then A again: staging holds B's copy by then, so A must
    be copied again although it is the very tensor staging last held as immutable."""
    runner, _ = _runner()
    layout = _layout((1, 4, 4))
    first, second = _inputs(layout, generator)[1:], _inputs(layout, generator)[1:]
    for (cos, sin), immutable in ((first, True), (second, False), (first, True)):
        x = torch.randn(layout.num_patches, HIDDEN, generator=generator)
        out = runner.run(x, layout, cos, sin, immutable=immutable)
        assert torch.equal(out, _eager(layout, x, cos, sin)), immutable
    assert (runner.stats()["captures"], runner.stats()["replays"]) == (1, 3)


def _toy_with_offsets(x, attn_args: dict, cos, sin, offsets: torch.Tensor) -> torch.Tensor:
    return _toy_forward_blocks(x, attn_args, cos, sin) + offsets


def test_further_inputs_get_staging_buffers_copied_before_every_replay(generator: torch.Generator) -> None:
    runner = ViTGraphRunner(
        _toy_with_offsets, get_backend("sdpa").layout_args, RunnerOptions(min_hits=1), mechanism=StandInGraphs()
    )
    layout = _layout((1, 2, 4), (1, 2, 2))
    for _ in range(3):
        x, cos, sin = _inputs(layout, generator)
        offsets = torch.randn(layout.num_patches, 1, generator=generator)
        eager = _toy_with_offsets(x, {"full": SegmentLengths(layout.segmentations["full"].seq_lens)}, cos, sin, offsets)
        assert torch.equal(runner.run(x, layout, cos, sin, offsets), eager)
    (staging,) = runner._store.staging.values()
    assert len(staging.inputs) == 4 and staging.inputs[3].shape[1:] == offsets.shape[1:]
    assert (runner.stats()["captures"], runner.stats()["replays"]) == (1, 3)


_SEGMENTS = [
    {"segment_pool_id": (0, 7), "device": 0, "total_size": 2 << 20},
    {"segment_pool_id": (0, 7), "device": 0, "total_size": 4 << 20},
    {"segment_pool_id": (0, 7), "device": 1, "total_size": 8 << 20},  # another device's
    {"segment_pool_id": (0, 0), "device": 0, "total_size": 16 << 20},  # the ordinary cache
]


def _whole_snapshot() -> list[dict]:  # torch before mempool_id
    snapshot_calls.append({})
    return _SEGMENTS


def _pool_snapshot(mempool_id=None) -> list[dict]:
    snapshot_calls.append({"mempool_id": mempool_id})
    return _SEGMENTS


def _pool_snapshot_without_traces(mempool_id=None, include_traces=True) -> list[dict]:
    snapshot_calls.append({"mempool_id": mempool_id, "include_traces": include_traces})
    return _SEGMENTS


@pytest.mark.parametrize(
    ("snapshot", "expected_call"),
    [
        (_whole_snapshot, {}),
        (_pool_snapshot, {"mempool_id": (0, 7)}),
        (_pool_snapshot_without_traces, {"mempool_id": (0, 7), "include_traces": False}),
    ],
)
def test_a_pools_bytes_are_read_from_its_own_snapshot_where_torch_can_take_one(
    monkeypatch: pytest.MonkeyPatch, snapshot, expected_call: dict
) -> None:
    """After each capture the runner reads its pools' bytes inside the serving call: a whole-process
    snapshot walks every segment of a server, so the pool's alone (without traces) where this torch
    allows, and on any torch only the pool's segments on the runner's device count."""
    from rocm_vit.graphs import torch_graphs

    monkeypatch.setattr(torch.cuda, "memory_snapshot", snapshot)
    snapshot_calls.clear()
    torch_graphs._snapshot_options.cache_clear()
    try:
        assert CudaGraphs.pool_bytes(CudaGraphs.__new__(CudaGraphs), [0, 7], torch.device("cuda", 0)) == 6 << 20
    finally:
        torch_graphs._snapshot_options.cache_clear()
    assert snapshot_calls == [expected_call]


def _held_graph() -> Graph:
    """A graph entry for the store's bookkeeping alone: no tensors behind it."""
    return Graph(graph=object(), output=torch.empty(0), pool=object(), staging=None, inputs=(), offsets={}, tokens=4)


def test_the_least_used_graph_is_evicted_and_the_least_recently_used_among_equals() -> None:
    """Uses live with the graphs: each replay counts one; at capacity the least used goes first, and
    among equals the one replayed longest ago."""
    store = GraphStore(HostGraphs(), RunnerOptions(capacity=3, max_tokens=64), agree_max=None)
    for key in ("first", "second", "third"):
        store.add(key, _held_graph(), uses=1)
    assert store.uses_to_beat() == 1
    for key in ("second", "first"):
        store.graph_to_replay(key)  # uses: first 2, second 2, third 1
    store.make_room((), 4)
    assert list(store.graphs) == ["second", "first"] and store.uses_to_beat() is None
    store.add("third", _held_graph(), uses=1)
    store.graph_to_replay("third")  # all at 2: second was replayed longest ago
    store.make_room((), 4)
    assert list(store.graphs) == ["first", "third"] and store.evictions == 2


def test_room_is_made_for_the_pool_already_reserved_not_only_for_what_the_capture_needs() -> None:
    """The pool keeps what its largest capture reserved, and a smaller capture needs no more of it:
    where a new signature's staging plus that pool would break the budget, the pools are released
    before the capture, though its own need would fit (else the capture is made, and its graph
    dropped with every other by the budget after it)."""
    store = GraphStore(HostGraphs(), RunnerOptions(max_tokens=64, budget_bytes=6 << 10), agree_max=None)
    store.use_device(torch.device("cpu"))
    store.scratch.observe(64, 8 << 10)  # a capture of 64 tokens took 8 KiB of the pool ...
    store.scratch.observe(4, 1 << 10)  # ... one of 4 tokens 1 KiB
    store.record_pool_bytes(4 << 10)  # the pool reserves 4 KiB now, more than 4 tokens need
    signature = ((torch.float32, (HIDDEN,), Fraction(1)),)  # staging of 64 x 8 float32: 2 KiB
    store.make_room(signature, 4)  # 2 + max(4, 1) = 6 KiB: within the budget
    assert (store.pool_releases, store.pool_bytes) == (0, 4 << 10)
    store.record_pool_bytes(5 << 10)
    store.make_room(signature, 4)  # 2 + 5 = 7 KiB: over it, though 2 + 1 would fit
    assert (store.pool_releases, store.pool_bytes) == (1, 0)
