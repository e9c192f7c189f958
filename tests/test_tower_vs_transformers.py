"""The reference towers against transformers' own vision models: same weights, fp32, CPU, sdpa.

Qwen3-VL against ``Qwen3VLVisionModel``, Qwen2.5-VL against ``Qwen2_5_VisionTransformerPretrainedModel``.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rocm_vit.models import Qwen3VLVisionConfig, Qwen3VLVisionTower, Qwen25VLVisionConfig, Qwen25VLVisionTower, preset
from rocm_vit.models.positions import position_embedding_taps

transformers = pytest.importorskip("transformers")
from transformers import Qwen2_5_VLVisionConfig  # noqa: E402
from transformers import Qwen3VLVisionConfig as HFQwen3VLVisionConfig  # noqa: E402
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel  # noqa: E402
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel  # noqa: E402

LAYOUTS = {
    "single_image": [(1, 8, 12)],
    "several_images": [(1, 4, 4), (1, 8, 6), (1, 2, 10), (1, 6, 6)],
    "video_t2": [(2, 6, 8)],
    "video_and_images": [(1, 4, 6), (2, 4, 4), (1, 2, 2)],
}


def _hf_model(config: Qwen3VLVisionConfig, generator: torch.Generator) -> Qwen3VLVisionModel:
    hf_config = HFQwen3VLVisionConfig(
        depth=config.depth,
        hidden_size=config.hidden_size,
        num_heads=config.num_heads,
        intermediate_size=config.intermediate_size,
        out_hidden_size=config.out_hidden_size,
        deepstack_visual_indexes=list(config.deepstack_visual_indexes),
        num_position_embeddings=config.num_position_embeddings,
    )
    hf_config._attn_implementation = "sdpa"
    return _randomized(Qwen3VLVisionModel(hf_config).eval(), generator)


def _randomized(model: nn.Module, generator: torch.Generator) -> nn.Module:
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


@pytest.fixture(scope="module")
def qwen3_models() -> dict[str, tuple[Qwen3VLVisionModel, Qwen3VLVisionTower, torch.Tensor]]:
    """Each config's transformers model and our tower with its weights, built at its first layout and
    kept for the others (the 8B widths take seconds), with the generator's state after its weights."""
    return {}


@pytest.mark.parametrize("config_name", list(CONFIGS))
@pytest.mark.parametrize("layout_name", list(LAYOUTS))
@torch.no_grad()
def test_tower_matches_transformers(
    config_name: str, layout_name: str, qwen3_models: dict, generator: torch.Generator
) -> None:
    config = CONFIGS[config_name]
    grid_thw = LAYOUTS[layout_name]
    if config_name not in qwen3_models:  # the weights are the seeded generator's first draws
        hf = _hf_model(config, generator)
        ours = Qwen3VLVisionTower(config, attention_backend="sdpa").eval()
        ours.load_state_dict(hf.state_dict(), strict=True)
        qwen3_models[config_name] = (hf, ours, generator.get_state())
    hf, ours, after_weights = qwen3_models[config_name]
    generator.set_state(after_weights)  # every layout's pixels drawn after the same weights
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
    hf_config = HFQwen3VLVisionConfig(depth=3, hidden_size=128, num_heads=2, deepstack_visual_indexes=[1])
    from_hf = Qwen3VLVisionConfig.from_config(hf_config)
    from_dict = Qwen3VLVisionConfig.from_config(hf_config.to_dict())
    assert from_hf == from_dict
    assert (from_hf.depth, from_hf.head_dim, from_hf.deepstack_visual_indexes) == (3, 64, (1,))
    assert from_hf.rope_theta == hf_config.rope_parameters["rope_theta"]


