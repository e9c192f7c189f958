"""Varlen attention through ``torch.nn.attention.varlen.varlen_attn`` (torch >= 2.10, CUDA).

The keyword arguments of ``varlen_attn`` changed between releases: 2.10 takes
``(..., max_q, max_k, is_causal=False, return_aux=None)`` with no scale; 2.11 makes the options
keyword-only, drops ``is_causal`` for ``window_size`` and adds ``scale``; 2.12 adds ``enable_gqa``.
So only the seven positional arguments are always passed, and ``scale``/``enable_gqa`` only where
this torch's signature has them (read once, at import).
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
    """Non-causal attention within each segment of packed ``q`` ``[N, H, D]``, ``k``/``v`` ``[N, KH, D]``.

    ``cu_seqlens`` is the int32 ``[B + 1]`` offsets tensor on q's device, ``max_seqlen`` a host int.
    Returns ``[N, H, D]`` in ``v.dtype`` (q and k are cast to it; ``varlen_attn`` returns q's dtype).
    On torch 2.10, which takes no scale, a scale other than ``D ** -0.5`` is folded into q (one more
    elementwise op); before 2.12, grouped k/v heads are repeated to q's head count (a copy).
    """
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
