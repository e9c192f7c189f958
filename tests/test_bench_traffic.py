"""bench-traffic's streams follow Qwen3-VL's resize, and its simulation drives the real runner."""

from __future__ import annotations

import json

import pytest

from rocm_vit.cli import bench_traffic
from rocm_vit.cli.main import main
from rocm_vit.cli.traffic import (
    CHECKPOINT_MAX_PIXELS,
    OPERATOR_CAP_PIXELS,
    chat_stream,
    image_grid,
    repeated_stream,
    spread_capture_work,
)
from rocm_vit.graphs.cost import CostModel


@pytest.mark.parametrize(
    ("size", "max_pixels", "patches"),
    [
        ((4032, 3024), OPERATOR_CAP_PIXELS, 4920),  # the "one 1.3 MP image (4,920)"
        ((640, 360), CHECKPOINT_MAX_PIXELS, 880),  # 6 of them: 5,280
        ((1920, 1080), CHECKPOINT_MAX_PIXELS, 8160),  # 1080p
        ((4032, 3024), CHECKPOINT_MAX_PIXELS, 47376),  # a 12 MP photo at the checkpoint's limit
        ((100, 60), CHECKPOINT_MAX_PIXELS, 308),  # raised to min_pixels: 352 x 224
    ],
)
def test_images_become_the_patch_grids_qwen3_vl_gives_them(size, max_pixels, patches) -> None:
    _, h, w = image_grid(*size, max_pixels)
    assert h * w == patches


def test_the_chat_stream_is_reproducible_and_capped() -> None:
    first, again = chat_stream(200, seed=3), chat_stream(200, seed=3)
    assert first == again and len(first.calls) == 200
    assert all(h * w * 256 <= OPERATOR_CAP_PIXELS for call in first.calls for _, h, w in call)
    assert any(len(call) > 1 for call in first.calls)


def test_the_runner_takes_what_pays_and_leaves_what_does_not() -> None:
    """On a host launching in 14 ms, 6 and 8 x 640x360 are replayed (the H200 saved 33 and 14 % at
    13.6 ms); 1080p is left eager there, and 1.3 MP on a host launching in 10 ms."""
    host = CostModel().with_launch_ms(14.0)
    six = bench_traffic.simulate(repeated_stream("six", 6, 640, 360, 400), host)
    assert six["count"]["replay"] == 0  # 5,280 patches: over the ceiling admission by count had
    assert six["benefit"]["replay"] >= 390 and six["benefit"]["share"] >= 0.8
    eight = bench_traffic.simulate(repeated_stream("eight", 8, 640, 360, 100), host)
    assert eight["benefit"]["replay"] >= 90
    for images, width, height, launch_ms in ((1, 1920, 1080, 14.0), (1, 1280, 1024, 10.0)):
        stream = repeated_stream("left eager", images, width, height, 100)
        simulated = bench_traffic.simulate(stream, CostModel().with_launch_ms(launch_ms))
        assert simulated["benefit"]["capture"] == 0, (images, width, height)


