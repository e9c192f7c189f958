"""The last wave of a one-program-per-SM attention launch, split along the keys and merged in order.

Invariants: fp32 partials merged in split order, so results are deterministic and replay equals eager
(split rows differ from unsplit by fp32 rounding only); only equal-length segments are split (the host
knows every length). Measured: docs/long-sequences.md, "The split last wave".
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import fast_launch
from .launch_math import cdiv, next_power_of_2

# Costs in key-tile steps: a program's fixed part, and the split's own (a kernel boundary, the merge).
PROGRAM_OVERHEAD_TILES = 1
SPLIT_OVERHEAD_TILES = 6
MIN_TILES_PER_SPLIT = 2
# A split must beat the unsplit launch by this fraction: below it the wave model's error is as large.
MIN_GAIN = 0.03
MAX_SPLITS = 16
MERGE_BLOCK_ROWS = 16


@dataclass(frozen=True)
class TailSplit:
    """Query blocks ``first_tail_block ..`` of every segment run as ``splits`` programs each."""

    first_tail_block: int
    tail_blocks: int
    splits: int


def plan_tail_split(
    seq_len: int, block_rows: int, tile_keys: int, programs_per_block: int, sms: int
) -> TailSplit | None:
    """The split that finishes soonest by the wave model, or ``None`` when an unsplit launch does."""
    return _plan(cdiv(seq_len, block_rows), cdiv(seq_len, tile_keys), programs_per_block, sms)


@functools.lru_cache(maxsize=4096)  # bounded: a server sees many image sizes
def _plan(blocks: int, tiles: int, programs_per_block: int, sms: int) -> TailSplit | None:
    step = tiles + PROGRAM_OVERHEAD_TILES
    best_cost, best = cdiv(blocks * programs_per_block, sms) * step * (1 - MIN_GAIN), None
    max_splits = min(MAX_SPLITS, tiles // MIN_TILES_PER_SPLIT)
    for tail_blocks in range(1, blocks + 1):
        main_cost = cdiv((blocks - tail_blocks) * programs_per_block, sms) * step
        if main_cost >= best_cost:
            continue
        for splits in range(2, max_splits + 1):
            split_programs = tail_blocks * programs_per_block * splits
            cost = (
                main_cost
                + cdiv(split_programs, sms) * (cdiv(tiles, splits) + PROGRAM_OVERHEAD_TILES)
                + SPLIT_OVERHEAD_TILES
            )
            if cost < best_cost:
                best_cost, best = cost, TailSplit(blocks - tail_blocks, tail_blocks, splits)
    return best


def partials(
    plan: TailSplit, block_rows: int, segments: int, heads: int, width: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh fp32 ``(o [splits, segments, rows, heads, width], ml [..., 2])``: base-2 row max and sum."""
    rows = plan.tail_blocks * block_rows
    shape = (plan.splits, segments, rows, heads)
    buffer = torch.empty(plan.splits * segments * rows * heads * (width + 2), dtype=torch.float32, device=device)
    o_size = plan.splits * segments * rows * heads * width
    return buffer[:o_size].view(*shape, width), buffer[o_size:].view(*shape, 2)


def merge_tail(
    part_o: torch.Tensor,
    part_ml: torch.Tensor,
    out: torch.Tensor,
    cu_seqlens: torch.Tensor,
    first_tail_row: int,
) -> None:
    """``out``'s tail rows ``first_tail_row ..`` of every segment from the split partials, in split order."""
    splits, segments, rows, heads, width = part_o.shape
    head_dim = out.shape[2]
    fast_launch.launcher(_merge_kernel, num_warps=4)(
        (cdiv(rows, MERGE_BLOCK_ROWS), heads, segments),
        part_o,
        part_ml,
        out,
        cu_seqlens,
        out.stride(0),
        out.stride(1),
        first_tail_row,
        rows,
        splits,
        width,  # WIDTH
        head_dim,  # HEAD_DIM
        next_power_of_2(head_dim),  # BLOCK_D
        MERGE_BLOCK_ROWS,  # BLOCK_R
    )


# The split count and the rows are arguments, unspecialized: one compiled variant serves every plan,
# so no image size compiles a new one inside a request (docs/design.md, "Compiles before serving").
@triton.jit(do_not_specialize=["first_tail_row", "tail_rows", "splits"])
def _merge_kernel(
    part_o,
    part_ml,
    out_ptr,
    cu_seqlens,
    stride_on,
    stride_oh,
    first_tail_row,
    tail_rows,
    splits,
    WIDTH: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    head = tl.program_id(1)
    seq = tl.program_id(2)
    heads = tl.num_programs(1)
    segments = tl.num_programs(2)
    seq_row0 = tl.load(cu_seqlens + seq)
    seq_len = tl.load(cu_seqlens + seq + 1) - seq_row0
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_D)
    row_ok = (rows < tail_rows) & (first_tail_row + rows < seq_len)
    # The largest row max first, so every weight is at most 1; then the sums, split by split.
    m_max = tl.full([BLOCK_R], float("-inf"), tl.float32)
    for split in range(splits):
        entry = ((split * segments + seq) * tail_rows + rows) * heads + head
        m_max = tl.maximum(m_max, tl.load(part_ml + 2 * entry, mask=row_ok, other=0.0))
    o_mask = row_ok[:, None] & (cols < HEAD_DIM)[None, :]
    acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    l_sum = tl.zeros([BLOCK_R], tl.float32)
    for split in range(splits):
        entry = ((split * segments + seq) * tail_rows + rows) * heads + head
        weight = tl.exp2(tl.load(part_ml + 2 * entry, mask=row_ok, other=0.0) - m_max)
        l_sum += tl.load(part_ml + 2 * entry + 1, mask=row_ok, other=1.0) * weight
        o_offsets = entry.to(tl.int64)[:, None] * WIDTH + cols[None, :]
        acc += tl.load(part_o + o_offsets, mask=o_mask, other=0.0) * weight[:, None]
    out_rows = (seq_row0 + first_tail_row + rows).to(tl.int64)
    out_offsets = out_rows[:, None] * stride_on + head * stride_oh + cols[None, :]
    tl.store(out_ptr + out_offsets, (acc / l_sum[:, None]).to(out_ptr.dtype.element_ty), mask=o_mask)
