"""Failures injected into a real graph mechanism (``CudaGraphs`` on a GPU), as ``StandInGraphs``
injects them into the CPU stand-in (tests/test_graph_runner.py), with the same arguments: the
failure plans of ``rank_harness.FAILURES`` run on either.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class InjectedFailures:
    """``mechanism`` whose next ``fail_warm_ups`` warm-ups, ``fail_captures`` captures, ``fail_replays``
    replays and ``fail_later_replays`` replays of graphs replayed before (a serving replay, not a new
    graph's check) raise before anything of theirs runs; ``corrupt_captures`` captures end without an
    error but record a graph whose output is doubled (a capture error swallowed: its first replay
    differs from its warm-up). Everything else is ``mechanism``'s."""

    def __init__(
        self,
        mechanism: Any,
        fail_warm_ups: int = 0,
        fail_captures: int = 0,
        fail_replays: int = 0,
        fail_later_replays: int = 0,
        corrupt_captures: int = 0,
    ) -> None:
        self._mechanism = mechanism
        self.fail_warm_ups = fail_warm_ups
        self.fail_captures = fail_captures
        self.fail_replays = fail_replays
        self.fail_later_replays = fail_later_replays
        self.corrupt_captures = corrupt_captures
        self._replayed: set[int] = set()  # ids of graphs replayed before
        self.injected: list[str] = []  # the failures that happened, in order

    def __getattr__(self, name: str) -> Any:
        return getattr(self._mechanism, name)

    def warm_up(self, fn: Callable[[], torch.Tensor], pool: Any, stream: Any) -> torch.Tensor:
        if self.fail_warm_ups:
            self._inject("fail_warm_ups")
            raise RuntimeError("injected: the warm-up failed")
        return self._mechanism.warm_up(fn, pool, stream)

    def capture(self, fn: Callable[[], torch.Tensor], pool: Any, stream: Any) -> tuple[Any, torch.Tensor]:
        if self.fail_captures:
            self._inject("fail_captures")
            raise torch.OutOfMemoryError("injected: out of memory during capture")
        if self.corrupt_captures:
            self._inject("corrupt_captures")
            return self._mechanism.capture(lambda: fn().mul_(2), pool, stream)
        return self._mechanism.capture(fn, pool, stream)

    def replay(self, graph: Any) -> None:
        replayed_before = id(graph) in self._replayed
        self._replayed.add(id(graph))  # an attempt counts, as StandInGraphs counts it
        if self.fail_replays:
            self._inject("fail_replays")
            raise RuntimeError("injected: the replay failed to launch")
        if replayed_before and self.fail_later_replays:
            self._inject("fail_later_replays")
            raise RuntimeError("injected: a serving replay failed to launch")
        self._mechanism.replay(graph)

    def retire(self, graph: Any) -> None:
        self._replayed.discard(id(graph))
        self._mechanism.retire(graph)

    def _inject(self, name: str) -> None:
        setattr(self, name, getattr(self, name) - 1)
        self.injected.append(name)
