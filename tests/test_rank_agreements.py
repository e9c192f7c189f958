"""Ranks that must agree, as threads of one process over a fake agreement that waits for every rank.

A rank that skips an agreement, or one collective step, leaves the others waiting: here a barrier
with a deadline of seconds breaks instead, so a broken protocol fails in seconds, not only when a
multi-process test hits its deadline (tests/test_sglang_parallel.py).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import test_graph_runner as support

from rocm_vit.attention import get_backend
from rocm_vit.graphs import RunnerOptions, ViTGraphRunner
from rocm_vit.graphs.ranks import AgreeMax
from rocm_vit.integrations.sglang.ranks import RunnerFailures

# A hang guard, never the subject: a correct run never waits on it, so a busy machine that makes a
# thread late cannot break the barrier; a rank that never comes fails the test instead of hanging it.
HANG_S = 120


class ThreadGroup:
    """``agree_max`` and a blocking exchange among ``size`` threads; one that never comes breaks the
    barrier for every other after ``HANG_S``."""

    def __init__(self, size: int) -> None:
        self._barrier = threading.Barrier(size, timeout=HANG_S)
        self._values: dict[int, list[int]] = {}

    def agree_max(self, rank: int) -> AgreeMax:
        def agree(values: Sequence[int]) -> list[int]:
            self._values[rank] = list(values)
            self._barrier.wait()
            result = [max(column) for column in zip(*self._values.values(), strict=True)]
            self._barrier.wait()
            return result

        return agree

    def exchange(self) -> None:
        self._barrier.wait()


def _on_threads(size: int, rank_fn: Callable[[int], object]) -> list[object]:
    """``rank_fn(rank)`` on a thread each; what each returned, or the exception it raised."""
    results: list[object] = [None] * size

    def run(rank: int) -> None:
        try:
            results[rank] = rank_fn(rank)
        except BaseException as error:  # a broken barrier, reported per rank
            results[rank] = error

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_a_failure_on_one_rank_stops_every_rank_at_the_same_agreed_call() -> None:
    """The last rank fails at call 10; every rank stops serving at the first agreement after it (call
    16), and none leaves the others waiting in an agreement."""
    group = ThreadGroup(4)

    def rank(index: int) -> int | None:
        failures = RunnerFailures(group.agree_max(index), every=8)
        for call in range(1, 41):
            failures.before_call()
            if not failures.serving:
                return call
            if index == 3 and call == 10:
                failures.failed()
        return None

    assert _on_threads(4, rank) == [16, 16, 16, 16]


def test_a_rank_alone_stops_at_its_first_failure() -> None:
    failures = RunnerFailures(None, every=8)
    failures.before_call()
    failures.failed()
    assert not failures.serving and failures.count == 1


def test_ranks_enter_and_leave_a_capture_scope_together_whatever_fails_on_one() -> None:
    """A capture scope whose exit is a blocking exchange (SGLang's ``ca_comm.capture()``): the warm-up
    fails on the last rank at the first layout, the capture at the second. Every rank enters the
    scope equally often, no rank waits alone, and every rank keeps the same graphs."""
    group = ThreadGroup(2)
    layouts = [support._layout((1, 4, 4)), support._layout((1, 4, 6)), support._layout((1, 6, 6))]

    def rank(index: int) -> tuple[int, int, int]:
        entered = 0

        @contextlib.contextmanager
        def scope() -> Iterator[None]:
            nonlocal entered
            entered += 1
            yield
            group.exchange()

        failing = {"fail_warm_ups": 1, "fail_captures": 1} if index == 1 else {}
        mechanism = support.StandInGraphs(**failing)
        runner = ViTGraphRunner(support._toy_forward_blocks, get_backend("sdpa").layout_args, RunnerOptions(min_hits=1),
                                mechanism=mechanism, agree_max=group.agree_max(index), capture_scope=scope)  # fmt: skip
        generator = torch.Generator().manual_seed(0)
        for layout in layouts * 2:
            support._run_checked(runner, layout, generator)
        stats = runner.stats()
        return entered, stats["captures"], stats["graphs"]

    results = _on_threads(2, rank)
    assert results == [(2, 1, 1), (2, 1, 1)], results  # the warm-up's failure: nobody entered the scope


def test_no_allocation_sits_between_a_launched_replay_and_the_return(generator: torch.Generator) -> None:
    """Out of memory right after a serving replay launched would leave this rank's all-reduces
    launched and its call failed, re-run eagerly on one rank: the output is allocated before."""
    runner, mechanism = support._runner()
    layout = support._layout((1, 4, 4))
    support._run_checked(runner, layout, generator)  # captured and verified

    launched = threading.Event()

    class _OutOfMemoryOnceLaunched(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if launched.is_set() and getattr(func, "__name__", "") in {"clone", "empty_like", "empty", "zeros_like"}:
                raise torch.OutOfMemoryError("stand-in: out of memory after the replay launched")
            return func(*args, **(kwargs or {}))

    replay = mechanism.replay

    def replay_then_arm(graph: object) -> None:
        replay(graph)
        launched.set()

    mechanism.replay = replay_then_arm
    x, cos, sin = support._inputs(layout, generator)
    with _OutOfMemoryOnceLaunched():
        output = runner.run(x, layout, cos, sin)
    launched.clear()
    assert torch.equal(output, support._eager(layout, x, cos, sin))
    assert runner.stats()["replays"] == 2


def test_a_forward_that_raises_under_tensor_parallelism_is_never_run_again_on_that_rank() -> None:
    """SGLang's forward raises on this rank (out of memory between two all-reduces): its peers wait
    for the rest of its all-reduces, so neither the runner (a warm-up's forward re-run in its place)
    nor the adapter (SGLang's eager blocks) may run it again here: the call fails, saying why."""
    import functools
    from collections import OrderedDict

    from rocm_vit.integrations.sglang import graph_runner
    from rocm_vit.integrations.sglang.blocks import SGLANG_GRAPH_ARGS, SGLangBlocks, segment_args

    forwards: list[str] = []
    blocks = object.__new__(SGLangBlocks)
    blocks.vit, blocks._takes_position_embeddings, blocks._layouts = torch.nn.Module(), False, OrderedDict()
    blocks._fused, blocks.blocks = None, "sglang: a stand-in tower"  # SGLang's block loop, as the setting keeps it

    def run_blocks(x: torch.Tensor, block_args: object, rotary: object) -> torch.Tensor:
        forwards.append("forward")
        raise torch.OutOfMemoryError("stand-in: out of memory between two all-reduces")

    blocks.run_blocks = run_blocks
    blocks.eager = lambda *args: forwards.append("SGLang's eager blocks")
    adapter = object.__new__(graph_runner.ViTGraphRunnerAdapter)
    adapter.vit, adapter._blocks, adapter._windowed = blocks.vit, blocks, False
    adapter._agree = lambda values: list(values)  # a group whose other ranks agree with this one
    adapter._failures = RunnerFailures(adapter._agree, every=64)
    adapter._stopped_stats = {}
    adapter._runner = ViTGraphRunner(
        functools.partial(blocks.forward_blocks, SGLANG_GRAPH_ARGS["fa3"], shares_collectives=True),
        segment_args,
        RunnerOptions(min_hits=1),  # this call captures: the warm-up's forward raises
        mechanism=support.StandInGraphs(),
        agree_max=adapter._agree,
    )
    x, cos, sin = torch.randn(16, 8), torch.randn(16, 4), torch.randn(16, 4)
    cu_seqlens = torch.tensor([0, 16], dtype=torch.int32)
    try:
        adapter.run(x, cu_seqlens, None, None, cos, sin, None, ((0, 16), None))
    except RuntimeError as error:
        assert "collectives may have run" in str(error) and isinstance(error.__cause__, torch.OutOfMemoryError)
    else:
        raise AssertionError("the call did not fail")
    assert forwards == ["forward"]
    assert adapter.stats()["stopped"]
