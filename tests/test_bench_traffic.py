"""bench-traffic's streams follow Qwen3-VL's resize, and its simulation drives the real runner."""

from __future__ import annotations

import json
import logging
from dataclasses import replace

import pytest

from rocm_vit.cli import bench_traffic
from rocm_vit.cli.main import main
from rocm_vit.graphs.cost import CostModel
from rocm_vit.workloads.traffic import (
    CHECKPOINT_MAX_PIXELS,
    OPERATOR_CAP_PIXELS,
    chat_stream,
    image_grid,
    repeated_stream,
)


@pytest.mark.parametrize(
    ("size", "max_pixels", "patches"),
    [
        ((4032, 3024), OPERATOR_CAP_PIXELS, 4920),  # the chat stream's "one 1.3 MP image (4,920)"
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
    """On a host launching in 14 ms, 6 x 640x360 is replayed (the H200 saved 33 % at 13.6 ms); 8 x
    640x360 and 1080p, whose device time reaches the launch time, are left eager there, and
    1.3 MP on a host launching in 10 ms."""
    host = CostModel().with_launch_ms(14.0)
    six = bench_traffic.simulate(repeated_stream("six", 6, 640, 360, 400), host)
    assert six["count"]["replay"] == 0  # 5,280 patches: over the ceiling admission by count had
    assert six["benefit"]["capture"] == 1 and six["benefit"]["replay"] >= 385 and six["benefit"]["share"] >= 0.8
    for images, width, height, launch_ms in ((8, 640, 360, 14.0), (1, 1920, 1080, 14.0), (1, 1280, 1024, 10.0)):
        stream = repeated_stream("left eager", images, width, height, 100)
        simulated = bench_traffic.simulate(stream, CostModel().with_launch_ms(launch_ms))
        assert simulated["benefit"]["capture"] == simulated["benefit"]["replay"] == 0, (images, width, height)


def test_device_heavy_launch_bound_runs_teach_the_launch_time_that_makes_them_pay() -> None:
    """On a host launching in 12 ms, 6 x 640x360 (11.6 ms of device time) runs eagerly in 13.8 ms and
    a replay saves 2 ms. No call of the stream is launch-bound enough to show 12 ms itself: the
    runner learns it from those runs (the model's launch time for their host time), and replays."""
    host = CostModel().with_launch_ms(12.0)
    six = bench_traffic.simulate(repeated_stream("six", 6, 640, 360, 400), host)["benefit"]
    assert six["capture"] == 1 and six["replay"] >= 380 and six["share"] >= 0.8


def test_bench_traffic_prints_every_stream_and_fails_on_a_missed_target(capsys) -> None:
    status = main(["bench-traffic", "--calls", "40", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert [stream["stream"] for stream in report["streams"]][:2] == ["chat, 1.3 MP cap", "chat"]
    assert status == 1  # 40 calls: too few for chat's share
    assert report["buckets_first"]  # as the SGLang plugin serves, by default
    main(["bench-traffic", "--calls", "40", "--json", "--stream", "chat", "--no-buckets-first"])
    assert json.loads(capsys.readouterr().out)["buckets_first"] is False


def test_padding_takes_chats_saving_where_exact_graphs_cannot() -> None:
    """Chat at a 1.3 MP cap: one image in five has a size no other request has, and an exact graph's
    capture costs its call more than a few replays save. (85 % is the bench's target, not
    this test's: docs/benchmarks.md has the shares.)"""
    host = CostModel().with_launch_ms(12.0)
    chat = bench_traffic.simulate(chat_stream(2000, seed=0), host)
    assert chat["benefit"]["share"] >= chat["benefit, exact"]["share"] + 0.2
    assert chat["benefit"]["second_half_share"] > chat["benefit"]["share"] + 0.1  # most captures behind it
    assert chat["benefit"]["padded"] > 0 and chat["benefit, exact"]["padded"] == 0
    assert chat["benefit"]["p90_ms"] <= 1.02 * chat["eager"]["p90_ms"]


def test_a_capture_is_charged_to_the_call_that_makes_it_and_to_no_other() -> None:
    """The runner captures inside the triggering call: that call pays a warm-up, the capture and the
    replay that serves it; every other call is eager or a replay, charged nothing for the capture."""
    host = CostModel().with_launch_ms(14.0)
    lengths = [880] * 6  # 6 x 640x360
    six = bench_traffic.simulate(repeated_stream("six", 6, 640, 360, 40), host)["benefit, exact"]
    assert six["capture"] == 1 and six["replay"] > 0 and six["eager"] > 0
    assert six["capture"] + six["replay"] + six["eager"] == 40
    charged = (
        six["eager"] * host.eager_ms(lengths)
        + six["capture"] * bench_traffic._charge(host, "capture", lengths)
        + six["replay"] * host.replay_ms(lengths)
    )
    assert six["mean_ms"] == pytest.approx(charged / 40)


def test_a_capture_on_the_requests_path_is_charged_warm_up_capture_and_replay() -> None:
    host = CostModel().with_launch_ms(12.0)
    assert bench_traffic._charge(host, "capture", [196]) == pytest.approx(
        host.eager_ms([196]) + host.capture_ms + host.replay_ms([196])
    )
    table = bench_traffic.format_table(
        {"launch_ms": 12.0, "streams": [bench_traffic.simulate(chat_stream(40, seed=1), host)]}
    )
    assert any(line.strip().startswith("target") for line in table)
    assert any("p90 within 2% of all-eager and >= 85% of the possible saving" in line for line in table)


def _summary(mean_ms: float, p90_ms: float, share: float | None = None, capture: int = 0) -> dict:
    return {"mean_ms": mean_ms, "p50_ms": mean_ms, "p90_ms": p90_ms, "share": share, "capture": capture}


@pytest.mark.parametrize(
    ("mean_ms", "p90_ms", "share", "met"),
    [(9.0, 10.1, 0.86, True), (9.0, 10.3, 0.86, False), (9.0, 10.1, 0.84, False), (10.0, 10.0, None, True),
     (10.05, 10.0, None, False)],
    ids=["both", "p90 over 2 %", "share under 85 %", "nothing to save, nothing lost", "nothing to save, time lost"],
)  # fmt: skip
def test_chats_target_needs_its_p90_within_2_percent_and_85_percent_of_the_saving(mean_ms, p90_ms, share, met) -> None:
    """Chat at a 1.3 MP cap meets its target only with both; where the oracle saves nothing, 85 %
    of it is nothing lost on the mean. Every stream also has the limits' row (mean within 1 %, p90
    within 2 % of all-eager)."""
    stream = {"stream": "chat, 1.3 MP cap", "eager": _summary(10.0, 10.0), "benefit": _summary(mean_ms, p90_ms, share)}
    limits, chat = bench_traffic.target_rows({"streams": [stream]})
    assert chat["met"] is met
    assert limits["met"] is (p90_ms <= 10.2)


def test_the_other_targets_take_80_percent_of_the_saving_and_leave_device_bound_streams_eager() -> None:
    """6 x 640x360 must realize 80 % of the oracle's saving; 8 x 640x360 and 1080p must be left eager
    where the oracle saves nothing (device-bound on this host), and realize 80 % where it saves over
    the cost model's margin (a slow host: 8 x 640x360 is launch-bound at 17 ms)."""
    streams = [
        {"stream": "6 x 640x360 per call", "benefit": _summary(8.0, 8.0, 0.79), "oracle": _summary(9.0, 9.0)},
        {"stream": "8 x 640x360 per call", "benefit": _summary(9.0, 9.0, 0.5, 1), "oracle": _summary(10.0, 10.0)},
        {"stream": "1 x 1080p per call", "benefit": _summary(10.0, 10.0, 0.0, 0), "oracle": _summary(10.0, 10.0)},
        {"stream": "1 x 1.3 MP per call", "benefit": _summary(8.0, 8.0, 0.8, 1), "oracle": _summary(7.5, 7.5)},
        {"stream": "video", "benefit": _summary(10.2, 10.0, 0.0), "oracle": _summary(10.0, 10.0)},
    ]
    for stream in streams:
        stream["eager"] = _summary(10.0, 10.0)
    rows = {row["target"]: row["met"] for row in bench_traffic.target_rows({"streams": streams})}
    assert rows["6 x 640x360 per call: >= 80% of the possible saving on the mean"] is False
    assert rows["8 x 640x360 per call: left eager"] is False and rows["1 x 1080p per call: left eager"] is True
    assert rows["1 x 1.3 MP per call: >= 80% of the possible saving on the mean"] is True
    assert "1 x 1.3 MP per call: left eager" not in rows
    assert rows["video: mean, p90 within 1%, 2% of all-eager"] is False  # 2 % slower on the mean


def test_buckets_captured_first_leave_the_stream_fewer_captures_and_more_of_its_saving() -> None:
    """As a server capturing its padded buckets at startup: those captures are charged nothing and
    left out of the stream's counts."""
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
    """One block at 10 ms a launch, 1 ms a token and 20 ms a capture: 4 and 8 tokens pad to 128
    (128 ms a replay: eager is faster), 100 to 128 too; its own graph is captured inside its first
    call, charged as the simulation charges a capture (eager, the capture, the replay)."""
    host = CostModel(blocks=1, launch_ms=10.0, device_base_ms=0.0, device_ms_per_token=1.0, device_ms_per_square=0.0,
                     capture_ms=20.0)  # fmt: skip

    def buckets(tokens: int) -> int | None:
        return next((size for size in (128, 256) if size > tokens), None)

    small, once, large = [4], [8], [100]
    times, captures = bench_traffic.admission_bound([small] * 6 + [once] + [large] * 3, host, buckets, 8192)
    own, capture_call = host.replay_ms(small), host.eager_ms(small) + host.capture_ms + host.replay_ms(small)
    assert captures == 1  # six calls of 4 tokens repay a capture; the one-off and the large ones do not
    assert times[0] == pytest.approx(bench_traffic._charge(host, "capture", small))
    assert times[:6] == pytest.approx([capture_call, own, own, own, own, own])
    assert times[6] == pytest.approx(min(host.eager_ms(once), host.replay_ms([8, 120])))
    assert times[7:] == pytest.approx([host.eager_ms(large)] * 3)  # device-bound: padding would cost more
    assert bench_traffic.admission_bound([small] * 6, host, buckets, max_tokens=2)[1] == 0  # over the guard
    # At the default 60 ms a capture, six calls save less than it costs.
    assert bench_traffic.admission_bound([small] * 6, replace(host, capture_ms=60.0), buckets, 8192)[1] == 0


def test_a_policy_tuned_to_a_slow_host_pads_more_of_chat_than_the_untuned_default(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """At 17 ms a launch, padding decided by the untuned model (10 ms) leaves layouts eager that a
    bucket would serve; a profile's launch time pads them (chat 82 -> 87 % at seed 0, 2000 calls).
    The runner's warning that this machine is far from the model's launch time stays out of a
    simulation, whose host is far from it on purpose."""
    caplog.set_level(logging.WARNING)
    host, stream = CostModel().with_launch_ms(17.0), chat_stream(400, seed=0)
    untuned = bench_traffic.simulate(stream, host, buckets_first=True)["benefit"]
    tuned = bench_traffic.simulate(stream, host, buckets_first=True, tuned_launch_ms=17.0)["benefit"]
    assert tuned["padded"] > untuned["padded"] and tuned["share"] > untuned["share"]
    assert not [record for record in caplog.records if record.name == "rocm_vit.graphs.admission"]


def test_no_policy_realizes_more_than_the_admission_bound() -> None:
    simulated = bench_traffic.simulate(chat_stream(400, seed=0), CostModel().with_launch_ms(17.0), buckets_first=True)
    bound = simulated["bound"]["share"]
    assert 0 < bound <= 1
    assert all(simulated[name]["share"] <= bound for name in bench_traffic.POLICY_NAMES)
