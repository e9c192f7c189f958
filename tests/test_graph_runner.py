"""ViTGraphRunner policy on CPU: keys, admission, bounds, failures, owned outputs, stats.

A real graph cannot exist on a CPU, so the mechanism is swapped for a stand-in whose "graph" re-runs
the captured function on the static buffers at replay: it reads exactly what a real graph would
read, so stale or moved buffers show up as wrong results here too.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from rocm_vit.attention import SdpaAttention, get_backend
from rocm_vit.graphs import CudaGraphs, ViTGraphRunner
from rocm_vit.layout import Segmentation, VisionLayout
from rocm_vit.models import preset, tower_class


@dataclass
class _StandInGraph:
    fn: Any
    output: torch.Tensor


@dataclass
class StandInGraphs:
    """CPU stand-in for ``CudaGraphs``: counts warm-ups, captures and replays; can fail on demand."""

    fail_captures: int = 0
    warm_ups: int = 0
    events: list[str] = field(default_factory=list)
    capture_pools: list[object] = field(default_factory=list)

    def available(self, device: torch.device) -> bool:
        return True

    def new_pool(self, device: torch.device) -> object:
        return object()

    def new_stream(self, device: torch.device) -> str:
        return "capture-stream"

    def warm_up(self, fn, stream) -> None:
        assert stream == "capture-stream"
        self.warm_ups += 1
        self.events.append("warm_up")
        fn()

    def capture(self, fn, pool, stream):
        assert stream == "capture-stream"
        self.events.append("capture")
        self.capture_pools.append(pool)
        if self.fail_captures:
            self.fail_captures -= 1
            raise torch.OutOfMemoryError("stand-in: out of memory during capture")
        output = fn()
        return _StandInGraph(fn, output), output

    def replay(self, graph: _StandInGraph) -> None:
        self.events.append("replay")
        graph.output.copy_(graph.fn())

    def pool_bytes(self, pool, device) -> int:
        return 0


HIDDEN = 8


def _toy_forward_blocks(x: torch.Tensor, attn_args: dict, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Depends on every input and on the segment boundaries, like real attention does."""
    (seq_lens,) = attn_args["full"]
    segment_sums = torch.cat([part.sum(0, keepdim=True).expand_as(part) for part in x.split(list(seq_lens))])
    return x * cos[:, :HIDDEN] + segment_sums + sin[:, :HIDDEN]


def _runner(**kwargs: Any) -> tuple[ViTGraphRunner, StandInGraphs]:
    mechanism = kwargs.pop("mechanism", None) or StandInGraphs()
    runner = ViTGraphRunner(_toy_forward_blocks, get_backend("sdpa"), mechanism=mechanism, **kwargs)
    return runner, mechanism


