"""VisionLayout: host-side attention layout, graph keys, input validation, rotary and position taps."""

from __future__ import annotations

import itertools

import pytest
import torch

from rocm_vit.layout import Segmentation, VisionLayout
from rocm_vit.models.positions import position_embedding_taps, rotary_position_ids

transformers = pytest.importorskip("transformers")
from transformers.vision_utils import (  # noqa: E402
    get_vision_cu_seqlens,
    get_vision_interpolation_indices_and_weights,
    get_vision_position_ids,
)

MIXED = [(1, 4, 6), (2, 4, 4), (1, 2, 2)]  # image, video of two frames, image

LAYOUTS = {
    "single_image": [(1, 8, 12)],
    "several_images": [(1, 4, 4), (1, 8, 6), (1, 2, 10), (1, 6, 6)],
    "video_t2": [(2, 6, 8)],
    "images_and_videos": MIXED,
    "odd_merged_sides": [(1, 6, 10), (3, 2, 6)],
}


def test_mixed_images_and_videos_give_one_segment_per_frame() -> None:
    layout = VisionLayout.from_grid_thw(MIXED)
    assert layout.seq_lens == (24, 16, 16, 4)
    assert layout.cu_seqlens == (0, 24, 40, 56, 60)
    assert layout.max_seqlen == 24
    assert layout.num_patches == 60
    assert layout.num_merged_tokens == 15
    assert layout.graph_key == ("full", (0, 24, 40, 56, 60), 24)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_cu_seqlens_equal_transformers(name: str) -> None:
    grid = LAYOUTS[name]
    layout = VisionLayout.from_grid_thw(grid)
    assert list(layout.cu_seqlens) == get_vision_cu_seqlens(torch.tensor(grid)).tolist()
    assert layout.max_seqlen == max(h * w for _, h, w in grid)


def test_cpu_tensor_and_list_give_the_same_layout() -> None:
    from_list = VisionLayout.from_grid_thw(MIXED)
    for dtype in (torch.int64, torch.int32):
        from_tensor = VisionLayout.from_grid_thw(torch.tensor(MIXED, dtype=dtype))
        assert from_tensor == from_list
        assert from_tensor.graph_key == from_list.graph_key


def test_equal_token_counts_with_other_boundaries_get_other_graph_keys() -> None:
    grids = [[(1, 8, 8)], [(1, 4, 8), (1, 4, 8)], [(2, 4, 8)], [(1, 4, 4), (1, 4, 12)], [(1, 4, 12), (1, 4, 4)]]
    layouts = [VisionLayout.from_grid_thw(grid) for grid in grids]
    assert {layout.num_patches for layout in layouts} == {64}
    assert len({layout.graph_key for layout in layouts}) == len(grids) - 1
    # A video of two frames and two images of that frame size attend identically: one graph serves both.
    assert layouts[1].graph_key == layouts[2].graph_key


def test_graph_key_is_hashable_and_stable() -> None:
    first, second = VisionLayout.from_grid_thw(MIXED), VisionLayout.from_grid_thw(list(MIXED))
    assert hash(first.graph_key) == hash(second.graph_key)
    assert {first.graph_key: 1}[second.graph_key] == 1


def test_cu_seqlens_tensor_is_int32_and_made_once_per_device() -> None:
    layout = VisionLayout.from_grid_thw(MIXED)
    cu_seqlens = layout.cu_seqlens_tensor("cpu")
    assert cu_seqlens.dtype == torch.int32
    assert cu_seqlens.tolist() == list(layout.cu_seqlens)
    assert layout.cu_seqlens_tensor(torch.device("cpu")) is cu_seqlens


def test_num_patches_must_match_pixel_rows() -> None:
    VisionLayout.from_grid_thw(MIXED, num_patches=60)
    with pytest.raises(ValueError, match=r"pixel_values has 59 rows .* describes 60 patches"):
        VisionLayout.from_grid_thw(MIXED, num_patches=59)


