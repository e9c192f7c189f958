"""The padded path on CPU: the static rule, padded layouts, and the runner and tower serving them.

Graphs are the stand-in of ``test_graph_runner``: a replay re-runs the captured function on what the
graph reads (staging and its offsets), so offsets not brought up to date show up as wrong results.
The attention here reads its segment offsets from the offsets tensor when it runs, as a GPU varlen
kernel reads them from device memory.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping

import pytest
import torch
from rocm_vit.backends.sdpa import sdpa_varlen
from test_graph_runner import HIDDEN, StandInGraphs, on_the_capture_stream, record_offsets_reaching_the_device

from rocm_vit.attention import SdpaAttention, VarlenArgs
from rocm_vit.graphs import ViTGraphRunner
from rocm_vit.graphs.cost import CostModel
from rocm_vit.graphs.forward import Forward
from rocm_vit.graphs.options import RunnerOptions
from rocm_vit.graphs.padding import GRANULE, LADDER_RATIO, Padding, bucket_ladder
from rocm_vit.layout import AttentionLayout, PaddedLayout, VisionLayout
from rocm_vit.models import preset, tower_class

# A host that launches a 27-block tower in 10 ms (the default model): small calls are launch-bound.
MODEL = CostModel()


def _layout(*grid: tuple[int, int, int]) -> AttentionLayout:
    return VisionLayout.from_grid_thw(list(grid)).attention


def test_the_ladder_rises_by_its_ratio_or_one_granule_in_whole_granules() -> None:
    ladder = bucket_ladder(8192)
    assert ladder[0] == 256 and ladder[-1] <= 8192 and ladder[-1] * LADDER_RATIO > 8192
    assert all(size % GRANULE == 0 for size in ladder)
    assert all(
        small < large <= max(small * LADDER_RATIO, small + GRANULE) for small, large in itertools.pairwise(ladder)
    )


def test_a_small_layout_is_padded_to_the_next_bucket_by_a_segment_of_its_own() -> None:
    layout = _layout((1, 16, 20), (1, 4, 4))  # 336 tokens
    padded = Padding(MODEL, 8192).padded(layout)
    assert isinstance(padded, PaddedLayout) and padded.num_patches == 384 and padded.real_patches == 336
    full = padded.segmentations["full"]
    assert full.seq_lens == (320, 16, 48) and full.cu_seqlens == (0, 320, 336, 384) and full.max_seqlen == 384
    # Every layout of that token bucket and segment count shares the graph key; others do not.
    assert Padding(MODEL, 8192).padded(_layout((1, 8, 40), (1, 2, 8))).graph_key == padded.graph_key
    assert Padding(MODEL, 8192).padded(_layout((1, 18, 20))).graph_key != padded.graph_key


@pytest.mark.parametrize(
    ("grid", "why"),
    [
        ([(1, 96, 96)], "9,216 tokens: past the last bucket"),
        ([(1, 64, 76)], "4,864 tokens: device-bound, no graph saves anything"),
        ([(1, 8, 8)] * 3, "three images: more than the start captures buckets for (MAX_PADDED_SEGMENTS)"),
    ],
)
def test_layouts_where_padding_does_not_pay_run_as_they_are(grid: list, why: str) -> None:
    assert Padding(MODEL, 8192).padded(_layout(*grid)) is None, why


def test_a_layout_whose_padding_would_eat_most_of_its_saving_keeps_its_own_shape() -> None:
    """2.4 us a token on the device, 10 ms to launch: 3,500 tokens save 3.0 ms replayed as they are, and
    1.9 ms (62 %) padded to 3,968; 3,920 tokens padded to 3,968 keep 94 % of theirs."""
    model = CostModel(
        blocks=1, launch_ms=10.0, device_base_ms=0.0, device_ms_per_token=2.4e-3, device_ms_per_square=0.0
    )
    padding = Padding(model, 8192)
    assert padding.padded(_layout((1, 50, 70))) is None
    assert padding.padded(_layout((1, 56, 70))).num_patches == 3968


def test_the_rule_reads_the_layout_alone() -> None:
    """Not the cache, not the launch time measured while serving: the same layout, the same answer."""
    padding = Padding(MODEL, 8192)
    rng = random.Random(0)
    for _ in range(200):
        grid = [(1, 2 * rng.randint(1, 40), 2 * rng.randint(1, 40)) for _ in range(rng.randint(1, 4))]
        first, again = padding.padded(_layout(*grid)), padding.padded(_layout(*grid))
        assert (first is None) == (again is None)
        assert first is None or first.segmentations == again.segmentations


def test_a_repeated_layout_gets_the_same_padded_layout_so_its_offsets_reach_the_device_once() -> None:
    padding = Padding(MODEL, 8192)
    first = padding.padded(_layout((1, 16, 20), (1, 4, 4)))
    assert padding.padded(_layout((1, 16, 20), (1, 4, 4))) is first
    assert first.cu_seqlens_tensor("cpu") is padding.padded(_layout((1, 16, 20), (1, 4, 4))).cu_seqlens_tensor("cpu")


def test_windowed_and_already_padded_layouts_are_not_padded() -> None:
    windowed = VisionLayout.from_grid_thw([(1, 8, 8)], window_merge_blocks=4).attention
    padding = Padding(MODEL, 8192)
    assert padding.padded(windowed) is None
    assert padding.padded(padding.padded(_layout((1, 8, 8)))) is None
    with pytest.raises(ValueError, match="must exceed"):
        PaddedLayout(_layout((1, 8, 8)), 64)


def _varlen_forward(x: torch.Tensor, attn_args: dict, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Per-segment prefix sums, with the offsets read from the offsets tensor when it runs."""
    offsets = attn_args["full"].cu_seqlens.tolist()
    lengths = [end - start for start, end in itertools.pairwise(offsets)]
    return torch.cat([part.cumsum(0) for part in x.split(lengths)]) * cos[:, :HIDDEN] + sin[:, :HIDDEN]


