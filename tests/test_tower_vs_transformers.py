"""The reference tower against transformers' Qwen3VLVisionModel: same weights, fp32, CPU."""

from __future__ import annotations

import pytest
import torch

from rocm_vit.models import Qwen3VLVisionTower, VisionConfig, preset

transformers = pytest.importorskip("transformers")
from transformers import Qwen3VLVisionConfig  # noqa: E402
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel  # noqa: E402

LAYOUTS = {
    "single_image": [(1, 8, 12)],
    "several_images": [(1, 4, 4), (1, 8, 6), (1, 2, 10), (1, 6, 6)],
    "video_t2": [(2, 6, 8)],
    "video_and_images": [(1, 4, 6), (2, 4, 4), (1, 2, 2)],
}


def _hf_model(config: VisionConfig, generator: torch.Generator) -> Qwen3VLVisionModel:
    hf_config = Qwen3VLVisionConfig(
        depth=config.depth,
        hidden_size=config.hidden_size,
        num_heads=config.num_heads,
        intermediate_size=config.intermediate_size,
        out_hidden_size=config.out_hidden_size,
        deepstack_visual_indexes=list(config.deepstack_visual_indexes),
        num_position_embeddings=config.num_position_embeddings,
    )
    hf_config._attn_implementation = "sdpa"
    model = Qwen3VLVisionModel(hf_config).eval()
    with torch.no_grad():
        for param in model.parameters():  # every weight and bias random, none left at 0 or 1
            param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    return model


def _hf_output(model: Qwen3VLVisionModel, pixel_values: torch.Tensor, grid_thw) -> torch.Tensor:
    out = model(pixel_values, torch.tensor(grid_thw))
    return torch.cat([out.pooler_output, *out.deepstack_features], dim=1)


def _relative_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    return ((ours.double() - reference.double()).norm() / reference.double().norm()).item()


CONFIGS = {
    "tiny": preset("tiny"),
    # The real qwen3-vl-8b widths and position table, trimmed to two blocks to stay fast on CPU.
    "qwen3-vl-8b-depth2": preset("qwen3-vl-8b", depth=2, deepstack_visual_indexes=[0]),
    "qwen3.5-9b-depth2": preset("qwen3.5-9b", depth=2),
}


@pytest.mark.parametrize("config_name", list(CONFIGS))
@pytest.mark.parametrize("layout_name", list(LAYOUTS))
@torch.no_grad()
def test_tower_matches_transformers(config_name: str, layout_name: str, generator: torch.Generator) -> None:
    config = CONFIGS[config_name]
    grid_thw = LAYOUTS[layout_name]
    hf = _hf_model(config, generator)
    ours = Qwen3VLVisionTower(config, attention_backend="sdpa").eval()
    ours.load_state_dict(hf.state_dict(), strict=True)
    num_patches = sum(t * h * w for t, h, w in grid_thw)
    patch_width = config.in_channels * config.temporal_patch_size * config.patch_size**2
    pixel_values = torch.randn(num_patches, patch_width, generator=generator)

    expected = _hf_output(hf, pixel_values, grid_thw)
    got = ours(pixel_values, grid_thw)

    merged = num_patches // config.spatial_merge_size**2
    assert got.shape == (merged, config.out_hidden_size * (1 + len(config.deepstack_visual_indexes)))
    assert got.shape == expected.shape
    assert torch.isfinite(got).all()
    assert _relative_error(got, expected) < 1e-4


def test_state_dict_keys_and_shapes_equal_transformers(generator: torch.Generator) -> None:
    config = preset("tiny")
    hf_state = _hf_model(config, generator).state_dict()
    ours_state = Qwen3VLVisionTower(config, attention_backend="sdpa").state_dict()
    assert list(ours_state) == list(hf_state)
    assert {k: tuple(v.shape) for k, v in ours_state.items()} == {k: tuple(v.shape) for k, v in hf_state.items()}


def test_from_config_accepts_transformers_config_and_dict() -> None:
    hf_config = Qwen3VLVisionConfig(depth=3, hidden_size=128, num_heads=2, deepstack_visual_indexes=[1])
    from_hf = VisionConfig.from_config(hf_config)
    from_dict = VisionConfig.from_config(hf_config.to_dict())
    assert from_hf == from_dict
    assert (from_hf.depth, from_hf.head_dim, from_hf.deepstack_visual_indexes) == (3, 64, (1,))
    assert from_hf.rope_theta == hf_config.rope_parameters["rope_theta"]


def test_position_taps_differ_from_transformers_only_in_last_bits() -> None:
    """Qwen3-VL's linspace interpolation vs transformers 5.x's closed form (docs/numerics.md)."""
    from transformers.vision_utils import get_vision_interpolation_indices_and_weights

    from rocm_vit.layout import VisionLayout

    grid = [(1, 30, 46), (2, 64, 100), (1, 2, 2)]
    layout = VisionLayout.from_grid_thw(grid)
    indices, weights = layout.position_embedding_taps(48)
    hf_indices, hf_weights = get_vision_interpolation_indices_and_weights(
        torch.tensor(grid), 48, mode="bilinear", align_corners=True, spatial_merge_size=2
    )
    # Both put the same weight on each table entry; tap order and zero-weight taps may differ.
    ours_dense = torch.zeros(indices.shape[0], 48 * 48, dtype=torch.float64)
    ours_dense.scatter_add_(1, indices, weights.double())
    hf_dense = torch.zeros_like(ours_dense).scatter_add_(1, hf_indices, hf_weights.double())
    assert (ours_dense - hf_dense).abs().max().item() < 1e-5
