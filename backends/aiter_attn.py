"""Varlen attention through aiter's ``flash_attn_varlen_func`` (ROCm, CK/ASM kernels).

``aiter`` is imported when a call is made, never when this module is: importing it runs
``rocminfo`` and loads dozens of modules (DESIGN.md, Known hazards).

The call was checked against ``flash_attn_varlen_func`` in ``aiter/ops/mha.py`` of amd-aiter
0.1.7.post2.dev18 (the only PyPI wheel; tags v0.1.7 to v0.1.7.post2 have the same parameters), of tag
v0.1.20.post1 (the newest release, de07f3885ee5) and of main at e4048607a535 (2026-08-22). Their
parameter lists are pinned in ``rocm_vit/emulation/aiter_signature.py``; tests/test_aiter_standin.py
compares them with the stand-in, with what this module passes and with an installed aiter. All take
``(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, min_seqlen_q=0, dropout_p=0.0,
softmax_scale=None, logits_soft_cap=0.0, causal=False, window_size=..., ...)`` and return the output
tensor alone (``return_lse`` and ``return_attn_probs`` default to False). This module passes q, k, v,
the cu_seqlens, the max_seqlens, ``softmax_scale`` and ``causal``, all by keyword; it does not pass
``window_size`` (``(-1, -1)`` in 0.1.7, ``(-1, -1, 0)`` with a sink size from v0.1.8) or ``sink_ptr``
(appended in v0.1.10, absent from the PyPI wheel). The output has ``q.dtype``; head dims that are
multiples of 8 (64/72/80/128) run unpadded.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .varlen_args import varlen_offsets

AITER_MISSING = (
    "aiter is not installed: pip install rocm-vit[aiter] (the amd-aiter package; ROCm only, "
    "or build ROCm/aiter from source)"
)


def aiter_varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    scale: float,
    pad_head_dim_to: int | None = None,
) -> torch.Tensor:
    """Non-causal attention within each segment of packed ``q`` ``[N, H, D]``, ``k``/``v`` ``[N, KH, D]``.

    ``cu_seqlens`` is the int32 ``[B + 1]`` offsets tensor on q's device (the graph runner's static
    buffer, used as is); ``max_seqlen`` a host int (a tensor is refused: reading it would sync).
    Returns ``[N, H, D]`` in ``v.dtype``: q and k are cast to it first, since aiter returns
    ``q.dtype``. An int64, non-contiguous or CPU ``cu_seqlens`` from an eager caller is converted
    here (an extra device op, never a host read).

    ``pad_head_dim_to`` (e.g. 128, where aiter has assembly kernels) zero-pads q, k and v to that head
    dim and returns the first ``D`` columns, contiguous: zero columns add nothing to a score, and
    padded v columns are cut off; ``scale`` stays the caller's.
    """
    head_dim = q.shape[-1]
    if pad_head_dim_to is not None and pad_head_dim_to > head_dim:
        pad = (0, pad_head_dim_to - head_dim)
        padded = aiter_varlen_attention(F.pad(q, pad), F.pad(k, pad), F.pad(v, pad), cu_seqlens, max_seqlen, scale)
        return padded[..., :head_dim].contiguous()
    try:
        import aiter
    except ImportError as err:
        raise RuntimeError(AITER_MISSING) from err
    cu_seqlens, max_seqlen = varlen_offsets(cu_seqlens, max_seqlen, q.device)
    return aiter.flash_attn_varlen_func(
        q=q.to(v.dtype),
        k=k.to(v.dtype),
        v=v,
        cu_seqlens_q=cu_seqlens,
        cu_seqlens_k=cu_seqlens,
        max_seqlen_q=max_seqlen,
        max_seqlen_k=max_seqlen,
        softmax_scale=float(scale),
        causal=False,
    )
