"""bench-traffic's tower mode: each call timed through the real tower and recorded by how it was served."""

from __future__ import annotations

import json

import pytest
import torch

from rocm_vit.cli import traffic_tower
from rocm_vit.cli.main import main
from rocm_vit.cli.traffic import Stream, repeated_stream
from rocm_vit.cli.workload import build_tower


def test_tower_mode_times_every_call_eagerly_and_through_the_serving_defaults(monkeypatch, capsys) -> None:
    """On a CPU the runner serves everything eagerly (no_gpu); the structure is what a GPU run fills."""
    small = [repeated_stream("6 x 640x360 per call", 2, 128, 96, 3), repeated_stream("video", 1, 64, 64, 2)]
    monkeypatch.setattr(traffic_tower, "standard_streams", lambda calls, seed: small)
    assert main(["bench-traffic", "--mode", "tower", "--preset", "tiny", "--idle-ms", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["mode"], report["device"], report["idle_ms"]) == ("tower", "cpu", 1.0)
    assert [stream["stream"] for stream in report["streams"]] == ["6 x 640x360 per call", "video"]
    for stream, calls in zip(report["streams"], (3, 2), strict=True):
        assert stream["calls"] == calls and stream["eager_runs"] == {"no_gpu": calls}
        assert stream["graphs"]["replays"] == 0 and stream["eager"]["mean_ms"] > 0
        assert stream["possible_saving_ms"] is None and stream["share"] is None
        assert stream["eager_after"]["mean_ms"] > 0  # all-eager again, after the graphs: the host's drift
        assert stream["second_half"]["graphs"]["replays"] == 0 and stream["second_half"]["eager"]["mean_ms"] > 0
        for record, calls in (("by_kind", stream["calls"]), ("second_half_by_kind", stream["second_half"]["calls"])):
            (kind,) = stream[record]
            assert (kind["kind"], kind["beside_capture"], kind["calls"]) == ("no_gpu", False, calls)


def test_the_tower_oracle_times_each_layouts_own_graph_and_refuses_a_graph_that_never_replays(monkeypatch) -> None:
    """On a CPU, through the runner's stand-in mechanism (its replays re-run the forward); with the
    real mechanism a CPU serves everything eagerly, which the oracle must not take for a replay."""
    from test_graph_runner import StandInGraphs

    tower = build_tower("tiny", torch.device("cpu"), torch.float32, None, seed=0)
    stream = repeated_stream("two layouts", 1, 128, 96, 2)
    stream = Stream("two layouts", (*stream.calls, ((1, 4, 8),)))
    enable = tower.enable_graphs
    mechanism = StandInGraphs()
    monkeypatch.setattr(tower, "enable_graphs", lambda **options: enable(mechanism=mechanism, **options))
    with torch.inference_mode():
        assert traffic_tower._oracle_saving(tower, stream, seed=0, sample=8) >= 0.0
    captured = mechanism.events.count("capture")
    assert captured == 2 and mechanism.events.count("replay") >= 2 * traffic_tower._ORACLE_REPEATS
    monkeypatch.setattr(tower, "enable_graphs", enable)
    with torch.inference_mode(), pytest.raises(RuntimeError, match="did not replay"):
        traffic_tower._oracle_saving(tower, stream, seed=0, sample=2)


def test_the_tower_record_tells_how_each_call_was_served_and_which_ran_beside_a_capture() -> None:
    """Read from the runner's counters, without its lock: a call served while the capture thread holds
    the runner is recorded as served beside a capture; the call that hands a capture over is not."""
    from test_graph_runner import _BlockingCaptures, _inputs, _layout, _runner
    from test_padding import _padded_runner

    mechanism = _BlockingCaptures()
    runner, _ = _runner(mechanism=mechanism, defer_captures=True)
    generator = torch.Generator().manual_seed(0)
    first, second = _layout((1, 2, 4)), _layout((1, 4, 4))

    def served(runner, layout) -> tuple[str, bool]:
        before = runner.counters()
        x, cos, sin = _inputs(layout, generator)
        runner.run(x, layout, cos, sin)
        return traffic_tower.served_as(before, runner.counters())

    assert served(runner, first) == ("capture_deferred", False)
    assert mechanism.started.wait(timeout=30)
    assert served(runner, second) == ("capturing", True)  # the capture of `first` holds the runner
    mechanism.proceed.set()
    assert runner.wait_for_captures(timeout=30)
    assert served(runner, first) == ("replay", False)
    padded_runner, _, _ = _padded_runner(defer_captures=True)
    assert served(padded_runner, _layout((1, 16, 20))) == ("padded capture_deferred", False)
    served_as = [("a", False), ("b", True), ("a", False)]
    rows = traffic_tower.by_kind([10.0, 10.0, 10.0], [9.0, 20.0, 2.0], served_as, [11.0, 12.0, 13.0])
    assert [(row["kind"], row["calls"], row["slower_calls"], row["slower_excess_ms"]) for row in rows] == [
        ("a", 2, 0, 0.0),
        ("b", 1, 1, 10.0),
    ]
    assert [row["eager_after_mean_ms"] for row in rows] == [12.0, 12.0]