@pytest.mark.parametrize(
    ("grid", "message"),
    [
        ([(0, 4, 4)], r"grid_thw\[0\]\.t = 0 must be positive"),
        ([(1, 4, 4), (1, -2, 4)], r"grid_thw\[1\]\.h = -2 must be positive"),
        ([(1, 4, 4), (1, 4, 4), (1, 4, 0)], r"grid_thw\[2\]\.w = 0 must be positive"),
        ([(1, 4, 4), (-1, 4, 4)], r"grid_thw\[1\]\.t = -1 must be positive"),
    ],
)
def test_non_positive_sizes_are_refused(grid: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        VisionLayout.from_grid_thw(grid)


@pytest.mark.parametrize(
    ("grid", "merge", "message"),
    [
        ([(1, 7, 4)], 2, r"grid_thw\[0\]\.h = 7 is not divisible by spatial_merge_size 2"),
        ([(1, 4, 4), (1, 4, 6)], 4, r"grid_thw\[1\]\.w = 6 is not divisible by spatial_merge_size 4"),
        ([(2, 6, 8)], 3, r"grid_thw\[0\]\.w = 8 is not divisible by spatial_merge_size 3"),
    ],
)
def test_sides_not_divisible_by_merge_size_are_refused(grid: list, merge: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        VisionLayout.from_grid_thw(grid, merge)


@pytest.mark.parametrize("merge", [0, -2, 2.0, "2"])
def test_bad_spatial_merge_size_is_refused(merge: object) -> None:
    with pytest.raises(ValueError, match=rf"spatial_merge_size = {merge!r}"):
        VisionLayout.from_grid_thw(MIXED, merge)


def test_device_tensor_is_refused_without_reading_it() -> None:
    # A meta tensor stands in for a GPU tensor: it has a non-CPU device and no data to read.
    grid = torch.tensor(MIXED).to("meta")
    with pytest.raises(ValueError, match=r"grid_thw is on meta; pass host data .* device-to-host sync"):
        VisionLayout.from_grid_thw(grid)


def test_cuda_tensor_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    grid = torch.tensor(MIXED)
    monkeypatch.setattr(torch.Tensor, "device", property(lambda self: torch.device("cuda", 0)))
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: pytest.fail("read a device tensor"))
    with pytest.raises(ValueError, match=r"grid_thw is on cuda:0; pass host data"):
        VisionLayout.from_grid_thw(grid)


@pytest.mark.parametrize(
    ("grid", "message"),
    [
        (torch.tensor([[1.0, 4.0, 4.0]]), r"grid_thw has dtype torch\.float32; expected an integer tensor"),
        (torch.tensor([[True, True, True]]), r"grid_thw\[0\] = \[True, True, True\] must hold integers"),
        (torch.tensor([1, 4, 4]), r"grid_thw has shape \(3,\); expected \[num_items, 3\]"),
        (torch.tensor([[1, 4, 4, 1]]), r"grid_thw has shape \(1, 4\); expected \[num_items, 3\]"),
        (torch.zeros(0, 3, dtype=torch.int64), r"grid_thw is empty"),
        ([], r"grid_thw is empty"),
        ([(1, 4)], r"grid_thw\[0\] = \(1, 4\) must be a \(t, h, w\) triple"),
        ([(1, 4, 4), (1, 4, 4, 4)], r"grid_thw\[1\] = \(1, 4, 4, 4\) must be a \(t, h, w\) triple"),
        ([(1, 4.0, 4)], r"grid_thw\[0\] = \(1, 4\.0, 4\) must hold integers"),
        ([(1, 4, "4")], r"grid_thw\[0\] = \(1, 4, '4'\) must hold integers"),
        ([(1, 4, 4), (True, 4, 4)], r"grid_thw\[1\] = \(True, 4, 4\) must hold integers"),
        ([(1, 4, None)], r"grid_thw\[0\] = \(1, 4, None\) must hold integers"),
    ],
    ids=[
        "float_tensor",
        "bool_tensor",
        "1d_tensor",
        "four_columns",
        "empty_tensor",
        "empty_list",
        "pair",
        "quadruple",
        "float_entry",
        "str_entry",
        "bool_entry",
        "none_entry",
    ],
)
def test_malformed_grid_is_refused_naming_the_value(grid: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        VisionLayout.from_grid_thw(grid)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_rotary_position_ids_equal_transformers(name: str) -> None:
    grid = LAYOUTS[name]
    ours = rotary_position_ids(VisionLayout.from_grid_thw(grid))
    expected = get_vision_position_ids(torch.tensor(grid), 2)
    assert ours.dtype == torch.int64
    assert ours.shape == (sum(t * h * w for t, h, w in grid), 2)
    assert torch.equal(ours, expected)


@pytest.mark.parametrize("name", list(LAYOUTS))
@pytest.mark.parametrize("side", [16, 48])
def test_position_embedding_taps_match_transformers(name: str, side: int) -> None:
    """Same taps in the same order; weights differ in the last bits (docs/numerics.md)."""
    grid = LAYOUTS[name]
    indices, weights = position_embedding_taps(VisionLayout.from_grid_thw(grid), side)
    expected_indices, expected_weights = get_vision_interpolation_indices_and_weights(
        torch.tensor(grid), side, mode="bilinear", align_corners=True, spatial_merge_size=2
    )
    num_patches = sum(t * h * w for t, h, w in grid)
    assert indices.shape == weights.shape == (num_patches, 4)
    assert (indices.dtype, weights.dtype) == (torch.int64, torch.float32)
    assert torch.equal(indices, expected_indices)
    torch.testing.assert_close(weights, expected_weights, rtol=0, atol=1e-5)
    torch.testing.assert_close(weights.sum(1), torch.ones(num_patches), rtol=0, atol=1e-5)


# Qwen2.5-VL windows: 112 px = 4 merge blocks of 2 x 14 px per side (8 x 8 patches).
WINDOW_MERGE_BLOCKS = 4
WINDOW_LAYOUTS = {
    "exact_windows": [(1, 16, 16)],
    "partial_windows": [(1, 12, 20)],
    "smaller_than_a_window": [(1, 2, 2), (1, 6, 4)],
    "video_t2": [(2, 10, 14)],
    "images_and_videos": [(1, 18, 10), (3, 8, 12), (1, 4, 4)],
}


def _windowed(grid: list) -> VisionLayout:
    return VisionLayout.from_grid_thw(grid, window_merge_blocks=WINDOW_MERGE_BLOCKS)


@pytest.mark.parametrize("name", list(WINDOW_LAYOUTS))
def test_windows_equal_transformers(name: str) -> None:
    from transformers.vision_utils import get_vision_window_index

    grid = WINDOW_LAYOUTS[name]
    layout = _windowed(grid)
    window_index, cu_window_seqlens = get_vision_window_index(
        torch.tensor(grid), spatial_merge_size=2, window_size=112, patch_size=14
    )
    assert torch.equal(layout.window_index, window_index)
    assert list(layout.cu_window_seqlens) == cu_window_seqlens.tolist()
    assert layout.max_window_seqlen == max(layout.window_seq_lens)
    assert sum(layout.window_seq_lens) == layout.num_patches
    # The full segmentation is the one a non-windowed layout has.
    assert layout.segmentations["full"] == VisionLayout.from_grid_thw(grid).segmentations["full"]


def test_partial_windows_have_the_leftover_sizes() -> None:
    layout = _windowed([(1, 12, 20)])  # 6 x 10 merge blocks: windows of 4 x 4, 4 x 4, 4 x 2, then 2 x 4 ...
    assert layout.window_seq_lens == tuple(4 * blocks for blocks in (16, 16, 8, 8, 8, 4))
    assert layout.max_window_seqlen == 64
    # Merge blocks 4..9 of the first row belong to later windows: the permutation is not the identity.
    assert layout.window_index[:6].tolist() == [0, 1, 2, 3, 10, 11]


@pytest.mark.parametrize("name", list(WINDOW_LAYOUTS))
def test_each_window_is_one_square_of_one_frame(name: str) -> None:
    layout = _windowed(WINDOW_LAYOUTS[name])
    frame_of_patch = torch.repeat_interleave(torch.arange(len(layout.seq_lens)), torch.tensor(layout.seq_lens))
    frames = layout.to_window_order(frame_of_patch)
    positions = layout.to_window_order(rotary_position_ids(layout))
    for start, end in itertools.pairwise(layout.cu_window_seqlens):
        assert frames[start:end].unique().numel() == 1
        window_cell = positions[start:end] // (2 * WINDOW_MERGE_BLOCKS)  # which 8 x 8 patch square
        assert window_cell.unique(dim=0).shape[0] == 1


@pytest.mark.parametrize("name", list(WINDOW_LAYOUTS))
def test_window_permutation_and_inverse_round_trip(name: str) -> None:
    layout = _windowed(WINDOW_LAYOUTS[name])
    num_blocks = layout.num_merged_tokens
    assert torch.equal(layout.window_index[layout.window_inverse], torch.arange(num_blocks))
    assert torch.equal(layout.window_inverse[layout.window_index], torch.arange(num_blocks))
    tokens = torch.arange(layout.num_patches)
    in_windows = layout.to_window_order(tokens[:, None])
    # Whole merge blocks move: merging four tokens per row and restoring gives the blocks in order.
    restored = layout.from_window_order(in_windows.view(num_blocks, 4))
    assert torch.equal(restored, tokens.view(num_blocks, 4))


def test_windowed_segmentations_and_their_cu_seqlens_tensors() -> None:
    layout = _windowed([(1, 12, 20)])
    assert list(layout.segmentations) == ["full", "window"]
    assert layout.segmentations["window"].cu_seqlens == layout.cu_window_seqlens
    window_cu = layout.cu_seqlens_tensor("cpu", "window")
    assert window_cu.dtype == torch.int32
    assert window_cu.tolist() == list(layout.cu_window_seqlens)
    assert layout.cu_seqlens_tensor(torch.device("cpu"), "window") is window_cu
    assert layout.cu_seqlens_tensors("cpu") == {"full": layout.cu_seqlens_tensor("cpu"), "window": window_cu}
    with pytest.raises(ValueError, match=r"segmentation = 'windows' is not one of this layout's \['full', 'window'\]"):
        layout.cu_seqlens_tensor("cpu", "windows")


def test_layout_without_windows_is_unchanged() -> None:
    layout = VisionLayout.from_grid_thw(MIXED)
    assert list(layout.segmentations) == ["full"]
    assert layout.graph_key == ("full", (0, 24, 40, 56, 60), 24)
    assert layout.cu_window_seqlens is None and layout.window_index is None
    with pytest.raises(ValueError, match=r"segmentation = 'window' is not one of this layout's \['full'\]"):
        layout.cu_seqlens_tensor("cpu", "window")
    with pytest.raises(ValueError, match="window_index: this layout has no windows"):
        layout.to_window_order(torch.zeros(60, 1))


def test_windowed_graph_key_covers_both_segmentations() -> None:
    layout = _windowed([(1, 8, 24)])
    assert layout.graph_key == ("full", (0, 192), 192, "window", (0, 64, 128, 192), 64)
    assert layout.graph_key != VisionLayout.from_grid_thw([(1, 8, 24)]).graph_key


def test_equal_token_counts_with_other_window_boundaries_get_other_graph_keys() -> None:
    # One frame of 192 patches each, so the full segmentation is the same; the windows differ.
    wide, squarer = _windowed([(1, 8, 24)]), _windowed([(1, 12, 16)])
    assert (wide.cu_seqlens, wide.max_seqlen) == (squarer.cu_seqlens, squarer.max_seqlen)
    assert wide.cu_window_seqlens != squarer.cu_window_seqlens
    assert wide.graph_key != squarer.graph_key
    # Transposed grids cut into the same windows: the blocks compute the same thing, one graph serves both.
    assert _windowed([(1, 16, 8)]).graph_key == _windowed([(1, 8, 16)]).graph_key


@pytest.mark.parametrize("window", [0, -4, 4.0, "4"])
def test_bad_window_merge_blocks_is_refused(window: object) -> None:
    with pytest.raises(ValueError, match=rf"window_merge_blocks = {window!r} must be a positive int or None"):
        VisionLayout.from_grid_thw(MIXED, window_merge_blocks=window)


def test_windowed_layout_still_validates_the_grid() -> None:
    with pytest.raises(ValueError, match=r"grid_thw\[0\]\.h = 7 is not divisible by spatial_merge_size 2"):
        _windowed([(1, 7, 4)])
    with pytest.raises(ValueError, match=r"pixel_values has 5 rows .* describes 16 patches"):
        VisionLayout.from_grid_thw([(1, 4, 4)], num_patches=5, window_merge_blocks=4)


def test_segmentation_from_offsets_keeps_the_offsets_as_given() -> None:
    assert Segmentation.from_offsets([0, 16, 48]) == Segmentation.from_lengths([16, 32])
    # SGLang's Qwen2.5-VL offsets start with an empty segment: kept, so kernels see the same list.
    assert Segmentation.from_offsets(torch.tensor([0, 0, 32, 56])) == Segmentation((0, 32, 24), (0, 0, 32, 56), 32)


@pytest.mark.parametrize(
    ("offsets", "message"),
    [
        ([0], r"cu_seqlens = \(0,\) must start at 0"),
        ([4, 8], r"cu_seqlens = \(4, 8\) must start at 0"),
        ([0, 8, 4], r"cu_seqlens\[2\] = 4 is below cu_seqlens\[1\]"),
    ],
)
def test_segmentation_from_offsets_refuses_bad_offsets(offsets: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Segmentation.from_offsets(offsets)