def _inputs(layout: VisionLayout, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    n = layout.num_patches
    return (
        torch.randn(n, HIDDEN, generator=generator),
        torch.randn(n, HIDDEN, generator=generator),
        torch.randn(n, HIDDEN, generator=generator),
    )


def _eager(layout: VisionLayout, x, cos, sin) -> torch.Tensor:
    return _toy_forward_blocks(x, {"full": [layout.seq_lens]}, cos, sin)


def _layout(*grid: tuple[int, int, int]) -> VisionLayout:
    return VisionLayout.from_grid_thw(list(grid))


def test_replay_matches_eager_and_reads_new_inputs(generator: torch.Generator) -> None:
    runner, mechanism = _runner()
    layout = _layout((1, 4, 4), (1, 2, 6))
    for _ in range(3):
        x, cos, sin = _inputs(layout, generator)
        assert torch.equal(runner.run(x, layout, cos, sin), _eager(layout, x, cos, sin))
    assert mechanism.events == ["warm_up", "capture", "replay", "replay", "replay"]
    assert runner.stats()["captures"] == 1
    assert runner.stats()["replays"] == 3


def test_equal_token_counts_with_other_boundaries_get_their_own_graph(generator: torch.Generator) -> None:
    runner, _ = _runner()
    first = _layout((1, 4, 4), (1, 2, 2))  # 16 + 4 patches
    second = _layout((1, 2, 2), (1, 4, 4))  # 4 + 16 patches
    assert first.num_patches == second.num_patches
    assert first.graph_key != second.graph_key
    for layout in (first, second, first, second):
        x, cos, sin = _inputs(layout, generator)
        assert torch.equal(runner.run(x, layout, cos, sin), _eager(layout, x, cos, sin))
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


def _with_layout(layout: VisionLayout, generator: torch.Generator) -> tuple:
    x, cos, sin = _inputs(layout, generator)
    return x, layout, cos, sin


def test_capacity_bounds_graphs_and_captured_layouts_keep_replaying(generator: torch.Generator) -> None:
    runner, _ = _runner(capacity=2)
    layouts = [_layout((1, 2, 2 * i)) for i in range(1, 5)]
    for layout in layouts + layouts:
        x, cos, sin = _inputs(layout, generator)
        assert torch.equal(runner.run(x, layout, cos, sin), _eager(layout, x, cos, sin))
    stats = runner.stats()
    assert stats["graphs"] == 2
    assert stats["captures"] == 2
    assert stats["replays"] == 2 + 2  # first two layouts, captured then replayed on the second pass
    assert stats["eager_runs"]["over_capacity"] == 4


def test_eager_fallback_allocates_no_per_layout_buffers(generator: torch.Generator) -> None:
    runner, _ = _runner(capacity=1)
    runner.run(*_with_layout(_layout((1, 2, 2)), generator))
    buffer_bytes = runner.stats()["buffer_bytes"]
    assert buffer_bytes > 0
    for width in range(2, 20, 2):
        runner.run(*_with_layout(_layout((1, 4, width)), generator))
    assert runner.stats()["buffer_bytes"] == buffer_bytes
    assert runner.stats()["graphs"] == 1


def test_capacity_zero_never_captures(generator: torch.Generator) -> None:
    runner, mechanism = _runner(capacity=0)
    runner.run(*_with_layout(_layout((1, 2, 2)), generator))
    assert mechanism.events == []
    assert runner.stats()["eager_runs"]["over_capacity"] == 1


def test_min_hits_delays_capture(generator: torch.Generator) -> None:
    runner, _ = _runner(min_hits=3)
    layout = _layout((1, 2, 4))
    for _ in range(4):
        x, cos, sin = _inputs(layout, generator)
        assert torch.equal(runner.run(x, layout, cos, sin), _eager(layout, x, cos, sin))
    stats = runner.stats()
    assert stats["eager_runs"]["below_min_hits"] == 2
    assert (stats["captures"], stats["replays"]) == (1, 2)


def test_max_tokens_runs_large_layouts_eagerly(generator: torch.Generator) -> None:
    runner, _ = _runner(max_tokens=16)
    runner.run(*_with_layout(_layout((1, 4, 4)), generator))
    runner.run(*_with_layout(_layout((1, 4, 6)), generator))
    stats = runner.stats()
    assert stats["graphs"] == 1
    assert stats["eager_runs"]["over_max_tokens"] == 1


def test_failed_capture_is_remembered_served_eagerly_and_runner_keeps_working(
    generator: torch.Generator, caplog: pytest.LogCaptureFixture
) -> None:
    runner, mechanism = _runner(mechanism=StandInGraphs(fail_captures=1))
    bad, good = _layout((1, 2, 6)), _layout((1, 4, 4))
    for layout in (bad, bad, good, good):
        x, cos, sin = _inputs(layout, generator)
        assert torch.equal(runner.run(x, layout, cos, sin), _eager(layout, x, cos, sin))
    stats = runner.stats()
    assert stats["eager_runs"]["capture_failed"] == 2
    assert (stats["graphs"], stats["failed_layouts"], stats["replays"]) == (1, 1, 2)
    assert mechanism.events.count("capture") == 2  # the failed layout is not captured again
    # The capture after a failure goes to a fresh pool: the failed one may be left mid-capture.
    assert mechanism.capture_pools[0] is not mechanism.capture_pools[1]
    assert "graph capture failed" in caplog.text


def _only_graph(runner: ViTGraphRunner):
    (entry,) = runner._graphs.values()
    return entry


def test_moved_static_buffer_drops_the_graph(generator: torch.Generator) -> None:
    runner, _ = _runner()
    layout = _layout((1, 2, 2))
    runner.run(*_with_layout(layout, generator))
    entry = _only_graph(runner)
    entry.cos = entry.cos.clone()  # what a regrown shared workspace would do under a live graph
    x, cos, sin = _inputs(layout, generator)
    assert torch.equal(runner.run(x, layout, cos, sin), _eager(layout, x, cos, sin))
    assert runner.stats()["graphs"] == 0
    assert runner.stats()["eager_runs"]["capture_failed"] == 1


def test_rotary_workspace_keeps_the_dtype_the_model_passed(generator: torch.Generator) -> None:
    runner, _ = _runner()
    layout = _layout((1, 2, 2))
    x = torch.randn(4, HIDDEN, generator=generator, dtype=torch.float64).to(torch.bfloat16)
    cos = torch.randn(4, HIDDEN, generator=generator)
    runner.run(x, layout, cos, cos)
    entry = _only_graph(runner)
    assert (entry.x.dtype, entry.cos.dtype, entry.sin.dtype) == (torch.bfloat16, torch.float32, torch.float32)
    assert entry.cu_seqlens["full"].dtype == torch.int32


def test_input_rows_must_match_layout(generator: torch.Generator) -> None:
    runner, _ = _runner()
    layout = _layout((1, 2, 2))
    x = torch.randn(5, HIDDEN, generator=generator)
    with pytest.raises(ValueError, match="x has 5 rows but the layout describes 4 patches"):
        runner.run(x, layout, x, x)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"capacity": -1}, "capacity = -1"),
        ({"min_hits": 0}, "min_hits = 0"),
        ({"max_tokens": 0}, "max_tokens = 0"),
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
                errors.append(f"mismatch for {layout.grid_thw}")

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
    runner = ViTGraphRunner(_toy_forward_blocks, get_backend("sdpa"), mechanism=CudaGraphs())
    layout = _layout((1, 2, 4))
    x, cos, sin = _inputs(layout, generator)
    assert torch.equal(runner.run(x, layout, cos, sin), _eager(layout, x, cos, sin))
    assert runner.stats()["eager_runs"]["no_gpu"] == 1
    assert runner.stats()["pool_bytes"] == 0


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
    runner = tower.enable_graphs(capacity=8, mechanism=StandInGraphs())
    graphed = [tower(p, g) for p, g in zip(pixels, grids, strict=True)]
    tower.disable_graphs()
    assert all(torch.equal(a, b) for a, b in zip(eager, graphed, strict=True))
    assert (runner.stats()["captures"], runner.stats()["replays"]) == (graphs, len(grids))
    assert all(list(entry.cu_seqlens) == segmentations for entry in runner._graphs.values())


