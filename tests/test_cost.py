"""The cost model that admits graphs: decisions measured on H200s, and the fit tune uses."""

from __future__ import annotations

import itertools

import pytest

from rocm_vit.graphs.cost import MIN_SAVING_SHARE, CostModel, fit_cost_model


def _saves(model: CostModel, seq_lens: list[int]) -> bool:
    return model.saving_ms(seq_lens) > MIN_SAVING_SHARE * model.eager_ms(seq_lens)


@pytest.mark.parametrize(
    ("name", "seq_lens", "saves"),
    [
        ("1x224", [196], True),
        ("6x640x360", [880] * 6, True),  # p50 11.7 ms replayed against 17.4 eager
        # Device-bound, where hosts disagree: left eager. 16.0 against 18.5 on this host, 15.3 against
        # 15.5 on a second H200's; one 1.3 MP image 17.7 against 18.4 here, 22.0 against 21.1 on a third's.
        ("8x640x360", [880] * 8, False),
        ("1x1.3MP", [5120], False),
        ("1x1080p", [8160], False),  # 33.3 against 33.2
    ],
)
def test_the_default_model_on_a_13_6_ms_host_takes_what_the_h200_measured(name, seq_lens, saves) -> None:
    """bench-traffic --mode tower on the H200, 2026-12-01 (docs/benchmarks.md); the runner learned 13.6 ms.
    It never predicts a saving where a measurement on some H200 host saw none."""
    assert _saves(CostModel().with_launch_ms(13.6), seq_lens) is saves, name


def test_eager_time_is_a_soft_maximum_where_launch_bound_and_the_device_time_where_not() -> None:
    """Launch-bound, the soft maximum: the H200's eager calls sat 10-50 % above the larger time where
    the two approach (docs/cost-model.md, "The cost model's eager time"). Past 0.8 L it stays at the
    soft maximum there until the device time is larger, so a device-bound call saves nothing;
    continuous and never falling as the device time grows."""
    model = CostModel(blocks=1, launch_ms=10.0, device_base_ms=0.0, device_ms_per_token=1.0, device_ms_per_square=0.0)
    assert model.eager_ms([1]) == pytest.approx(10.0, rel=1e-3)
    assert model.eager_ms([8]) == pytest.approx((10.0**3 + 8.0**3) ** (1 / 3))
    assert model.eager_ms([10]) == pytest.approx((10.0**3 + 8.0**3) ** (1 / 3))
    assert model.eager_ms([12]) == 12.0 and model.eager_ms([40]) == 40.0
    assert model.saving_ms([12]) < 0 and model.saving_ms([8]) > 0.2 * model.eager_ms([8])
    assert model.capturable_saving_ms([11.5]) == 0  # under 5 % of the eager call
    times = [model.eager_ms([tokens / 100]) for tokens in range(700, 1300)]
    assert all(b >= a - 1e-9 for a, b in itertools.pairwise(times))  # never falls as D grows
    assert max(b - a for a, b in itertools.pairwise(times)) < 0.05  # no step


def test_the_fit_recovers_the_device_terms_and_the_launch_time_from_the_smallest_call() -> None:
    truth = CostModel(
        blocks=24, launch_ms=9.0, device_base_ms=0.05, device_ms_per_token=1e-4, device_ms_per_square=2e-8
    )
    timings = [(patches, truth.eager_ms([patches]), truth.replay_ms([patches])) for patches in (196, 1024, 4096, 8192)]
    fitted = fit_cost_model(timings, blocks=24)
    assert fitted.launch_ms == pytest.approx(truth.launch_ms, rel=1e-6)  # the smallest call's, its device share out
    for seq_lens in ([196], [880] * 6, [16384]):
        assert fitted.replay_ms(seq_lens) == pytest.approx(truth.replay_ms(seq_lens), rel=1e-9)


def test_the_fit_keeps_every_term_non_negative_and_needs_three_timings() -> None:
    bending = [(196, 10.0, 1.5), (2048, 12.0, 9.0), (4096, 15.0, 14.9)]  # a negative square term fits best
    fitted = fit_cost_model(bending, blocks=27)
    assert min(fitted.device_base_ms, fitted.device_ms_per_token, fitted.device_ms_per_square) >= 0
    assert fitted.device_ms_per_square == 0
    assert fit_cost_model(bending[:2], blocks=27) is None


def test_a_shallower_tower_launches_proportionally_faster() -> None:
    model = CostModel().for_blocks(9)
    assert model.launch_ms == pytest.approx(CostModel().launch_ms / 3)
    assert model.device_ms([1024]) == pytest.approx(CostModel().device_ms([1024]) / 3)
    assert model.capture_ms == pytest.approx(CostModel().capture_ms / 3)  # it launches the forward too
