"""Where each patch sits, for the Qwen towers' rotary angles and learned position table.

Both depend on ``grid_thw`` alone and are computed on the host, once per prepared layout, in the
spatial-merge-block order the blocks see tokens in.
"""

from __future__ import annotations

import torch

from rocm_vit.layout import VisionLayout


def rotary_position_ids(layout: VisionLayout) -> torch.Tensor:
    """``[N, 2]`` int64 (row, column) of each patch of ``layout``, in spatial-merge-block order, on the host."""
    merge = layout.spatial_merge_size
    per_item = []
    for t, h, w in layout.grid_thw:
        rows = torch.arange(h).view(h // merge, merge, 1, 1).expand(-1, -1, w // merge, merge)
        cols = torch.arange(w).view(1, 1, w // merge, merge).expand(h // merge, merge, -1, -1)
        block_major = torch.stack([rows.transpose(1, 2).flatten(), cols.transpose(1, 2).flatten()], dim=-1)
        per_item.append(block_major.repeat(t, 1))
    return torch.cat(per_item)


def position_embedding_taps(layout: VisionLayout, num_grid_per_side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bilinear taps resampling the learned table: ``indices`` ``[N, 4]`` int64, ``weights`` ``[N, 4]`` fp32,
    by Qwen3-VL's own linspace as SGLang serves it (transformers 5.x differs in the last bit)."""
    side = num_grid_per_side
    merge = layout.spatial_merge_size
    all_indices, all_weights = [], []
    for t, h, w in layout.grid_thw:
        h_src = torch.linspace(0, side - 1, h)
        w_src = torch.linspace(0, side - 1, w)
        h_floor, w_floor = h_src.int(), w_src.int()
        h_ceil = (h_floor + 1).clip(max=side - 1)
        w_ceil = (w_floor + 1).clip(max=side - 1)
        dh, dw = (h_src - h_floor)[:, None], (w_src - w_floor)[None, :]
        indices = torch.stack(
            [
                h_floor[:, None] * side + w_floor[None, :],
                h_floor[:, None] * side + w_ceil[None, :],
                h_ceil[:, None] * side + w_floor[None, :],
                h_ceil[:, None] * side + w_ceil[None, :],
            ],
            dim=-1,
        ).long()
        weights = torch.stack([(1 - dh) * (1 - dw), (1 - dh) * dw, dh * (1 - dw), dh * dw], dim=-1)
        all_indices.append(_merge_block_order(indices, h, w, merge).repeat(t, 1))
        all_weights.append(_merge_block_order(weights, h, w, merge).repeat(t, 1))
    return torch.cat(all_indices), torch.cat(all_weights)


def _merge_block_order(grid: torch.Tensor, h: int, w: int, merge: int) -> torch.Tensor:
    """Reorder an ``[h, w, C]`` raster grid into ``[h * w, C]`` spatial-merge-block order."""
    channels = grid.shape[-1]
    blocks = grid.view(h // merge, merge, w // merge, merge, channels).permute(0, 2, 1, 3, 4)
    return blocks.reshape(h * w, channels)