def test_position_taps_differ_from_transformers_only_in_last_bits() -> None:
    """Qwen3-VL's linspace interpolation vs transformers 5.x's closed form (docs/numerics.md)."""
    from transformers.vision_utils import get_vision_interpolation_indices_and_weights

    from rocm_vit.layout import VisionLayout

    grid = [(1, 30, 46), (2, 64, 100), (1, 2, 2)]
    layout = VisionLayout.from_grid_thw(grid)
    indices, weights = position_embedding_taps(layout, 48)
    hf_indices, hf_weights = get_vision_interpolation_indices_and_weights(
        torch.tensor(grid), 48, mode="bilinear", align_corners=True, spatial_merge_size=2
    )
    # Both put the same weight on each table entry; tap order and zero-weight taps may differ.
    ours_dense = torch.zeros(indices.shape[0], 48 * 48, dtype=torch.float64)
    ours_dense.scatter_add_(1, indices, weights.double())
    hf_dense = torch.zeros_like(ours_dense).scatter_add_(1, hf_indices, hf_weights.double())
    assert (ours_dense - hf_dense).abs().max().item() < 1e-5


# Qwen2.5-VL: windows of 8 x 8 patches; grids that are not multiples of 8 leave partial windows.
WINDOW_LAYOUTS = {
    "partial_windows": [(1, 12, 20)],
    "exact_windows": [(1, 16, 16)],
    "several_images": [(1, 4, 4), (1, 8, 6), (1, 2, 10), (1, 18, 10)],
    "video_t2": [(2, 10, 14)],
    "video_and_images": [(1, 6, 6), (2, 12, 8), (1, 2, 2)],
}

QWEN25_CONFIGS = {
    "qwen2.5-vl-tiny": preset("qwen2.5-vl-tiny"),
    # The real 7B widths (head dim 80, gated MLP 3420, merger 5120 -> 3584), one window and one full block.
    "qwen2.5-vl-7b-depth2": preset("qwen2.5-vl-7b", depth=2, fullatt_block_indexes=[1]),
}


def _hf_qwen25_config(config: Qwen25VLVisionConfig) -> Qwen2_5_VLVisionConfig:
    hf_config = Qwen2_5_VLVisionConfig(
        depth=config.depth,
        hidden_size=config.hidden_size,
        num_heads=config.num_heads,
        intermediate_size=config.intermediate_size,
        out_hidden_size=config.out_hidden_size,
        fullatt_block_indexes=list(config.fullatt_block_indexes),
        window_size=112,
        patch_size=14,
    )
    hf_config._attn_implementation = "sdpa"
    return hf_config


@pytest.fixture(scope="module")
def qwen25_models() -> dict[str, tuple[nn.Module, Qwen25VLVisionTower]]:
    """Each config's transformers model and our tower with its weights, built once: the 7B widths take seconds."""
    generator = torch.Generator().manual_seed(25)
    models = {}
    for name, config in QWEN25_CONFIGS.items():
        hf = _randomized(Qwen2_5_VisionTransformerPretrainedModel(_hf_qwen25_config(config)).eval(), generator)
        ours = Qwen25VLVisionTower(config, attention_backend="sdpa").eval()
        ours.load_state_dict(hf.state_dict(), strict=True)
        models[name] = (hf, ours)
    return models