class _RecordingVarlen:
    """``layout_args`` of a varlen kernel (``per_call_args`` for a padded layout); records each offsets tensor."""

    def __init__(self) -> None:
        self.built_on: list[torch.Tensor] = []

    def __call__(self, layout: AttentionLayout, cu_seqlens: Mapping[str, torch.Tensor]) -> dict[str, VarlenArgs]:
        self.built_on.extend(cu_seqlens.values())
        return {name: VarlenArgs(cu_seqlens[name], seg.max_seqlen) for name, seg in layout.segmentations.items()}


def _padded_runner(
    mechanism: StandInGraphs | None = None, **kwargs
) -> tuple[ViTGraphRunner, _RecordingVarlen, StandInGraphs]:
    layout_args, mechanism = _RecordingVarlen(), mechanism or StandInGraphs()
    options = RunnerOptions(min_hits=1, padding_model=MODEL, **kwargs)
    runner = ViTGraphRunner(_varlen_forward, layout_args, options, mechanism=mechanism)
    return runner, layout_args, mechanism


def _inputs(tokens: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    return tuple(torch.randn(tokens, HIDDEN, generator=generator) for _ in range(3))


def test_layouts_of_one_bucket_share_a_graph_and_each_replay_reads_its_own_offsets(generator) -> None:
    runner, _, mechanism = _padded_runner()
    # 336 tokens in two segments, three ways, alternating: one graph of 384 tokens.
    layouts = [_layout((1, 16, 20), (1, 4, 4)), _layout((1, 4, 4), (1, 16, 20)), _layout((1, 8, 40), (1, 2, 8))]
    for layout in layouts * 3:
        x, cos, sin = _inputs(layout.num_patches, generator)
        out = runner.run(x, layout, cos, sin)
        assert torch.equal(out, runner.run_eager(x, layout, cos, sin))
        # The real rows equal the unpadded function's: padding is a segment of its own.
        assert torch.equal(out, _varlen_forward(x, {"full": VarlenArgs(layout.cu_seqlens_tensor("cpu"), 0)}, cos, sin))
    stats = runner.stats()
    assert (stats["captures"], stats["replays"]) == (1, 9) and mechanism.events.count("capture") == 1


def test_a_padded_graphs_first_offsets_reach_the_device_on_the_callers_stream(generator, monkeypatch) -> None:
    """As an exact graph's (test_graph_runner): a layout's pinned offsets are never copied on the capture stream."""
    mechanism = StandInGraphs()
    runner, _, _ = _padded_runner(mechanism=mechanism)
    record_offsets_reaching_the_device(monkeypatch, mechanism)
    layout = _layout((1, 16, 20))
    x, cos, sin = _inputs(layout.num_patches, generator)
    runner.run(x, layout, cos, sin)
    assert mechanism.events.count("capture") == 1 and "cu_seqlens_tensor" in mechanism.events
    assert on_the_capture_stream(mechanism.events) == []


def test_a_padded_graphs_kernels_read_offsets_a_kernel_of_the_graph_wrote(generator) -> None:
    """The copy before each replay lands in the graph's offsets input; what the attention reads is a
    copy of it made inside the graph (no copy engine writes what a kernel reads with scalar loads)."""
    runner, layout_args, _ = _padded_runner()
    layout = _layout((1, 16, 20), (1, 4, 4))
    x, cos, sin = _inputs(layout.num_patches, generator)
    runner.run(x, layout, cos, sin)
    (graph,) = runner._store.graphs.values()
    assert graph.offsets_per_call
    read = layout_args.built_on[-1]
    assert read.data_ptr() != graph.offsets["full"].data_ptr() and torch.equal(read, graph.offsets["full"])


def test_without_the_copy_before_replay_a_padded_graph_replays_stale_offsets(generator, monkeypatch) -> None:
    """The bug put back: a replay that does not bring the offsets up to date computes the first layout's."""
    runner, _, _ = _padded_runner()
    first, second = _layout((1, 16, 20), (1, 4, 4)), _layout((1, 4, 4), (1, 16, 20))
    runner.run(*_with(first, generator))
    monkeypatch.setattr(Forward, "_write_offsets", staticmethod(lambda entry, layout: None))
    x, cos, sin = _inputs(second.num_patches, generator)
    assert not torch.equal(runner.run(x, second, cos, sin), runner.run_eager(x, second, cos, sin))


def test_a_padded_replay_pads_in_staging_with_zeros_even_where_a_larger_call_wrote_before(
    generator, monkeypatch
) -> None:
    """A replay copies the real rows into staging and zeroes its padding rows there, with no padded
    copies of the inputs (each is an allocation and two launches on the request's path); the whole
    padded output, padding rows too, is what the eager run of the padded inputs computes."""
    from rocm_vit.graphs import call as runner_module  # where padded copies are made

    runner, _, _ = _padded_runner()
    bucket_layout, larger = _layout((1, 16, 20), (1, 4, 4)), _layout((1, 64, 72))  # 336 -> 384; 4608 exact
    assert runner.padding.padded(larger) is None
    runner.run(*_with(bucket_layout, generator))
    runner.run(*_with(larger, generator))  # its graph's staging rows are those the padding reads
    padded_copies = []
    pad_rows = runner_module.pad_rows
    monkeypatch.setattr(runner_module, "pad_rows", lambda *args: padded_copies.append(args) or pad_rows(*args))
    layout = _layout((1, 4, 4), (1, 16, 20))
    x, cos, sin = _inputs(layout.num_patches, generator)
    replays = runner.stats()["replays"]
    out = runner.run(x, layout, cos, sin)
    assert runner.stats()["replays"] == replays + 1 and padded_copies == []
    padded = runner.padding.padded(layout)
    entry = runner._store.graphs[next(key for key in runner._store.graphs if key[0] == padded.graph_key)]
    eager = runner._forward.eager(
        tuple(pad_rows(t, layout.num_patches, padded.num_patches) for t in (x, cos, sin)), padded
    )
    assert torch.equal(entry.output, eager) and torch.equal(out, eager[: layout.num_patches])


def _with(layout: AttentionLayout, generator: torch.Generator) -> tuple:
    x, cos, sin = _inputs(layout.num_patches, generator)
    return x, layout, cos, sin


class _DeviceOffsetsSdpa(SdpaAttention):
    """SDPA per segment, its offsets read from the offsets tensor when it runs (a varlen kernel's way)."""

    @property
    def reads_offsets_on_device(self) -> bool:
        return True

    def per_call_args(self, cu_seqlens: torch.Tensor, max_seqlen: int) -> VarlenArgs:
        return VarlenArgs(cu_seqlens, max_seqlen)

    def __call__(self, q, k, v, attn_args, scale):
        if isinstance(attn_args, VarlenArgs):
            offsets = attn_args.cu_seqlens.tolist()
            lengths = tuple(end - start for start, end in itertools.pairwise(offsets))
            return sdpa_varlen(q, k, v, lengths, scale)
        return super().__call__(q, k, v, attn_args, scale)


@pytest.mark.parametrize("mode", ["inference_mode", "no_grad"])
def test_a_tower_serving_padded_graphs_equals_its_eager_calls_bitwise_and_the_unpadded_tower_closely(
    mode: str, generator
) -> None:
    """In either grad mode a server runs under (the capture inside the call takes its mode), every
    graph verified against its warm-up: none unverified, none failed."""
    config = preset("tiny")
    tower = tower_class(config)(config, attention_backend="sdpa").eval()
    tower.attention = _DeviceOffsetsSdpa()
    for block in tower.blocks:
        block.attn.backend = tower.attention
    width = config.in_channels * config.temporal_patch_size * config.patch_size**2
    rng = random.Random(0)
    # One image or two: the calls padding serves (MAX_PADDED_SEGMENTS).
    grids = [[(1, 2 * rng.randint(1, 12), 2 * rng.randint(1, 12)) for _ in range(rng.randint(1, 2))] for _ in range(24)]
    pixels = [torch.randn(sum(t * h * w for t, h, w in grid), width, generator=generator) for grid in grids]
    grad_mode = torch.inference_mode if mode == "inference_mode" else torch.no_grad
    with grad_mode():
        unpadded = [tower(p, g) for p, g in zip(pixels, grids, strict=True)]
    runner = tower.enable_graphs(min_hits=1, mechanism=StandInGraphs())
    with grad_mode():
        for p, g, reference in zip(pixels * 2, grids * 2, unpadded * 2, strict=True):
            out = tower(p, g)
            assert torch.equal(out, tower(p, g, use_graphs=False))
            torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5)
    stats = runner.stats()
    assert stats["replays"] > 0 and stats["captures"] < len(set(map(str, grids)))  # layouts shared graphs
    assert stats["eager_runs"]["capture_unverified"] == stats["eager_runs"]["capture_failed"] == 0
    assert all(graph.offsets_per_call for graph in runner._store.graphs.values())


