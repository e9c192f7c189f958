"""Gated SiLU, ``silu(gate) * up``, from one stacked gate+up projection: one Triton launch, graph safe.

Shapes: ``gate_up`` ``[N, 2W]`` contiguous (gate first), fp16/bf16/fp32, ``W`` <= 65536. Invariants: eager
torch's roundings, only the exponential is Triton's (docs/numerics.md); allocates the output only, never
syncs; one binary per dtype and block size.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import fast_launch
from .launch_math import cdiv

KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_WIDTH = 65536
# Elements per program: 1024 columns of one row, 4 warps (8 per thread, one 16-byte vector of bf16).
_BLOCK = 1024
_NUM_WARPS = 4


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate_up[:, :W]) * gate_up[:, W:]`` ``[N, W]``; unchecked: the caller checks ``supports``."""
    rows, width = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty((rows, width), dtype=gate_up.dtype, device=gate_up.device)
    if rows:
        # Separate roundings of products and sums, as eager torch.
        launch = fast_launch.launcher(_silu_mul_kernel, num_warps=_NUM_WARPS, enable_fp_fusion=False)
        launch((rows, cdiv(width, _BLOCK)), gate_up, out, width, _BLOCK)
    return out


def supports(gate_up: torch.Tensor) -> bool:
    """Whether ``silu_mul`` covers this tensor (see the module docstring)."""
    if gate_up.dim() != 2 or not gate_up.is_contiguous() or gate_up.dtype not in KERNEL_DTYPES:
        return False
    width = gate_up.shape[1]
    return (gate_up.is_cuda or _INTERPRETED) and width % 2 == 0 and 0 < width // 2 <= MAX_WIDTH


@triton.jit
def _silu_mul_kernel(gate_up_ptr, out_ptr, width, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    gate_ptrs = gate_up_ptr + row * 2 * width + cols
    gate = tl.load(gate_ptrs, mask=mask, other=0.0)
    up = tl.load(gate_ptrs + width, mask=mask, other=0.0).to(tl.float32)
    dtype = gate.dtype
    gate = gate.to(tl.float32)
    # torch's SiLU: x / (1 + exp(-x)) in fp32, rounded to the tensor's dtype.
    activated = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    tl.store(out_ptr + row * width + cols, (activated * up).to(dtype), mask=mask)


_INTERPRETED = not isinstance(_silu_mul_kernel, triton.runtime.JITFunction)
