"""NEOX (rotate-half) vision RoPE as one Triton kernel for q and k, in place, CUDA/HIP-graph safe.

Shapes (``triton_rotary_supports``, else ``rope_torch``): q ``[N, H, D]``, k ``[N, KH, D]``, heads packed,
any token stride, fp16/bf16/fp32; cos/sin ``[N, D]`` contiguous; D even, <= 256. Invariants: equals
``rope_torch.rotary_native_`` bit for bit on a GPU (the interpreter may differ by one bf16 ulp); no
allocation, sync or read-back. Figures: docs/benchmarks.md, "`rocm-vit bench-rope`".
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import fast_launch
from .launch_math import cdiv, next_power_of_2

_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_MAX_HEAD_DIM = 256
# Padded elements one program may hold; beyond, registers spill, so such shapes go native.
_MAX_ELEMENTS_PER_PROGRAM = 8192
# One token per program, 8 warps: fastest of ``bench-rope --sweep`` (docs/benchmarks.md, "History").
_TARGET_ELEMENTS_PER_PROGRAM = 2048
_NUM_WARPS = 8


def triton_rotary_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotate q and k in place; one launch. Unchecked: the caller guarantees ``triton_rotary_supports``."""
    block_tokens, num_warps = _launch_config(q.shape[1], k.shape[1], q.shape[2])
    _launch(q, k, cos, sin, block_tokens, num_warps)


