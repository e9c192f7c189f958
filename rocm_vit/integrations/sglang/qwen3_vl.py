"""Qwen3-VL's graph path interpolates position embeddings the way its eager path does.

Why (SGLang 0.5.23's graph path used half-pixel positions): docs/sglang.md, hook ``qwen3_vl_graph_interpolation``.
"""

from __future__ import annotations

from typing import Any

import torch


def fast_pos_embed_interpolate(self: Any, grid_thw: torch.Tensor | list) -> torch.Tensor:
    """``Qwen3VLMoeVisionModel.forward``'s interpolation: the same choice, the same functions."""
    grid_thw_list = grid_thw if isinstance(grid_thw, list) else grid_thw.tolist()
    if self._use_vectorized_pos_embed(len(grid_thw_list)):
        return self.fast_pos_embed_interpolate_vectorized(grid_thw_list)
    return self.fast_pos_embed_interpolate_from_list(grid_thw_list)
