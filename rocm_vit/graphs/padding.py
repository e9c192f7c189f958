"""Which layouts run padded to a bucket of tokens, so that layouts that never repeat share a graph.

Invariant: the rule reads the layout and fixed parameters only (the policy's cost model with its
launch time as resolved, never the one measured while serving, nor the cache), so whether a layout
runs padded, eagerly or replayed, follows from the layout alone, and two identical calls always
compute the same function. The ladder and the margins: docs/design.md, "Padding".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F

from rocm_vit.graphs.cost import CostModel, capturable
from rocm_vit.layout import AttentionLayout, GridTHW, PaddedLayout, VisionLayout

# Bucket sizes: from FIRST_BUCKET, each at most LADDER_RATIO times the last (or one GRANULE more), in
# whole GRANULEs. 1.3 and 0.7 below: the best of the ladders and margins tried in `bench-traffic` for
# chat's share of the possible saving, no other stream's lower (docs/benchmarks.md, "Figures behind
# constants").
FIRST_BUCKET = 256
LADDER_RATIO = 1.3
GRANULE = 64
# Padded only where that keeps this share of an exact replay's saving (else a repeated layout keeps
# its own graph) and admission's rule would capture it.
MIN_KEPT_SAVING = 0.7
# Calls of at most this many segments (images, or frames of a video) run padded: the start captures
# their buckets (one image and two); a bucket of three or more would be captured inside a request
# (what two took over one: docs/benchmarks.md, "Figures behind constants").
MAX_PADDED_SEGMENTS = 2
# A repeated layout gets the same PaddedLayout, whose offsets reach the device once. Bounded.
_DECISIONS_KEPT = 4096
_UNDECIDED = object()
_MAX_ASPECT = 4  # of the grids ``bucket_call_grids`` picks: as elongated as a panorama photo


def bucket_ladder(max_tokens: int) -> tuple[int, ...]:
    """Token counts from ``FIRST_BUCKET`` up to ``max_tokens``, each within ``LADDER_RATIO`` of the last or
    one ``GRANULE`` above it."""
    buckets = []
    size = FIRST_BUCKET
    while size <= max_tokens:
        buckets.append(size)
        size = max(size + GRANULE, math.floor(size * LADDER_RATIO / GRANULE) * GRANULE)
    return tuple(buckets)


class Padding:
    """The static rule: ``padded(layout)`` is the layout to run instead, or ``None`` to run it as it is."""

    def __init__(self, cost_model: CostModel, max_tokens: int) -> None:
        self.cost_model = cost_model
        self.buckets = bucket_ladder(max_tokens)
        self._decided: dict[tuple, PaddedLayout | None] = {}  # layout's graph key -> decision

    def padded(self, layout: AttentionLayout) -> PaddedLayout | None:
        if layout.offsets_per_call or set(layout.segmentations) != {"full"}:
            return None
        key = layout.graph_key
        decision = self._decided.get(key, _UNDECIDED)  # one lookup: another thread may clear meanwhile
        if decision is not _UNDECIDED:
            return decision
        decision = self._decide(layout)  # the same for every thread that decides it
        if len(self._decided) >= _DECISIONS_KEPT:
            self._decided.clear()
        self._decided[key] = decision
        return decision

    def bucket_for(self, tokens: int) -> int | None:
        """The smallest bucket with room for ``tokens`` and a padding token, ``None`` past the ladder."""
        return next((size for size in self.buckets if size > tokens), None)

    def _decide(self, layout: AttentionLayout) -> PaddedLayout | None:
        tokens = layout.num_patches
        bucket = self.bucket_for(tokens)
        if bucket is None:
            return None
        seq_lens = layout.segmentations["full"].seq_lens
        if len(seq_lens) > MAX_PADDED_SEGMENTS:
            return None
        padded_lens = (*seq_lens, bucket - tokens)
        model = self.cost_model
        eager_ms = model.eager_ms(seq_lens)
        saving = capturable(eager_ms - model.replay_ms(padded_lens), eager_ms)
        if saving <= 0 or saving < MIN_KEPT_SAVING * model.saving_ms(seq_lens):
            return None
        return PaddedLayout(layout, bucket)

    def bucket_call_grids(self, merge: int) -> list[list[GridTHW]]:
        """The ``grid_thw`` of the calls that capture the bucket graphs at start: per bucket, the
        largest near-square image below it (the likeliest padded) and that image cut in two, as the
        key carries the segment count (docs/design.md, "Padding")."""
        calls, below = [], 0
        for bucket in self.buckets:
            grid = _top_grid(bucket, below, merge)
            below = bucket
            if grid is None:
                continue
            for grids in ([grid], _cut_in_two(grid, merge)):
                if not grids:
                    continue
                padded = self._decide(VisionLayout.from_grid_thw(grids, merge).attention)
                if padded is not None and padded.num_patches == bucket:
                    calls.append(grids)
        return calls


def bucket_calls(
    call_grids: list[list[GridTHW]], width: int, device: torch.device, dtype: torch.dtype
) -> Iterator[tuple[list[GridTHW], torch.Tensor]]:
    """Each of ``call_grids`` with seeded random pixels: the calls capturing a tower's buckets at start."""
    generator = torch.Generator(device=device).manual_seed(0)
    for grids in call_grids:
        patches = sum(math.prod(grid) for grid in grids)
        yield grids, torch.randn(patches, width, generator=generator, device=device, dtype=dtype)