def test_bench_traffic_prints_every_stream_and_fails_on_a_missed_target(capsys) -> None:
    status = main(["bench-traffic", "--calls", "40", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert [stream["stream"] for stream in report["streams"]][:2] == ["chat, 1.3 MP cap", "chat"]
    assert status == 1  # 40 calls: too few for chat's share
    assert report["buckets_first"]  # as the SGLang plugin serves, by default
    main(["bench-traffic", "--calls", "40", "--json", "--stream", "chat", "--no-buckets-first"])
    assert json.loads(capsys.readouterr().out)["buckets_first"] is False


def test_padding_takes_chats_saving_where_exact_graphs_cannot() -> None:
    """Chat at a 1.3 MP cap: one image in five has a size no other request has. (#30's 90 % is the
    bench's target, not this test's: with the captures' contention charged, 2000 calls at 12 ms
    realize 64 %, against 36 % with exact graphs only, docs/benchmarks.md.)"""
    host = CostModel().with_launch_ms(12.0)
    chat = bench_traffic.simulate(chat_stream(2000, seed=0), host)
    assert chat["benefit"]["share"] >= chat["benefit, exact"]["share"] + 0.2
    assert chat["benefit"]["second_half_share"] > chat["benefit"]["share"] + 0.1  # most captures behind it
    assert chat["benefit"]["padded"] > 0 and chat["benefit, exact"]["padded"] == 0
    assert chat["benefit"]["p90_ms"] <= 1.02 * chat["eager"]["p90_ms"]


def test_a_deferred_captures_host_work_is_charged_to_the_calls_beside_it() -> None:
    """A warm-up and a capture: two eager calls of the captured layout, then the check of its first
    replay, shared with the calls after it: each pays at most its own time again and is served
    eagerly until the work is done (the H200: 35-39 ms a capture, +15-17 ms on each call beside it)."""
    host = CostModel().with_launch_ms(12.0)
    small, large = [196], [4096]
    eager_small, eager_large = host.eager_ms(small), host.eager_ms(large)
    kinds, launches = ["deferred", "replay", "replay", "replay"], [2, 0, 0, 0]  # a warm-up and a capture
    times = bench_traffic._charge_contention(host, kinds, [large, small, small, small], launches)
    work = 2 * eager_large + bench_traffic.CAPTURE_CHECK_MS
    assert work > 2 * eager_small  # the capture outlasts two small calls
    assert times[:3] == pytest.approx([eager_large, 2 * eager_small, 2 * eager_small])
    left = work - 2 * eager_small
    assert times[3] == pytest.approx(eager_small + min(left, eager_small))
    replays = bench_traffic._charge_contention(host, ["replay"] * 2, [small] * 2, [0, 0])
    assert replays == [host.replay_ms(small)] * 2
    # A capture without its warm-up takes half as long from the calls beside it.
    one = bench_traffic._charge_contention(host, kinds, [large, small, small, small], [1, 0, 0, 0])
    assert one[:2] == pytest.approx([eager_large, 2 * eager_small]) and sum(one) < sum(times)
    # Host time between calls goes to the capture first: with enough of it, no call pays.
    calls = [large, small, small, small]
    idle = bench_traffic._charge_contention(host, kinds, calls, launches, idle_ms=work)
    assert idle == pytest.approx([eager_large, *[host.replay_ms(small)] * 3])
    some = bench_traffic._charge_contention(host, kinds, calls, launches, idle_ms=work - eager_small)
    assert some[1] == pytest.approx(2 * eager_small) and some[2] == pytest.approx(host.replay_ms(small))


def test_a_captures_measured_time_is_spread_over_the_calls_behind_it_and_nothing_else_is_charged() -> None:
    """Tower mode charges each capture's measured wait so; no capture, no charge, however small."""
    served, eager = [2.0, 2.0, 2.0, 2.0], [10.0, 10.0, 10.0, 10.0]
    assert spread_capture_work(served, eager, [0.0] * 4) == (served, [False] * 4)
    times, charged = spread_capture_work(served, eager, [25.0, 0.0, 0.0, 0.0])
    assert times == [2.0, 20.0, 20.0, 15.0] and charged == [False, True, True, True]
    assert spread_capture_work(served, eager, [25.0, 0.0, 0.0, 0.0], idle_ms=25.0) == (served, [False] * 4)


def test_a_capture_on_the_requests_path_is_charged_warm_up_capture_and_replay() -> None:
    host = CostModel().with_launch_ms(12.0)
    assert bench_traffic._charge(host, "capture", [196]) == pytest.approx(
        host.eager_ms([196]) + host.capture_ms + host.replay_ms([196])
    )
    table = bench_traffic.format_table(
        {"launch_ms": 12.0, "streams": [bench_traffic.simulate(chat_stream(40, seed=1), host)]}
    )
    assert any(line.strip().startswith("target") for line in table)


def test_buckets_captured_first_leave_the_stream_fewer_captures_and_more_of_its_saving() -> None:
    """As a server capturing its padded buckets at startup: those captures are charged nothing and
    left out of the stream's counts (12 ms, 2000 calls: 67 -> 75 % of chat's saving)."""
    host = CostModel().with_launch_ms(12.0)
    stream = chat_stream(400, seed=0)
    lazily, first = bench_traffic.simulate(stream, host), bench_traffic.simulate(stream, host, buckets_first=True)
    assert first["benefit"]["capture"] < lazily["benefit"]["capture"]
    assert first["benefit"]["share"] > lazily["benefit"]["share"]
    assert first["benefit, exact"] == lazily["benefit, exact"]  # no padding: nothing to capture first


def test_the_simulated_oracle_is_split_by_sighting_as_the_towers_is() -> None:
    """Four calls of one launch-bound layout: the first is its first sighting, and each saves the same."""
    stream = repeated_stream("6 x 640x360 per call", 6, 640, 360, 4)
    split = bench_traffic.simulate(stream, CostModel().with_launch_ms(12.0))["oracle_by_sighting"]
    assert split == pytest.approx({"repeats": 0.75, "first sightings": 0.25, "repeats over the guard": 0.0,
                                   "first sightings over the guard": 0.0})  # fmt: skip


def test_the_admission_bound_takes_per_layout_the_better_of_padding_and_its_own_graph() -> None:
    """One block at 10 ms a launch and 1 ms a token: 100 tokens pad to 128 (128 ms a replay: eager
    is faster), 20 pad to 256; its own graph costs one eager call and the check to capture."""
    host = CostModel(blocks=1, launch_ms=10.0, device_base_ms=0.0, device_ms_per_token=1.0, device_ms_per_square=0.0)
    check = bench_traffic.CAPTURE_CHECK_MS

    def buckets(tokens: int) -> int | None:
        return next((size for size in (128, 256) if size > tokens), None)

    small, once, large = [4], [8], [100]
    times, captures = bench_traffic.admission_bound([small] * 6 + [once] + [large] * 3, host, buckets, 8192)
    eager, own = host.eager_ms(small), host.replay_ms(small)
    assert captures == 1  # six calls of 4 tokens repay a capture; the one-off and the large ones do not
    assert times[:6] == pytest.approx([eager, own + eager + check, own, own, own, own])
    assert times[6] == pytest.approx(min(host.eager_ms(once), host.replay_ms([8, 120])))
    assert times[7:] == pytest.approx([host.eager_ms(large)] * 3)  # device-bound: padding would cost more
    assert bench_traffic.admission_bound([small] * 6, host, buckets, max_tokens=2)[1] == 0  # over the guard


def test_no_policy_realizes_more_than_the_admission_bound() -> None:
    simulated = bench_traffic.simulate(chat_stream(400, seed=0), CostModel().with_launch_ms(17.0), buckets_first=True)
    bound = simulated["bound"]["share"]
    assert 0 < bound <= 1
    assert all(simulated[name]["share"] <= bound for name in bench_traffic.POLICIES)
