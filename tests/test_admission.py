"""Admission on its own (rocm_vit/graphs/admission.py): tables of calls and the decision each one gets.

No tensor and no graph: what a call is told (a reason it runs eagerly, or ``None``: capture it now)
follows from its layout, the calls before it, what the runner reported back, and the cost model.
"""

from __future__ import annotations

import logging

import pytest

from rocm_vit.graphs.admission import Admission
from rocm_vit.graphs.cost import CostModel
from rocm_vit.graphs.options import RunnerOptions
from rocm_vit.layout import AttentionLayout, VisionLayout

# One block, one millisecond per token on the device, 10 ms to launch, a capture costs 10 ms: a
# layout of 4 tokens saves 6 ms a call (it repays a fifth of a capture at its first call), one of
# 10 tokens or more saves nothing.
PER_TOKEN = CostModel(
    blocks=1, launch_ms=10.0, device_base_ms=0.0, device_ms_per_token=1.0, device_ms_per_square=0.0, capture_ms=10.0
)
# As PER_TOKEN, but a capture costs 100 ms: a 4-token layout repays its fifth (20 ms) at its 4th call.
COSTLY_CAPTURE = CostModel(**{**PER_TOKEN.__dict__, "capture_ms": 100.0})

SMALL, OTHER, LARGE, HUGE = ((1, 2, 2),), ((1, 2, 2), (1, 2, 2)), ((1, 2, 6),), ((1, 64, 64),)


def _layout(grid: tuple[tuple[int, int, int], ...]) -> AttentionLayout:
    return VisionLayout.from_grid_thw(list(grid)).attention


def _admission(cost_model: CostModel | None = PER_TOKEN, **limits: int) -> Admission:
    options = RunnerOptions(**{"capacity": 2, "min_hits": 2, "max_tokens": 1024, **limits}, cost_model=cost_model)
    return Admission(options, agree=lambda values: list(values))


