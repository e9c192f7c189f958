"""Failures injected into a real graph mechanism (tests/sglang_support/injected_failures.py), on the
host one: what the GPU ranks of tests/gpu/test_sglang_ranks_gpu.py inject into CUDA graphs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.append(str(Path(__file__).resolve().parent / "sglang_support"))
from injected_failures import InjectedFailures

from rocm_vit.graphs.torch_graphs import HostGraphs


def _capture(mechanism: InjectedFailures, fn) -> tuple:
    return mechanism.capture(fn, mechanism.new_pool(torch.device("cpu")), "runner")


def test_injected_failures_fail_each_step_once_before_it_runs_anything() -> None:
    """The arguments of the CPU stand-in graphs, on a real mechanism (here the host one)."""
    runs: list[str] = []

    def forward() -> torch.Tensor:
        runs.append("forward")
        return torch.ones(2)

    for arguments, step, error in (
        ({"fail_warm_ups": 1}, lambda m: m.warm_up(forward, None, "runner"), RuntimeError),
        ({"fail_captures": 1}, lambda m: _capture(m, forward), torch.OutOfMemoryError),
    ):
        mechanism = InjectedFailures(HostGraphs(), **arguments)
        with pytest.raises(error, match="injected"):
            step(mechanism)
        assert runs == [] and mechanism.injected == list(arguments)
        step(mechanism)  # once only
        assert runs == ["forward"]
        runs.clear()
    mechanism = InjectedFailures(HostGraphs(), fail_replays=1)
    graph, _ = _capture(mechanism, forward)
    runs.clear()
    with pytest.raises(RuntimeError, match="injected: the replay failed"):
        mechanism.replay(graph)
    assert runs == []


def test_an_injected_serving_replay_failure_spares_each_graphs_first_replay() -> None:
    mechanism = InjectedFailures(HostGraphs(), fail_later_replays=1)
    first, _ = _capture(mechanism, lambda: torch.ones(2))
    second, _ = _capture(mechanism, lambda: torch.ones(2))
    mechanism.replay(first)
    mechanism.replay(second)  # a new graph's check: not a serving replay
    with pytest.raises(RuntimeError, match="serving replay"):
        mechanism.replay(first)
    mechanism.replay(first)
    assert mechanism.injected == ["fail_later_replays"]


def test_an_injected_corrupt_capture_replays_other_bits_than_its_warm_up() -> None:
    output = torch.tensor([1.0, -3.0])
    mechanism = InjectedFailures(HostGraphs(), corrupt_captures=1)
    graph, _ = _capture(mechanism, lambda: output.clone())
    replayed = graph.fn()
    assert not torch.equal(replayed, output) and torch.equal(replayed, 2 * output)
    clean, _ = _capture(mechanism, lambda: output.clone())
    assert torch.equal(clean.fn(), output)