def test_tower_layouts_sharing_a_graph_differ_in_their_embedding_inputs() -> None:
    """The premise of TOWER_CASES' shared graphs: equal keys, other per-call embedding inputs."""
    for name, (first, second) in {"tiny": ((1, 4, 6), (1, 6, 4)), "qwen2.5-vl-tiny": ((1, 8, 16), (1, 16, 8))}.items():
        config = preset(name)
        tower = tower_class(config)(config, attention_backend="sdpa")
        a, b = (tower._prepare([grid], grid[1] * grid[2]) for grid in (first, second))
        assert a.layout.graph_key == b.layout.graph_key, name
        assert len(a.embed_inputs) == len(b.embed_inputs) > 0, name
        assert any(not torch.equal(x, y) for x, y in zip(a.embed_inputs, b.embed_inputs, strict=True)), name


def _toy_with_offsets(x, attn_args: dict, cos, sin, offsets: torch.Tensor) -> torch.Tensor:
    return _toy_forward_blocks(x, attn_args, cos, sin) + offsets


def test_further_inputs_get_static_buffers_copied_before_every_replay(generator: torch.Generator) -> None:
    runner = ViTGraphRunner(_toy_with_offsets, get_backend("sdpa"), mechanism=StandInGraphs())
    layout = _layout((1, 2, 4), (1, 2, 2))
    for _ in range(3):
        x, cos, sin = _inputs(layout, generator)
        offsets = torch.randn(layout.num_patches, 1, generator=generator)
        eager = _toy_with_offsets(x, {"full": [layout.seq_lens]}, cos, sin, offsets)
        assert torch.equal(runner.run(x, layout, cos, sin, offsets), eager)
    entry = _only_graph(runner)
    assert len(entry.inputs) == 1 and entry.inputs[0] is not offsets and entry.inputs[0].shape == offsets.shape
    assert len(entry.addresses) == len(entry.buffers()) == 6  # x, cos, sin, offsets, cu_seqlens, output
    assert (runner.stats()["captures"], runner.stats()["replays"]) == (1, 3)


