"""Residual add fused with the next LayerNorm or RMSNorm, one Triton launch per norm, CUDA/HIP-graph safe.

Invariant: eager torch's roundings, so it differs from the unfused pair only in the order of fp32 row
sums. Shapes: ``x``, ``update`` ``[N, C]`` contiguous, one dtype; weight/bias ``[C]``; ``C`` <= 16384.
Allocates the two outputs only, never syncs; one binary per ``(C, dtype, norm kind)``, launched through
``fast_launch`` (bound once per signature).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import fast_launch
from .launch_math import next_power_of_2

KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HIDDEN = 16384
NORM_KINDS = ("layer_norm", "rms_norm")


def add_norm(
    x: torch.Tensor,
    update: torch.Tensor | None,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    eps: float,
    kind: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s, norm(s))`` with ``s = x + update`` (or ``x``), both in ``x.dtype``; the caller checks ``supports``."""
    rows, hidden = x.shape
    summed = x if update is None else torch.empty_like(x)
    out_dtype = torch.promote_types(weight.dtype, x.dtype) if kind == "rms_norm" else x.dtype
    normed = torch.empty((rows, hidden), dtype=out_dtype, device=x.device)
    if rows == 0:
        return summed, normed
    block = next_power_of_2(hidden)
    # Separate roundings of products and sums, as eager torch.
    launch = fast_launch.launcher(_add_norm_kernel, num_warps=_num_warps(block), enable_fp_fusion=False)
    launch(
        (rows,),
        x,
        x if update is None else update,
        weight,
        weight if bias is None else bias,
        summed,
        normed,
        float(eps),
        hidden,  # HIDDEN
        block,  # BLOCK
        update is not None,  # HAS_UPDATE
        bias is not None,  # HAS_BIAS
        kind == "rms_norm",  # RMS
    )
    return summed, normed


def supports(
    x: torch.Tensor, update: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor | None, kind: str
) -> bool:
    """Whether ``add_norm`` covers these tensors (see the module docstring for the contract)."""
    if kind not in NORM_KINDS or x.dim() != 2 or not x.is_contiguous() or x.dtype not in KERNEL_DTYPES:
        return False
    if not (x.is_cuda or _INTERPRETED) or not 0 < x.shape[1] <= MAX_HIDDEN:
        return False
    if update is not None and (update.shape != x.shape or update.dtype != x.dtype or not update.is_contiguous()):
        return False
    params = [weight] if bias is None else [weight, bias]
    if kind == "layer_norm" and bias is None:
        return False
    return all(
        p.shape == (x.shape[1],) and p.is_contiguous() and p.device == x.device and p.dtype in KERNEL_DTYPES
        for p in params
    ) and (update is None or update.device == x.device)


def _num_warps(block: int) -> int:
    """Enough threads that each holds at most 8 elements of the row (a 2048 block: 8 warps)."""
    return max(1, min(16, block // 256))


@triton.jit
def _add_norm_kernel(
    x_ptr,
    update_ptr,
    weight_ptr,
    bias_ptr,
    summed_ptr,
    normed_ptr,
    eps,
    HIDDEN: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_UPDATE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    RMS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < HIDDEN
    offsets = row * HIDDEN + cols
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    dtype = x.dtype
    if HAS_UPDATE:
        # The norm sees the rounded sum, as eager torch.
        x = (x.to(tl.float32) + tl.load(update_ptr + offsets, mask=mask, other=0.0).to(tl.float32)).to(dtype)
        tl.store(summed_ptr + offsets, x, mask=mask)
    x = x.to(tl.float32)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0)
    if RMS:
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / HIDDEN + eps)
        # As transformers' Qwen2RMSNorm: ``weight * (x * rstd).to(input dtype)``.
        normed = (x * rstd).to(dtype)
        out_dtype = normed_ptr.dtype.element_ty
        normed = (weight.to(tl.float32) * normed.to(tl.float32)).to(out_dtype)
    else:
        mean = tl.sum(x, axis=0) / HIDDEN
        centered = tl.where(mask, x - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(centered * centered, axis=0) / HIDDEN + eps)
        normed = centered * rstd * weight.to(tl.float32)
        if HAS_BIAS:
            normed += tl.load(bias_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        normed = normed.to(dtype)
    tl.store(normed_ptr + offsets, normed, mask=mask)


_INTERPRETED = not isinstance(_add_norm_kernel, triton.runtime.JITFunction)