def capture_buckets(
    runner: Any,
    forward: Callable[[torch.Tensor, list[GridTHW]], object],
    merge: int,
    width: int,
    device: torch.device,
    dtype: torch.dtype,
    still_serving: Callable[[], bool] = lambda: True,
) -> int:
    """Capture each bucket's graph through ``forward``, the tower's own entry, so each has a request's
    shapes and dtypes. Returns how many; stops once ``still_serving()`` is false."""
    captures = runner.stats()["captures"]
    for grids, pixels in bucket_calls(runner.padding.bucket_call_grids(merge), width, device, dtype):
        forward(pixels, grids)
        if not still_serving():
            return 0
    return runner.stats()["captures"] - captures


def pixel_width(source: Any) -> int | None:
    """``in_channels * temporal_patch_size * patch_size²`` of an object with those attributes, or ``None``."""
    sizes = [getattr(source, name, None) for name in ("in_channels", "temporal_patch_size", "patch_size")]
    if not all(isinstance(size, int) for size in sizes):
        return None
    in_channels, temporal_patch_size, patch_size = sizes
    return in_channels * temporal_patch_size * patch_size**2


def _top_grid(bucket: int, below: int, merge: int) -> GridTHW | None:
    """The one-frame grid (``_squarest_grid``) with the most tokens under ``bucket`` and over ``below``."""
    block = merge * merge
    for tokens in range((bucket - 1) // block * block, below, -block):
        grid = _squarest_grid(tokens, merge)
        if grid is not None:
            return grid
    return None


def _cut_in_two(grid: GridTHW, merge: int) -> list[GridTHW]:
    """``grid`` cut into two images of whole ``merge`` blocks; empty where it is one block wide."""
    frames, rows, columns = grid
    left = columns // merge // 2 * merge
    return [(frames, rows, left), (frames, rows, columns - left)] if left else []


def _squarest_grid(tokens: int, merge: int) -> GridTHW | None:
    """The squarest one-frame grid of ``tokens`` patches within ``_MAX_ASPECT``, or ``None``."""
    blocks = tokens // (merge * merge)
    rows = max((r for r in range(1, math.isqrt(blocks) + 1) if blocks % r == 0), default=0)
    if rows == 0 or blocks // rows > _MAX_ASPECT * rows:
        return None
    return (1, rows * merge, blocks // rows * merge)


def padded_shape(tensor: torch.Tensor, tokens: int, padded_tokens: int) -> torch.Size:
    """The shape of ``tensor`` (rows in proportion to ``tokens``) padded for ``padded_tokens``."""
    return torch.Size((tensor.shape[0] * padded_tokens // tokens, *tensor.shape[1:]))


def pad_rows(tensor: torch.Tensor, tokens: int, padded_tokens: int) -> torch.Tensor:
    """``tensor`` (rows in proportion to ``tokens``) with zero rows appended for ``padded_tokens``."""
    rows = padded_shape(tensor, tokens, padded_tokens)[0]
    return F.pad(tensor, (0, 0) * (tensor.dim() - 1) + (0, rows - tensor.shape[0]))


def real_rows(output: torch.Tensor, tokens: int, padded_tokens: int) -> torch.Tensor:
    """The rows of a padded call's ``output`` that belong to its ``tokens`` real tokens (a view)."""
    return output[: output.shape[0] * tokens // padded_tokens]
