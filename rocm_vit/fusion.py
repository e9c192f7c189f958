"""Fused steps of a vision tower: residual add + norm, fc1 + tanh-GELU, gated SiLU, position-embedding interpolation.

Each kernel removed counts: the tower is launch-bound at small images and bandwidth-bound around its
GEMMs at large ones. The choice is the policy's, fixed for the process so that replay equals eager:
fused on CUDA and ROCm unless ``rocm-vit tune`` measured plain faster or ``ROCM_VIT_FUSED_OPS=0``;
plain torch ops on CPU and for shapes a kernel does not cover.
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from rocm_vit.policy import active_policy


def add_norm(x: torch.Tensor, update: torch.Tensor | None, norm: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s, norm(s))`` with ``s = x + update``, or ``s = x`` when ``update`` is None.

    ``norm`` is an ``nn.LayerNorm`` with weight and bias, or a module with ``weight`` and ``eps`` whose
    class says ``norm_kind = "rms_norm"`` (``rocm_vit.models.tower.RMSNorm``). Fused: one Triton launch
    that rounds the sum like eager torch and normalises the rounded sum; it differs from the plain
    pair only in the order of the row sums. Both results are new tensors.
    """
    kind = norm_kind(norm)
    if _fused_enabled() and kind is not None:
        kernels = _add_norm_kernels()
        bias = getattr(norm, "bias", None)
        if kernels.supports(x, update, norm.weight, bias, kind):
            return kernels.add_norm(x, update, norm.weight, bias, norm.eps, kind)
    summed = x if update is None else x + update
    return summed, norm(summed)


def linear_gelu_tanh(x: torch.Tensor, linear: nn.Linear) -> torch.Tensor:
    """``gelu(linear(x), approximate="tanh")``; on CUDA one cuBLASLt GEMM with the GELU in its epilogue.

    The epilogue applies the tanh GELU to the fp32 accumulator before the one rounding; the plain pair
    rounds twice. Only NVIDIA CUDA: the CPU op computes the erf GELU and hipBLASLt's epilogue has not
    been run, so those take the plain pair, as does a torch without this private op.
    """
    if active_policy().gelu_epilogue.value and x.is_cuda and x.dim() == 2 and linear.bias is not None:
        return torch._addmm_activation(linear.bias, x, linear.weight.t(), use_gelu=True)
    return F.gelu(linear(x), approximate="tanh")


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` ``[N, W]`` for a stacked projection ``gate_up`` ``[N, 2W]`` (gate first).

    Fused: one Triton launch with eager torch's two roundings (the SiLU, then the product); plain:
    torch's ``F.silu`` and the product.
    """
    if _fused_enabled():
        kernels = _silu_mul_kernels()
        if kernels.supports(gate_up):
            return kernels.silu_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def add_position_embedding(
    x: torch.Tensor, table: torch.Tensor, taps: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """``x + (table[taps] * weights[..., None]).sum(1).to(x.dtype)``: Qwen3-VL's interpolated positions.

    ``taps``/``weights`` ``[N, 4]`` (int indices into ``table``, fp32 bilinear weights). Fused: one
    Triton launch adding into ``x`` in place (``x`` is returned), no ``[N, 4, C]`` intermediate.
    """
    if _fused_enabled():
        kernels = _position_kernels()
        if kernels.supports(x, table, taps, weights):
            return kernels.add_position_embedding_(x, table, taps, weights)
    return x + (F.embedding(taps, table) * weights[:, :, None]).sum(1).to(x.dtype)


def norm_kind(norm: nn.Module) -> str | None:
    """``"layer_norm"``, ``"rms_norm"``, or ``None`` for a norm the fused kernel does not know.

    A module other than ``nn.LayerNorm`` declares itself with a ``norm_kind`` class attribute.
    """
    if isinstance(norm, nn.LayerNorm):
        affine = norm.elementwise_affine and norm.bias is not None and len(norm.normalized_shape) == 1
        return "layer_norm" if affine else None
    return getattr(type(norm), "norm_kind", None)


def fused_ops_name() -> str:
    """``"fused"`` or ``"plain"``: what this process runs."""
    return "fused" if _fused_enabled() else "plain"


def _fused_enabled() -> bool:
    return active_policy().fused_ops.value


# Imported once the fused path is chosen (never on CPU, where Triton may be missing), and looked up
# once: add_norm runs twice per block in eager mode.
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