def test_padding_follows_by_benefit_unless_asked_for() -> None:
    config = preset("tiny")
    tower = tower_class(config)(config, attention_backend="sdpa").eval()
    tower.attention = _DeviceOffsetsSdpa()
    options = {"mechanism": StandInGraphs()}
    assert tower.enable_graphs(**options).padding is not None
    assert tower.enable_graphs(by_benefit=False, **options).padding is None  # bench, tune: exact layouts
    assert tower.enable_graphs(by_benefit=False, padded=True, **options).padding is not None  # verify --padded
    assert tower.enable_graphs(padded=False, **options).padding is None


def test_a_backend_that_needs_host_lengths_is_never_padded() -> None:
    config = preset("tiny")
    tower = tower_class(config)(config, attention_backend="sdpa").eval()
    runner = tower.enable_graphs(mechanism=StandInGraphs())
    assert runner.padding is None
    with pytest.raises(ValueError, match="needs host segment lengths"):
        SdpaAttention().per_call_args(torch.zeros(2, dtype=torch.int32), 4)


def test_bucket_call_grids_give_one_image_and_two_per_bucket_the_rule_pads_them_to() -> None:
    padding = Padding(MODEL, 8192)
    calls = padding.bucket_call_grids(merge=2)
    reached = {}  # images per call -> buckets, in order
    for grids in calls:
        padded = padding.padded(VisionLayout.from_grid_thw(grids).attention)
        for _, rows, columns in grids:
            assert rows % 2 == columns % 2 == 0 and max(rows, columns) <= 4 * min(rows, columns)
        assert padded.graph_key == ("padded", padded.num_patches, len(grids) + 1)  # the images and the padding
        reached.setdefault(len(grids), []).append(padded.num_patches)
    assert set(reached) == {1, 2}
    for buckets in reached.values():
        assert buckets == sorted(set(buckets))  # one each, in order
    assert reached[1][0] == padding.buckets[0]
    # Every bucket a layout of one image or two is padded to has its call: none is left for a first
    # request, where chat's calls of two images would otherwise capture several in the stream.
    rng = random.Random(0)
    for _ in range(1000):
        for images in (1, 2):
            grids = [(1, 2 * rng.randint(1, 40), 2 * rng.randint(1, 40)) for _ in range(images)]
            padded = padding.padded(_layout(*grids))
            assert padded is None or padded.num_patches in reached[images]