def test_other_input_dtypes_get_their_own_graph(generator: torch.Generator) -> None:
    runner, _ = _runner()
    layout = _layout((1, 2, 4))
    x, cos, _ = _inputs(layout, generator)
    for angles in (cos, cos.double(), cos):
        eager = _eager(layout, x, angles, angles)
        out = runner.run(x, layout, angles, angles)
        assert out.dtype == eager.dtype and torch.equal(out, eager)
    assert (runner.stats()["captures"], runner.stats()["replays"]) == (2, 3)


class _RecordingSdpa(SdpaAttention):
    """sdpa that also records the ``cu_seqlens`` tensor each segmentation's list was built on."""

    def __init__(self) -> None:
        self.built_on: list[torch.Tensor] = []

    def runner_args(self, segmentation: Segmentation | VisionLayout, cu_seqlens: torch.Tensor) -> list:
        self.built_on.append(cu_seqlens)
        return super().runner_args(segmentation, cu_seqlens)


def _windowed_toy_forward_blocks(x: torch.Tensor, attn_args: dict, cos: torch.Tensor, sin: torch.Tensor):
    """A window "block" then a full one: the output depends on both segmentations' boundaries."""
    for name in ("window", "full"):
        (seq_lens,) = attn_args[name]
        x = x * cos[:, :HIDDEN] + torch.cat([part.cumsum(0) for part in x.split(list(seq_lens))]) + sin[:, :HIDDEN]
    return x


def _windowed(*grid: tuple[int, int, int]) -> VisionLayout:
    return VisionLayout.from_grid_thw(list(grid), window_merge_blocks=4)


def test_windowed_layout_gets_a_static_cu_seqlens_buffer_per_segmentation(generator: torch.Generator) -> None:
    backend = _RecordingSdpa()
    runner = ViTGraphRunner(_windowed_toy_forward_blocks, backend, mechanism=StandInGraphs())
    layout = _windowed((1, 12, 20), (1, 4, 4))
    for _ in range(2):
        x, cos, sin = _inputs(layout, generator)
        eager_args = {name: [seg.seq_lens] for name, seg in layout.segmentations.items()}
        assert torch.equal(runner.run(x, layout, cos, sin), _windowed_toy_forward_blocks(x, eager_args, cos, sin))
    entry = _only_graph(runner)
    assert list(entry.cu_seqlens) == ["full", "window"]
    for name, buffer in entry.cu_seqlens.items():
        assert buffer.dtype == torch.int32
        assert buffer.tolist() == list(layout.segmentations[name].cu_seqlens)
        assert buffer is not layout.cu_seqlens_tensor("cpu", name)  # the graph's own copy, not the layout's
    # The captured argument lists were built on exactly those static buffers.
    assert [id(cu) for cu in backend.built_on] == [id(cu) for cu in entry.cu_seqlens.values()]
    assert len(entry.addresses) == len(entry.buffers()) == 6


def test_moved_window_cu_seqlens_drops_the_graph(generator: torch.Generator) -> None:
    runner = ViTGraphRunner(_windowed_toy_forward_blocks, get_backend("sdpa"), mechanism=StandInGraphs())
    layout = _windowed((1, 12, 20))
    runner.run(*_with_layout(layout, generator))
    entry = _only_graph(runner)
    entry.cu_seqlens["window"] = entry.cu_seqlens["window"].clone()
    runner.run(*_with_layout(layout, generator))
    assert runner.stats()["graphs"] == 0
    assert runner.stats()["eager_runs"]["capture_failed"] == 1


def test_equal_token_counts_with_other_windows_get_their_own_graph(generator: torch.Generator) -> None:
    runner = ViTGraphRunner(_windowed_toy_forward_blocks, get_backend("sdpa"), mechanism=StandInGraphs())
    wide, squarer = _windowed((1, 8, 24)), _windowed((1, 12, 16))
    assert wide.cu_seqlens == squarer.cu_seqlens
    for layout in (wide, squarer, wide, squarer):
        x, cos, sin = _inputs(layout, generator)
        eager_args = {name: [seg.seq_lens] for name, seg in layout.segmentations.items()}
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