def triton_rotary_supports(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether ``triton_rotary_`` covers these tensors (see the module docstring for the contract)."""
    if q.dim() != 3 or k.dim() != 3 or cos.dim() != 2 or sin.dim() != 2:
        return False
    num_tokens, q_heads, head_dim = q.shape
    if k.shape[0] != num_tokens or k.shape[2] != head_dim:
        return False
    if cos.shape != (num_tokens, head_dim) or sin.shape != (num_tokens, head_dim):
        return False
    if head_dim % 2 or head_dim > _MAX_HEAD_DIM or num_tokens == 0:
        return False
    tensors = (q, k, cos, sin)
    if any(t.dtype not in _KERNEL_DTYPES for t in tensors):
        return False
    if not (cos.is_contiguous() and sin.is_contiguous() and _heads_packed(q) and _heads_packed(k)):
        return False
    if any(t.device != q.device for t in tensors) or not (q.is_cuda or _INTERPRETED):
        return False
    return _elements_per_token(q_heads, k.shape[1], head_dim) <= _MAX_ELEMENTS_PER_PROGRAM


def _heads_packed(x: torch.Tensor) -> bool:
    """Each token's heads lie back to back (strides ``(S, D, 1)``); the token stride is free."""
    _, heads, head_dim = x.shape
    return x.stride(2) == 1 and (x.stride(1) == head_dim or heads == 1) and x.stride(0) >= heads * head_dim


def _launch_config(q_heads: int, k_heads: int, head_dim: int) -> tuple[int, int]:
    """Tokens per program and warps: whole tokens up to ``_TARGET_ELEMENTS_PER_PROGRAM``, at least one."""
    tokens_that_fit = max(1, _TARGET_ELEMENTS_PER_PROGRAM // _elements_per_token(q_heads, k_heads, head_dim))
    # tl.arange needs a power of two; round down so the register budget holds.
    return 1 << (tokens_that_fit.bit_length() - 1), _NUM_WARPS


def _elements_per_token(q_heads: int, k_heads: int, head_dim: int) -> int:
    heads_pad = next_power_of_2(q_heads) + next_power_of_2(k_heads)
    return heads_pad * next_power_of_2(head_dim // 2) * 2


def _launch(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    block_tokens: int,
    num_warps: int,
) -> None:
    """Launch with an explicit configuration; ``rocm-vit bench-rope --sweep`` calls it directly."""
    num_tokens, q_heads, head_dim = q.shape
    k_heads = k.shape[1]
    # Separate roundings of products and sums, as eager torch: bit-identical to rotary_native_.
    launch = fast_launch.launcher(_rotary_kernel, num_warps=num_warps, enable_fp_fusion=False)
    launch(
        (cdiv(num_tokens, block_tokens),),
        q,
        k,
        cos,
        sin,
        num_tokens,
        q.stride(0),
        k.stride(0),
        q_heads,  # Q_HEADS
        k_heads,  # K_HEADS
        head_dim,  # HEAD_DIM
        next_power_of_2(q_heads),  # Q_HEADS_PAD
        next_power_of_2(k_heads),  # K_HEADS_PAD
        next_power_of_2(head_dim // 2),  # HALF_PAD
        block_tokens,  # BLOCK_TOKENS
    )


# num_tokens unspecialised: a new image size never JIT-compiles (a stall, or a failure inside a capture).
@triton.jit(do_not_specialize=["num_tokens"])
def _rotary_kernel(
    q_ptr,
    k_ptr,
    cos_ptr,
    sin_ptr,
    num_tokens,
    q_token_stride,
    k_token_stride,
    Q_HEADS: tl.constexpr,
    K_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    Q_HEADS_PAD: tl.constexpr,
    K_HEADS_PAD: tl.constexpr,
    HALF_PAD: tl.constexpr,
    BLOCK_TOKENS: tl.constexpr,
):
    HALF: tl.constexpr = HEAD_DIM // 2
    first_token = tl.program_id(0).to(tl.int64) * BLOCK_TOKENS
    # 64-bit program bases (large N cannot overflow), 32-bit offsets inside the block.
    q_ptr += first_token * q_token_stride
    k_ptr += first_token * k_token_stride
    cos_ptr += first_token * HEAD_DIM
    sin_ptr += first_token * HEAD_DIM

    tokens = tl.arange(0, BLOCK_TOKENS)[:, None, None]
    dims = tl.arange(0, HALF_PAD)[None, None, :]
    token_mask = tokens < num_tokens - first_token
    dim_mask = dims < HALF

    trig_offsets = tokens * HEAD_DIM + dims
    trig_mask = token_mask & dim_mask
    cos_first = tl.load(cos_ptr + trig_offsets, mask=trig_mask).to(tl.float32)
    cos_second = tl.load(cos_ptr + trig_offsets + HALF, mask=trig_mask).to(tl.float32)
    sin_first = tl.load(sin_ptr + trig_offsets, mask=trig_mask).to(tl.float32)
    sin_second = tl.load(sin_ptr + trig_offsets + HALF, mask=trig_mask).to(tl.float32)

    q_heads = tl.arange(0, Q_HEADS_PAD)[None, :, None]
    q_offsets = tokens * q_token_stride + q_heads * HEAD_DIM + dims
    q_mask = token_mask & (q_heads < Q_HEADS) & dim_mask
    k_heads = tl.arange(0, K_HEADS_PAD)[None, :, None]
    k_offsets = tokens * k_token_stride + k_heads * HEAD_DIM + dims
    k_mask = token_mask & (k_heads < K_HEADS) & dim_mask

    # All loads before any store: q and k might alias, and both in flight saturate bandwidth.
    q_first = tl.load(q_ptr + q_offsets, mask=q_mask)
    q_second = tl.load(q_ptr + q_offsets + HALF, mask=q_mask)
    k_first = tl.load(k_ptr + k_offsets, mask=k_mask)
    k_second = tl.load(k_ptr + k_offsets + HALF, mask=k_mask)

    _rotate_store(q_ptr, q_offsets, q_mask, q_first, q_second, cos_first, cos_second, sin_first, sin_second, HALF)
    _rotate_store(k_ptr, k_offsets, k_mask, k_first, k_second, cos_first, cos_second, sin_first, sin_second, HALF)


@triton.jit
def _rotate_store(
    x_ptr, offsets, mask, x_first, x_second, cos_first, cos_second, sin_first, sin_second, HALF: tl.constexpr
):
    first = x_first.to(tl.float32)
    second = x_second.to(tl.float32)
    # first*cos - second*sin == transformers' first*cos + (-second)*sin exactly in IEEE arithmetic.
    rotated_first = first * cos_first - second * sin_first
    rotated_second = second * cos_second + first * sin_second
    out_dtype = x_ptr.dtype.element_ty
    tl.store(x_ptr + offsets, rotated_first.to(out_dtype), mask=mask)
    tl.store(x_ptr + offsets + HALF, rotated_second.to(out_dtype), mask=mask)


_INTERPRETED = not isinstance(_rotary_kernel, triton.runtime.JITFunction)
