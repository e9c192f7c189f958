"""Qwen3-VL's graph path interpolates position embeddings the way its eager path does.

In SGLang 0.5.23 ``Qwen3VLMoeVisionModel.forward`` interpolates the learned position table with
``fast_pos_embed_interpolate_from_list`` (or its vectorized twin past a few images): linspace
source positions, as transformers does. ``forward_with_cuda_graph`` goes through
``fast_pos_embed_interpolate`` instead, a NumPy version that uses half-pixel source positions unless
``--enable-precise-embedding-interpolation`` is set, so graph output differed from eager output for
every image whose grid is not the table's size. With this method the graph path takes the eager
function.
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
