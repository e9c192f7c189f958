"""Bilinear position-embedding interpolation added to the patch embeddings: one Triton launch, in place.

Replaces torch's five launches and ``[N, 4, C]`` fp32 intermediate, with eager torch's roundings (tap order).
Shapes: ``x`` ``[N, C]`` and ``table`` ``[P, C]`` contiguous, one dtype; ``taps`` ``[N, 4]`` int64/int32;
``weights`` ``[N, 4]`` fp32; ``C`` <= 16384. Allocates nothing, never syncs; one binary per ``(C, dtype)`` and
rounding (``round_products``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import fast_launch
from .launch_math import next_power_of_2

KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HIDDEN = 16384
NUM_TAPS = 4


def add_position_embedding_(
    x: torch.Tensor, table: torch.Tensor, taps: torch.Tensor, weights: torch.Tensor, *, round_products: bool = False
) -> torch.Tensor:
    """``x += (table[taps] * weights[..., None]).sum(1).to(x.dtype)``; returns ``x``; unchecked (``supports``).

    ``round_products``: each weighted row rounded to ``x.dtype`` before the fp32 sum (SGLang's Qwen3-VL).
    """
    rows, hidden = x.shape
    if rows:
        block = next_power_of_2(hidden)
        # Separate roundings of products and sums, as eager torch.
        launch = fast_launch.launcher(
            _add_position_embedding_kernel, num_warps=max(1, min(8, block // 256)), enable_fp_fusion=False
        )
        launch((rows,), x, table, taps, weights, hidden, block, NUM_TAPS, round_products)
    return x


def supports(x: torch.Tensor, table: torch.Tensor, taps: torch.Tensor, weights: torch.Tensor) -> bool:
    """Whether ``add_position_embedding_`` covers these tensors (see the module docstring)."""
    if x.dim() != 2 or table.dim() != 2 or x.dtype not in KERNEL_DTYPES or table.dtype != x.dtype:
        return False
    if not (x.is_contiguous() and table.is_contiguous() and taps.is_contiguous() and weights.is_contiguous()):
        return False
    if x.shape[1] != table.shape[1] or not 0 < x.shape[1] <= MAX_HIDDEN:
        return False
    if taps.shape != (x.shape[0], NUM_TAPS) or weights.shape != taps.shape:
        return False
    if taps.dtype not in (torch.int32, torch.int64) or weights.dtype != torch.float32:
        return False
    tensors = (x, table, taps, weights)
    return all(t.device == x.device for t in tensors) and (x.is_cuda or _INTERPRETED)


@triton.jit
def _add_position_embedding_kernel(
    x_ptr,
    table_ptr,
    taps_ptr,
    weights_ptr,
    HIDDEN: tl.constexpr,
    BLOCK: tl.constexpr,
    TAPS: tl.constexpr,
    ROUND_PRODUCTS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < HIDDEN
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for tap in tl.static_range(TAPS):
        index = tl.load(taps_ptr + row * TAPS + tap).to(tl.int64)
        weight = tl.load(weights_ptr + row * TAPS + tap)
        product = tl.load(table_ptr + index * HIDDEN + cols, mask=mask, other=0.0).to(tl.float32) * weight
        if ROUND_PRODUCTS:
            product = product.to(x_ptr.dtype.element_ty).to(tl.float32)
        acc += product
    x = tl.load(x_ptr + row * HIDDEN + cols, mask=mask, other=0.0)
    out = x.to(tl.float32) + acc.to(x.dtype).to(tl.float32)
    tl.store(x_ptr + row * HIDDEN + cols, out.to(x.dtype), mask=mask)


_INTERPRETED = not isinstance(_add_position_embedding_kernel, triton.runtime.JITFunction)
