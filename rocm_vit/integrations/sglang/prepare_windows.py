"""Qwen2.5-VL's work before the blocks on SGLang's graph path, from a cache per ``grid_thw`` layout.

SGLang 0.5.23's ``forward_with_cuda_graph`` rebuilds, at every call, the rotary table (a host loop
over the images), the window permutation (a host loop of small ops per image), its inverse and the
offsets, and copies them to the device with blocking copies (a stream synchronize each). Here they
are built once per layout with SGLang's own functions and ops, on the tower's device, so the same
bits, and kept (with Qwen3-VL's, under ``prepare.LAYOUT_CACHE_BYTES`` per tower). A call on a known
layout runs SGLang's patch embedding and the window reordering of ``x``, and hands the runner
SGLang's arguments; nothing grows with the image count and nothing waits for the device.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rocm_vit.integrations.sglang.prepare import cached_layout, log_once
from rocm_vit.layout import host_grid_thw, to_device_async


@dataclass(frozen=True)
class PreparedWindows:
    """What one ``grid_thw`` layout needs before Qwen2.5-VL's blocks, on the tower's device."""

    window_index: torch.Tensor  # [N / merge unit] int64: merge blocks in window order
    output_indices: torch.Tensor  # its inverse, for the merged tokens
    cos: torch.Tensor  # [N, head_dim] in the tower's dtype, window order
    sin: torch.Tensor
    cu_seqlens: torch.Tensor  # int32, SGLang's leading empty segment kept
    cu_window_seqlens: torch.Tensor  # int32, repeated offsets removed
    layout_key: tuple[tuple[int, ...], tuple[int, ...]]  # both offsets as host ints

    @property
    def device_bytes(self) -> int:
        held = (self.window_index, self.output_indices, self.cos, self.sin, self.cu_seqlens, self.cu_window_seqlens)
        return sum(t.numel() * t.element_size() for t in held)


def forward_with_cuda_graph_from_cache(
    original: Callable[..., torch.Tensor], permute_inv: Callable[[torch.Tensor], torch.Tensor]
) -> Callable[..., torch.Tensor]:
    """``forward_with_cuda_graph`` from the per-layout cache; ``original`` where it does not cover the call.

    ``permute_inv``: SGLang's inverse of the window permutation, the function its forward calls.
    """

    def forward_with_cuda_graph(self: Any, x: torch.Tensor, grid_thw: torch.Tensor | list) -> torch.Tensor:
        if self.cuda_graph_runner is None:
            return original(self, x, grid_thw)
        try:
            prepared = _prepared(self, grid_thw, permute_inv)
        except ValueError as error:  # a grid SGLang may still serve (or reject in its own words)
            log_once("a grid_thw the cache does not take", error, "Qwen2.5-VL")
            return original(self, x, grid_thw)
        x = self.patch_embed(x.to(device=self.device, dtype=self.dtype, non_blocking=True))
        seq_len = x.shape[0]
        x = x.reshape(seq_len // self.spatial_merge_unit, self.spatial_merge_unit, -1)
        x = x[prepared.window_index, :, :].reshape(seq_len, -1)
        return self.cuda_graph_runner.run(
            x=x,
            position_embeddings=(prepared.cos, prepared.sin),
            cu_seqlens=prepared.cu_seqlens,
            cu_window_seqlens=prepared.cu_window_seqlens,
            output_indices=prepared.output_indices,
            attention_layout_key=prepared.layout_key,
        )

    functools.update_wrapper(forward_with_cuda_graph, original, assigned=("__doc__",))
    return forward_with_cuda_graph


def _prepared(tower: Any, grid_thw: torch.Tensor | list, permute_inv: Callable) -> PreparedWindows:
    grid = host_grid_thw(grid_thw)
    return cached_layout(tower, grid, lambda: _build(tower, torch.tensor(grid, dtype=torch.int64), permute_inv))


def _build(tower: Any, grid_thw: torch.Tensor, permute_inv: Callable) -> PreparedWindows:
    """SGLang's ``forward_with_cuda_graph`` without ``x``: its functions and ops in its order, so its bits."""
    device, dtype, unit = tower.device, tower.dtype, tower.spatial_merge_unit
    rotary = tower.rot_pos_emb(grid_thw)
    window_index, window_offsets = tower.get_window_index(grid_thw)
    window_layout = tuple(
        value for index, value in enumerate(window_offsets) if index == 0 or value != window_offsets[index - 1]
    )
    window_index = to_device_async(window_index, device)
    rotary = rotary.to(device=device, dtype=dtype)
    seq_len = rotary.shape[0]
    rotary = rotary.reshape(seq_len // unit, unit, -1)[window_index, :, :].reshape(seq_len, -1)
    emb = torch.cat((rotary, rotary), dim=-1)
    full_layout = [0, 0]
    for t, h, w in grid_thw.tolist():
        full_layout.append(full_layout[-1] + t * h * w)
    return PreparedWindows(
        window_index=window_index,
        output_indices=permute_inv(window_index),
        cos=emb.cos().to(device, dtype),
        sin=emb.sin().to(device, dtype),
        cu_seqlens=to_device_async(torch.tensor(full_layout, dtype=torch.int32), device),
        cu_window_seqlens=to_device_async(torch.tensor(window_layout, dtype=torch.int32), device),
        layout_key=(tuple(full_layout), window_layout),
    )
