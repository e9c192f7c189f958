"""VisionLayout: everything about one batch of images and videos that is known on the host.

A layout is built from ``grid_thw`` given as host data and never reads the device. The graph
runner keys its graphs with ``graph_key``; attention backends take ``cu_seqlens`` (as a host tuple
and as an int32 device tensor made once, non-blocking from pinned memory) and ``max_seqlen``.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

GridTHW = tuple[int, int, int]


@dataclass(frozen=True)
class VisionLayout:
    """Host-side description of a packed batch: one attention segment per frame.

    ``grid_thw`` holds ``(t, h, w)`` in patches per item; a video of ``t`` frames contributes ``t``
    segments of ``h * w`` tokens (Qwen3-VL attends within a frame). Tokens are ordered in
    spatial-merge blocks, as the patch merger consumes them.
    """

    grid_thw: tuple[GridTHW, ...]
    spatial_merge_size: int
    seq_lens: tuple[int, ...]
    cu_seqlens: tuple[int, ...]
    max_seqlen: int
    _device_cache: dict = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    @classmethod
    def from_grid_thw(
        cls,
        grid_thw: Sequence[Sequence[int]] | torch.Tensor,
        spatial_merge_size: int = 2,
        *,
        num_patches: int | None = None,
    ) -> VisionLayout:
        """Validate ``grid_thw`` (a list of ``(t, h, w)`` or a CPU integer tensor) and build the layout.

        ``num_patches``, when given, is the number of pixel rows the caller holds; it must equal the
        sum of ``t * h * w``. Raises ``ValueError`` naming the field and the value on bad input, and
        on a device tensor (reading it would force a device-to-host sync).
        """
        if not isinstance(spatial_merge_size, int) or spatial_merge_size < 1:
            raise ValueError(f"spatial_merge_size = {spatial_merge_size!r} must be a positive int")
        items = _host_grid(grid_thw)
        for index, (t, h, w) in enumerate(items):
            for name, value in (("t", t), ("h", h), ("w", w)):
                if value <= 0:
                    raise ValueError(f"grid_thw[{index}].{name} = {value} must be positive")
            for name, value in (("h", h), ("w", w)):
                if value % spatial_merge_size:
                    raise ValueError(
                        f"grid_thw[{index}].{name} = {value} is not divisible by "
                        f"spatial_merge_size {spatial_merge_size}"
                    )
        seq_lens = tuple(h * w for t, h, w in items for _ in range(t))
        cu_seqlens = [0]
        for length in seq_lens:
            cu_seqlens.append(cu_seqlens[-1] + length)
        if num_patches is not None and num_patches != cu_seqlens[-1]:
            raise ValueError(
                f"pixel_values has {num_patches} rows but grid_thw {list(items)} describes {cu_seqlens[-1]} patches"
            )
        return cls(items, spatial_merge_size, seq_lens, tuple(cu_seqlens), max(seq_lens))

    @property
    def num_patches(self) -> int:
        return self.cu_seqlens[-1]

    @property
    def num_merged_tokens(self) -> int:
        return self.num_patches // (self.spatial_merge_size**2)

    @property
    def graph_key(self) -> tuple:
        """Identifies the attention layout exactly: equal token counts with other boundaries differ."""
        return ("full", self.cu_seqlens, self.max_seqlen)

    def cu_seqlens_tensor(self, device: torch.device | str) -> torch.Tensor:
        """The int32 ``cu_seqlens`` on ``device``, made once per device with a non-blocking copy."""
        device = torch.device(device)
        cached = self._device_cache.get(("cu_seqlens", device))
        if cached is None:
            cached = to_device_async(torch.tensor(self.cu_seqlens, dtype=torch.int32), device)
            self._device_cache[("cu_seqlens", device)] = cached
        return cached

    def rotary_position_ids(self) -> torch.Tensor:
        """``[N, 2]`` int64 (row, column) of each patch, in spatial-merge-block order, on the host."""
        merge = self.spatial_merge_size
        per_item = []
        for t, h, w in self.grid_thw:
            rows = torch.arange(h).view(h // merge, merge, 1, 1).expand(-1, -1, w // merge, merge)
            cols = torch.arange(w).view(1, 1, w // merge, merge).expand(h // merge, merge, -1, -1)
            block_major = torch.stack([rows.transpose(1, 2).flatten(), cols.transpose(1, 2).flatten()], dim=-1)
            per_item.append(block_major.repeat(t, 1))
        return torch.cat(per_item)

    def position_embedding_taps(self, num_grid_per_side: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Bilinear taps that resample the square learned position table to each item's grid.

        Returns ``indices`` ``[N, 4]`` int64 into the flattened ``side x side`` table and ``weights``
        ``[N, 4]`` float32, in spatial-merge-block order, repeated over frames. This is Qwen3-VL's
        own interpolation (``torch.linspace`` over ``align_corners=True`` source positions), the one
        SGLang serves; transformers 5.x computes the same positions in closed form, which differs in
        the last float32 bit for some weights (docs/numerics.md).
        """
        side = num_grid_per_side
        merge = self.spatial_merge_size
        all_indices, all_weights = [], []
        for t, h, w in self.grid_thw:
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


def to_device_async(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Copy a host tensor to ``device`` without blocking the host (pinned source on a GPU)."""
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def _merge_block_order(grid: torch.Tensor, h: int, w: int, merge: int) -> torch.Tensor:
    """Reorder an ``[h, w, C]`` raster grid into ``[h * w, C]`` spatial-merge-block order."""
    channels = grid.shape[-1]
    blocks = grid.view(h // merge, merge, w // merge, merge, channels).permute(0, 2, 1, 3, 4)
    return blocks.reshape(h * w, channels)


def _host_grid(grid_thw: Sequence[Sequence[int]] | torch.Tensor) -> tuple[GridTHW, ...]:
    if isinstance(grid_thw, torch.Tensor):
        if grid_thw.device.type != "cpu":
            raise ValueError(
                f"grid_thw is on {grid_thw.device}; pass host data (a list or a CPU tensor): "
                "reading a device tensor would force a device-to-host sync"
            )
        if grid_thw.is_floating_point() or grid_thw.is_complex():
            raise ValueError(f"grid_thw has dtype {grid_thw.dtype}; expected an integer tensor")
        if grid_thw.dim() != 2 or grid_thw.shape[1] != 3:
            raise ValueError(f"grid_thw has shape {tuple(grid_thw.shape)}; expected [num_items, 3]")
        rows = grid_thw.tolist()
    else:
        rows = list(grid_thw)
    if not rows:
        raise ValueError("grid_thw is empty; expected at least one (t, h, w)")
    items = []
    for index, row in enumerate(rows):
        values = tuple(row)
        if len(values) != 3:
            raise ValueError(f"grid_thw[{index}] = {row!r} must be a (t, h, w) triple")
        try:
            if any(isinstance(value, bool) for value in values):
                raise TypeError
            items.append(tuple(operator.index(value) for value in values))
        except TypeError:
            raise ValueError(f"grid_thw[{index}] = {row!r} must hold integers") from None
    return tuple(items)
