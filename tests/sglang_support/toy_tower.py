"""The toy Qwen3-VL and Qwen2.5-VL vision configs the SGLang scenarios build SGLang's real towers from."""

from __future__ import annotations

from typing import Any

# What both toy towers share: 4 heads, an MLP of 96, patches of 4 x 4 over 2 frames of 3 channels
# (``PATCH_DIM`` 96 in the scenarios), a 2 x 2 merge into rows of 48.
_SHARED_SIZES = {
    "intermediate_size": 96,
    "num_heads": 4,
    "out_hidden_size": 48,
    "patch_size": 4,
    "temporal_patch_size": 2,
    "in_channels": 3,
    "spatial_merge_size": 2,
}


def tiny_qwen3_vl_config(hidden_size: int = 64, num_heads: int = 4) -> Any:
    """3 blocks, one deepstack merger after block 1; a 6 x 6 position table, which most grids
    interpolate. ``hidden_size`` 64 gives head dim 16; ``qwen3_vl_235b_heads_config`` Qwen3-VL-235B's heads."""
    from sglang.srt.configs.qwen3_vl import Qwen3VLVisionConfig

    sizes = {**_SHARED_SIZES, "num_heads": num_heads}
    return Qwen3VLVisionConfig(
        depth=3, hidden_size=hidden_size, num_position_embeddings=36, deepstack_visual_indexes=[1], **sizes
    )


def qwen3_vl_235b_heads_config() -> Any:
    """The toy tower with Qwen3-VL-235B's attention: 16 heads of 72 (hidden 1152), two a rank at TP 8."""
    return tiny_qwen3_vl_config(hidden_size=1152, num_heads=16)


def qwen3_vl_8b_config() -> Any:
    """Qwen3-VL-8B's vision tower (27 blocks of 1152, 16 heads, patches of 16): the rank benchmark's."""
    from sglang.srt.configs.qwen3_vl import Qwen3VLVisionConfig

    return Qwen3VLVisionConfig(
        depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, out_hidden_size=4096, patch_size=16,
        temporal_patch_size=2, in_channels=3, spatial_merge_size=2, num_position_embeddings=2304,
        deepstack_visual_indexes=[8, 16, 24],
    )  # fmt: skip


def tiny_qwen2_5_vl_config() -> Any:
    """4 blocks, full attention in 1 and 3, windows of 2 x 2 merge blocks (16 // 2 // 4) elsewhere."""
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig

    return Qwen2_5_VLVisionConfig(
        depth=4, hidden_size=64, window_size=16, fullatt_block_indexes=[1, 3], hidden_act="silu", **_SHARED_SIZES
    )