def _serve(admission: Admission, grids: list, held: dict | None = None) -> list[str | None]:
    """Each call's decision; a call told ``None`` is captured (evicting the least used at capacity),
    a call with a graph is replayed, as the runner and its store do. ``held``: the graphs' uses by
    key, least recently used first, as the store keeps them."""
    held = {} if held is None else held
    decisions = []
    for grid in grids:
        key = grid
        if admission.called():
            held.update((held_key, uses // 2) for held_key, uses in held.items())
        if key in held:
            held[key] = held.pop(key) + 1  # most recently used last
            decisions.append("replay")
            continue
        least_used = min(held, key=held.__getitem__, default=None)
        at_capacity = len(held) >= admission.capacity
        decision = admission.decide(key, _layout(grid), held[least_used] if at_capacity and held else None)
        if decision is None:
            while len(held) >= admission.capacity:
                del held[min(held, key=held.__getitem__)]
            held[key] = admission.captured(key)
            decision = "capture"
        decisions.append(decision)
    return decisions


@pytest.mark.parametrize(
    ("name", "options", "calls", "expected"),
    [
        ("captured at its min_hits-th call, then replayed", {}, [SMALL] * 3, ["below_min_hits", "capture", "replay"]),
        ("nothing to save: never counted", {}, [LARGE] * 3, ["no_saving"] * 3),
        ("over the memory guard", {"max_tokens": 64}, [HUGE] * 2, ["over_max_tokens"] * 2),
        ("capacity 0", {"capacity": 0}, [SMALL] * 2, ["over_capacity"] * 2),
        ("min_hits 1", {"min_hits": 1}, [SMALL, SMALL], ["capture", "replay"]),
    ],
)
def test_each_call_gets_the_decision_its_table_row_names(name: str, options: dict, calls: list, expected: list) -> None:
    assert _serve(_admission(**options), calls) == expected, name


def test_a_layout_waits_until_its_savings_repay_a_fifth_of_a_capture() -> None:
    """6 ms saved a call against a fifth of a 100 ms capture: captured at the 4th call (24 >= 20)."""
    assert _serve(_admission(COSTLY_CAPTURE), [SMALL] * 5) == ["below_min_hits"] + ["below_payback"] * 2 + [
        "capture",
        "replay",
    ]


def test_at_capacity_only_a_layout_called_more_often_than_the_least_used_graph_is_captured() -> None:
    """Capacity 1: SMALL's graph was used twice; OTHER is captured only once its calls outnumber that."""
    held: dict = {}
    decisions = _serve(_admission(capacity=1, min_hits=1), [SMALL, SMALL, OTHER, OTHER, OTHER], held)
    assert decisions == ["capture", "replay", "over_capacity", "over_capacity", "capture"]
    assert list(held) == [OTHER]


def test_without_a_cost_model_every_layout_in_the_limits_is_captured_and_capacity_evicts() -> None:
    admission = _admission(None, capacity=1, min_hits=1)
    assert _serve(admission, [LARGE, SMALL, LARGE]) == ["capture", "capture", "capture"]


def test_a_failed_layout_runs_eagerly_for_good_with_its_reason() -> None:
    admission = _admission()
    admission.failed(SMALL, "capture_unverified")
    assert _serve(admission, [SMALL] * 3) == ["capture_unverified"] * 3
    assert admission.stats()["failed_layouts"] == 1


def test_a_capture_over_the_budget_alone_sends_that_size_and_larger_to_eager() -> None:
    admission = _admission(min_hits=1)
    admission.over_budget_from(8)
    assert _serve(admission, [OTHER, SMALL]) == ["over_budget", "capture"]  # 8 tokens, 4 tokens
    assert admission.stats()["over_budget_from_tokens"] == 8


def test_the_launch_time_is_learned_from_launch_bound_runs_only_and_moves_the_decision() -> None:
    """At 10 ms a 12-token layout saves nothing; eager runs of 4-token layouts timed at 20 ms teach a
    launch time of (20^3 - 4^3)^(1/3) = 19.95 ms (the model's eager time of 4 ms of device work at
    that launch time is 20 ms), at which it saves 9 ms. 26 ms runs of a 24-token layout (device-bound:
    its device time is over 0.9 of its runs) teach nothing."""
    admission = _admission()
    assert admission.decide(LARGE, _layout(LARGE)) == "no_saving"
    for _ in range(8):
        admission.timed(_layout(((1, 4, 6),)), 26.0)
    assert admission.launch_ms() == 10.0  # the model's own: nothing launch-bound yet
    for _ in range(16):  # agreed again once 16 more runs were timed
        admission.timed(_layout(SMALL), 20.0)
    assert admission.launch_ms() == pytest.approx(19.947, abs=1e-3)
    assert admission.decide(LARGE, _layout(LARGE)) == "below_min_hits"
    # The runs it learned from are kept for a benchmark to show: the 16 launch-bound ones only.
    samples = admission.launch_samples()
    assert len(samples) == 16
    assert {(sample.host_ms, sample.device_ms) for sample in samples} == {(20.0, 4.0)}
    assert samples[0].launch_ms == pytest.approx(19.947, abs=1e-3)


def test_a_host_far_from_the_models_launch_time_is_told_once_to_tune(caplog: pytest.LogCaptureFixture) -> None:
    """Padding follows the model's launch time, not the learned one: a host 2x slower than the model
    (a 20 ms launch against 10) gets one warning naming both and `rocm-vit tune`, however often the
    launch time is agreed again; one within 1.5x of it gets none."""
    caplog.set_level(logging.WARNING, logger="rocm_vit.graphs.admission")
    near = _admission()
    for _ in range(8):
        near.timed(_layout(SMALL), 14.0)  # teaches (14^3 - 4^3)^(1/3) = 13.89 ms: within 1.5x of 10
    assert near.launch_ms() == pytest.approx(13.89, abs=0.01)
    assert caplog.records == []
    far = _admission()
    for _ in range(3):
        for _ in range(16):
            far.timed(_layout(SMALL), 20.0)
        assert far.launch_ms() == pytest.approx(19.947, abs=1e-3)
    (record,) = caplog.records
    assert "19.9 ms" in record.getMessage() and "10.0 ms" in record.getMessage()
    assert "rocm-vit tune" in record.getMessage()


def test_a_launch_bound_run_with_device_work_teaches_the_launch_time_under_it() -> None:
    """Runs of an 8-token layout (8 ms on the device) that take 13 ms are launch-bound by their typical
    run (8 < 0.9 x 13), but their host time is the soft maximum of launch and device time, above the
    launch time: they teach (13^3 - 8^3)^(1/3) = 11.90 ms, not 13."""
    admission = _admission()
    for _ in range(8):
        admission.timed(_layout(OTHER), 13.0)
    assert admission.launch_ms() == pytest.approx(11.90, abs=1e-3)