def test_a_tower_captures_its_padded_buckets_before_serving_and_its_first_requests_replay_them(generator) -> None:
    config = preset("tiny")
    tower = tower_class(config)(config, attention_backend="sdpa").eval()
    assert tower.capture_padded_buckets() == 0  # no graphs yet
    tower.attention = _DeviceOffsetsSdpa()
    for block in tower.blocks:
        block.attn.backend = tower.attention
    # Three buckets (256, 320, 384), not the default ladder's fifteen up to 6,656 tokens: minutes on a CPU.
    runner = tower.enable_graphs(max_tokens=384, mechanism=StandInGraphs())
    prepared = []
    tower.attention.prepare = lambda *shape: prepared.append(shape)
    with torch.no_grad():  # as the calls after it
        captured = tower.capture_padded_buckets()
    assert captured == len(runner.padding.bucket_call_grids(2)) == runner.stats()["captures"] > 0
    # The attention kernels' variants compile first, for the tower's shape (prepare_kernels).
    heads = config.num_heads
    assert prepared == [(config.head_dim, heads, heads, tower.dtype, tower.device)]
    width = config.in_channels * config.temporal_patch_size * config.patch_size**2
    grid = [(1, 14, 14)]  # 196 tokens: a bucket's, not a grid bucket_call_grids picked
    pixels = torch.randn(196, width, generator=generator)
    replays = runner.stats()["replays"]  # each capture's call was served by its graph's first replay
    with torch.no_grad():
        out = tower(pixels, grid)
        assert runner.stats()["replays"] == replays + 1 and runner.stats()["captures"] == captured
        assert torch.equal(out, tower(pixels, grid, use_graphs=False))
    tower.enable_graphs(by_benefit=False, mechanism=StandInGraphs())  # exact layouts only: no buckets
    assert tower.capture_padded_buckets() == 0
