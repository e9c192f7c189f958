"""The toy Qwen3-VL vision config the SGLang scenarios build SGLang's real tower from."""

from __future__ import annotations

from typing import Any


def tiny_qwen3_vl_config(hidden_size: int = 64) -> Any:
    """3 blocks, 4 heads, patch 4, a 2 x 2 merge and one deepstack merger after block 1; a 6 x 6
    position table, which most grids interpolate. ``hidden_size`` 64 gives head dim 16."""
    from sglang.srt.configs.qwen3_vl import Qwen3VLVisionConfig

    return Qwen3VLVisionConfig(
        depth=3,
        hidden_size=hidden_size,
        intermediate_size=96,
        num_heads=4,
        out_hidden_size=48,
        patch_size=4,
        temporal_patch_size=2,
        in_channels=3,
        spatial_merge_size=2,
        num_position_embeddings=36,
        deepstack_visual_indexes=[1],
    )
