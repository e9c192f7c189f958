"""Linear layers at small row counts, ``y = act(x @ W.T + b)``, as Triton split-K GEMMs: deterministic, graph safe.

PROTOTYPE (session 6), not shipped: probe6.py times its configurations against cuBLAS (docs/benchmarks.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
ACTIVATIONS = ("none", "gelu_tanh")


@dataclass(frozen=True)
class LinearConfig:
    block_m: int = 64
    block_n: int = 128
    block_k: int = 64
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str = "none",
    config: LinearConfig | None = None,
) -> torch.Tensor:
    """``act(x @ weight.T + bias)`` in ``x.dtype``; fp32 accumulation, one rounding at the end."""
    rows, depth = x.shape
    cols = weight.shape[0]
    config = config or LinearConfig()
    out = torch.empty((rows, cols), dtype=x.dtype, device=x.device)
    if rows == 0:
        return out
    k_per_split = triton.cdiv(triton.cdiv(depth, config.split_k), config.block_k) * config.block_k
    split_k = triton.cdiv(depth, k_per_split)
    tiles = triton.cdiv(rows, config.block_m) * triton.cdiv(cols, config.block_n)
    partial = out if split_k == 1 else torch.empty((split_k, rows, cols), dtype=torch.float32, device=x.device)
    _linear_kernel[(tiles, split_k)](
        x,
        weight,
        weight if bias is None else bias,
        out,
        partial,
        rows,
        cols,
        depth,
        x.stride(0),
        weight.stride(0),
        K_PER_SPLIT=k_per_split,
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        SPLIT=split_k > 1,
        HAS_BIAS=bias is not None,
        GELU_TANH=activation == "gelu_tanh",
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    if split_k > 1:
        block = 1024
        _reduce_kernel[(triton.cdiv(rows * cols, block),)](
            partial,
            weight if bias is None else bias,
            out,
            rows * cols,
            cols,
            SPLIT_K=split_k,
            BLOCK=block,
            HAS_BIAS=bias is not None,
            GELU_TANH=activation == "gelu_tanh",
            num_warps=4,
        )
    return out


@triton.jit
def _finish(acc, bias_ptr, cols, col_mask, HAS_BIAS: tl.constexpr, GELU_TANH: tl.constexpr):
    """Bias and activation on the fp32 accumulator, before the one rounding (cuBLASLt's epilogue order)."""
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    if GELU_TANH:
        # 0.5 * (1 + tanh(z)) == sigmoid(2 z): the tanh GELU without a libdevice call (same on HIP).
        z = 0.7978845608028654 * (acc + 0.044715 * acc * acc * acc)
        acc = acc * tl.sigmoid(2.0 * z)
    return acc


@triton.jit
def _linear_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    partial_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    K_PER_SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    GELU_TANH: tl.constexpr,
):
    tile = tl.program_id(0)
    split = tl.program_id(1)
    m_tiles = tl.cdiv(M, BLOCK_M)
    # The row tiles of one column block are neighbours, so they read that weight block from L2.
    pid_m = tile % m_tiles
    pid_n = tile // m_tiles
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Out-of-range rows and columns read a valid row instead of being masked; they are never stored.
    rows_in = tl.minimum(rows, M - 1)
    cols_in = tl.minimum(cols, N - 1)
    ks = split * K_PER_SPLIT + tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rows_in[:, None].to(tl.int64) * stride_xm + ks[None, :]
    w_ptrs = w_ptr + cols_in[:, None].to(tl.int64) * stride_wn + ks[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in tl.range(0, K_PER_SPLIT, BLOCK_K):
        k_mask = (ks + k) < K
        x = tl.load(x_ptrs, mask=k_mask[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=k_mask[None, :], other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    offsets = rows[:, None].to(tl.int64) * N + cols[None, :]
    if SPLIT:
        tl.store(partial_ptr + split.to(tl.int64) * M * N + offsets, acc, mask=mask)
    else:
        acc = _finish(acc, bias_ptr, cols, cols < N, HAS_BIAS, GELU_TANH)
        tl.store(out_ptr + offsets, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _reduce_kernel(
    partial_ptr,
    bias_ptr,
    out_ptr,
    numel,
    N,
    SPLIT_K: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    GELU_TANH: tl.constexpr,
):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < numel
    # Split 0 first, then 1, ...: a fixed order, so every run gives the same bits.
    acc = tl.load(partial_ptr + offsets, mask=mask, other=0.0)
    for split in tl.static_range(1, SPLIT_K):
        acc += tl.load(partial_ptr + split * numel + offsets, mask=mask, other=0.0)
    cols = offsets % N
    acc = _finish(acc, bias_ptr, cols, mask, HAS_BIAS, GELU_TANH)
    tl.store(out_ptr + offsets, acc.to(out_ptr.dtype.element_ty), mask=mask)
