"""Fused steps of a vision tower: residual add + norm, fc1 + tanh-GELU, gated SiLU, position-embedding interpolation.

Invariant: fused or plain is the policy's choice, fixed for the process, so replay equals eager; shapes a
kernel does not cover run plain torch ops.
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from rocm_vit.policy import active_policy


def add_norm(x: torch.Tensor, update: torch.Tensor | None, norm: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s, norm(s))`` with ``s = x + update`` (or ``x``), both new tensors; fused differs from plain
    only in the order of the row sums."""
    kind = norm_kind(norm)
    if _fused_enabled() and kind is not None:
        kernels = _add_norm_kernels()
        bias = getattr(norm, "bias", None)
        if kernels.supports(x, update, norm.weight, bias, kind):
            return kernels.add_norm(x, update, norm.weight, bias, norm.eps, kind)
    summed = x if update is None else x + update
    return summed, norm(summed)


def linear_gelu_tanh(x: torch.Tensor, linear: nn.Linear) -> torch.Tensor:
    """``gelu(linear(x), approximate="tanh")``; on CUDA one cuBLASLt GEMM with the GELU in its epilogue,
    which rounds once where the plain pair rounds twice (docs/numerics.md)."""
    if active_policy().gelu_epilogue.value and x.is_cuda and x.dim() == 2 and linear.bias is not None:
        return torch._addmm_activation(linear.bias, x, linear.weight.t(), use_gelu=True)
    return F.gelu(linear(x), approximate="tanh")


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` ``[N, W]`` for ``gate_up`` ``[N, 2W]`` (gate first); fused rounds as eager torch."""
    if _fused_enabled():
        kernels = _silu_mul_kernels()
        if kernels.supports(gate_up):
            return kernels.silu_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def add_position_embedding(
    x: torch.Tensor, table: torch.Tensor, taps: torch.Tensor, weights: torch.Tensor, *, round_products: bool = False
) -> torch.Tensor:
    """``x + (table[taps] * weights[..., None]).sum(1).to(x.dtype)``, Qwen3-VL's interpolated positions;
    fused, in place into ``x``. ``round_products``: each weighted row rounded to ``x.dtype`` before the
    fp32 sum, as SGLang's Qwen3-VL rounds."""
    if _fused_enabled():
        kernels = _position_kernels()
        if kernels.supports(x, table, taps, weights):
            return kernels.add_position_embedding_(x, table, taps, weights, round_products=round_products)
    products = F.embedding(taps, table) * weights[:, :, None]
    if round_products:
        return x + products.to(x.dtype).sum(1, dtype=torch.float32).to(x.dtype)
    return x + products.sum(1).to(x.dtype)


def norm_kind(norm: nn.Module) -> str | None:
    """``"layer_norm"``, ``"rms_norm"`` (a ``norm_kind`` class attribute) or ``None`` (unknown to the kernel)."""
    if isinstance(norm, nn.LayerNorm):
        affine = norm.elementwise_affine and norm.bias is not None and len(norm.normalized_shape) == 1
        return "layer_norm" if affine else None
    return getattr(type(norm), "norm_kind", None)


def fused_ops_name() -> str:
    """``"fused"`` or ``"plain"``: what this process runs."""
    return "fused" if _fused_enabled() else "plain"


def _fused_enabled() -> bool:
    return active_policy().fused_ops.value


# Imported once the fused path is chosen (never on CPU); looked up once (add_norm runs twice per block).
@functools.cache
def _add_norm_kernels() -> ModuleType:
    from rocm_vit.backends import triton_add_norm

    return triton_add_norm


@functools.cache
def _silu_mul_kernels() -> ModuleType:
    from rocm_vit.backends import triton_silu_mul

    return triton_silu_mul


@functools.cache
def _position_kernels() -> ModuleType:
    from rocm_vit.backends import triton_pos_embed

    return triton_pos_embed