@pytest.mark.parametrize("config_name", list(QWEN25_CONFIGS))
@pytest.mark.parametrize("layout_name", list(WINDOW_LAYOUTS))
@torch.no_grad()
def test_qwen25_tower_matches_transformers(
    config_name: str, layout_name: str, qwen25_models: dict, generator: torch.Generator
) -> None:
    hf, ours = qwen25_models[config_name]
    grid_thw = WINDOW_LAYOUTS[layout_name]
    num_patches = sum(t * h * w for t, h, w in grid_thw)
    pixel_values = torch.randn(num_patches, 3 * 2 * 14 * 14, generator=generator)

    expected = hf(pixel_values, torch.tensor(grid_thw)).pooler_output
    got = ours(pixel_values, grid_thw)

    assert got.shape == expected.shape == (num_patches // 4, ours.config.out_hidden_size)
    assert torch.isfinite(got).all()
    assert _relative_error(got, expected) < 1e-4


@pytest.mark.parametrize("name", ["qwen2.5-vl-3b", "qwen2.5-vl-7b", "qwen2.5-vl-32b", "qwen2.5-vl-72b"])
def test_qwen25_state_dict_keys_and_shapes_equal_transformers(name: str) -> None:
    """The whole preset, on the meta device: HF checkpoints' vision weights load unchanged."""
    config = preset(name)
    with torch.device("meta"):
        hf_state = Qwen2_5_VisionTransformerPretrainedModel(_hf_qwen25_config(config)).state_dict()
        ours_state = Qwen25VLVisionTower(config, attention_backend="sdpa").state_dict()
    assert list(ours_state) == list(hf_state)
    assert {k: tuple(v.shape) for k, v in ours_state.items()} == {k: tuple(v.shape) for k, v in hf_state.items()}


def test_qwen25_from_config_accepts_transformers_config_and_dict() -> None:
    hf_config = Qwen2_5_VLVisionConfig(
        depth=4, hidden_size=256, num_heads=4, intermediate_size=512, out_hidden_size=64, fullatt_block_indexes=[3]
    )
    tower = Qwen25VLVisionTower.from_config(hf_config, attention_backend="sdpa")
    from_dict = Qwen25VLVisionConfig.from_config(hf_config.to_dict())
    assert tower.config == from_dict
    assert (from_dict.depth, from_dict.head_dim, from_dict.fullatt_block_indexes) == (4, 64, (3,))
    assert (from_dict.patch_size, from_dict.window_size, from_dict.window_merge_blocks) == (14, 112, 4)
    assert from_dict.rope_theta == hf_config.rope_parameters["rope_theta"]


def test_qwen25_7b_preset_is_transformers_default_tower_at_its_real_width() -> None:
    """transformers' defaults are the 7B tower but for hidden_size (3584 there, 1280 in the checkpoint)."""
    defaults = Qwen2_5_VLVisionConfig().to_dict()
    ours = preset("qwen2.5-vl-7b")
    for field in ("depth", "num_heads", "intermediate_size", "out_hidden_size", "patch_size", "window_size"):
        assert getattr(ours, field) == defaults[field], field
    assert list(ours.fullatt_block_indexes) == list(defaults["fullatt_block_indexes"])
    assert (ours.hidden_size, ours.hidden_act, ours.spatial_merge_size) == (1280, "silu", 2)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"fullatt_block_indexes": [4]}, "fullatt_block_indexes has 4, outside depth 4"),
        ({"window_size": 20}, r"window_size = 20 is smaller than one merge block \(2 x 14 px\)"),
        ({"hidden_size": 250}, "hidden_size = 250 is not divisible by num_heads 4"),
    ],
)
def test_qwen25_bad_config_is_refused(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        preset("qwen2.5-vl-tiny", **overrides)


def test_qwen25_gated_mlp_pads_with_zeros_and_round_trips_transformers_weights() -> None:
    """The stacked, padded MLP computes transformers' ``Qwen2_5_VLMLP`` and gives its weights back unchanged."""
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLMLP

    from rocm_vit.models.qwen2_5_vl import GatedMLP

    config = preset("qwen2.5-vl-7b", depth=1, fullatt_block_indexes=[0])  # intermediate 3420 -> 3424
    generator = torch.Generator().manual_seed(21)
    ours = GatedMLP(config)
    width, padded = config.intermediate_size, ours.padded_size
    assert (width, padded) == (3420, 3424)
    # Padding is zero from the start, so a randomly initialised tower (bench) computes the same function.
    assert not ours.gate_up_proj.weight[width:padded].any() and not ours.gate_up_proj.weight[padded + width :].any()
    assert not ours.gate_up_proj.bias[width:padded].any() and not ours.down_proj.weight[:, width:].any()

    hf = _randomized(Qwen2_5_VLMLP(_hf_qwen25_config(config), bias=True), generator)
    with torch.no_grad():  # the padding must be overwritten with zeros by the load
        ours.gate_up_proj.weight.fill_(float("nan"))
        ours.down_proj.weight.fill_(float("nan"))
    ours.load_state_dict(hf.state_dict(), strict=True)
    assert not ours.down_proj.weight[:, width:].any() and not ours.gate_up_proj.bias[padded + width :].any()
    back = ours.state_dict()
    assert list(back) == list(hf.state_dict())
    for name, value in hf.state_dict().items():
        assert torch.equal(back[name], value), name
    x = torch.randn(37, config.hidden_size, generator=generator)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), hf(x), rtol=1e-5, atol=1e-5)
