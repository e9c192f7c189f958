"""Varlen attention through ``torch.nn.attention.varlen.varlen_attn`` (torch >= 2.10, CUDA).

``varlen_attn``'s keywords changed in every release (2.11 added ``scale``, 2.12 ``enable_gqa``), so
only the seven positional arguments are always passed, the rest where this torch's signature has them.
"""

from __future__ import annotations

import inspect
import math

import torch
from torch.nn.attention.varlen import varlen_attn

from .varlen_args import varlen_offsets

_PARAMETERS = inspect.signature(varlen_attn).parameters
_TAKES_SCALE = "scale" in _PARAMETERS
_TAKES_GQA = "enable_gqa" in _PARAMETERS


def torch_varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    scale: float,
) -> torch.Tensor:
    """Non-causal attention within each segment of packed ``q`` ``[N, H, D]``, ``k``/``v`` ``[N, KH, D]``;
    returns ``[N, H, D]`` in ``v.dtype``. Without ``scale`` (2.10) another scale is folded into q;
    before 2.12 grouped k/v heads are repeated (a copy)."""
    cu_seqlens, max_seqlen = varlen_offsets(cu_seqlens, max_seqlen, q.device)
    q, k = q.to(v.dtype), k.to(v.dtype)
    options: dict[str, object] = {}
    if _TAKES_SCALE:
        options["scale"] = float(scale)
    elif scale != q.shape[-1] ** -0.5:
        q = q * (scale * math.sqrt(q.shape[-1]))
    if k.shape[1] != q.shape[1]:
        if _TAKES_GQA:
            options["enable_gqa"] = True
        else:
            groups = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, **options)
