"""Varlen attention through FlashAttention-4's CuTe DSL kernels (``flash_attn.cute``, NVIDIA sm_90+).

``flash-attn-4`` is imported at the first call, never with this module (it takes seconds); each head
dim compiles at its first call, which the runner's warm-up pays before a capture. Written against
``flash_attn/cute/interface.py`` of flash-attn-4 4.0.0b36.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from .varlen_args import varlen_offsets

FA4_MISSING = "flash-attn-4 is not installed: pip install rocm-vit[fa4] (NVIDIA sm_90 or newer)"


def fa4_varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    scale: float,
) -> torch.Tensor:
    """Non-causal attention within each segment of packed ``q`` ``[N, H, D]``, ``k``/``v`` ``[N, KH, D]``;
    ``max_seqlen`` a host int (a tensor would sync). Returns ``[N, H, D]`` in ``v.dtype``; capturable.
    """
    cu_seqlens, max_seqlen = varlen_offsets(cu_seqlens, max_seqlen, q.device)
    result = _varlen_func()(
        q.to(v.dtype),
        k.to(v.dtype),
        v,
        cu_seqlens_q=cu_seqlens,
        cu_seqlens_k=cu_seqlens,
        max_seqlen_q=max_seqlen,
        max_seqlen_k=max_seqlen,
        softmax_scale=float(scale),
        causal=False,
    )
    return result[0] if isinstance(result, tuple) else result


@functools.cache
def _varlen_func() -> Callable[..., object]:
    try:
        from flash_attn.cute import flash_attn_varlen_func
    except ImportError as err:
        raise RuntimeError(FA4_MISSING) from err
    return flash_attn_varlen_func
