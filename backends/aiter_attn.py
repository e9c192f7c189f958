"""Varlen attention through aiter's ``flash_attn_varlen_func`` (ROCm: assembly and CK kernels).

``aiter`` is imported at the first call, never with this module: importing it runs ``rocminfo``
and loads dozens of modules. The call asks for the log-sum-exp and drops it: aiter compiles one
module per kernel variant, and SGLang's ROCm image prebuilds the bf16 non-causal variant with LSE,
not the one without, which would run hipcc inside the first request (docs/rocm.md, "Hazards").
``prepare_aiter`` loads, or builds, the module of a head dim and dtype ahead of serving.
"""

from __future__ import annotations

import functools
import time

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

    ``cu_seqlens``: int32 ``[B + 1]`` on q's device, used as is (another dtype or device is converted,
    never read back); ``max_seqlen`` a host int (a tensor would sync). Returns ``[N, H, D]`` in
    ``v.dtype``. ``pad_head_dim_to`` zero-pads the head dim for aiter's assembly kernel.
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
    output, _ = aiter.flash_attn_varlen_func(
        q=q.to(v.dtype),
        k=k.to(v.dtype),
        v=v,
        cu_seqlens_q=cu_seqlens,
        cu_seqlens_k=cu_seqlens,
        max_seqlen_q=max_seqlen,
        max_seqlen_k=max_seqlen,
        softmax_scale=float(scale),
        causal=False,
        return_lse=True,
    )
    return output


@functools.cache
def prepare_aiter(
    head_dim: int, heads: int, kv_heads: int, dtype: torch.dtype, device: torch.device, pad_head_dim_to: int | None
) -> float:
    """One tiny call of this shape, so aiter loads (or compiles) its module now; the seconds it took."""
    started = time.perf_counter()
    q, k, v = (torch.ones(8, n, head_dim, dtype=dtype, device=device) for n in (heads, kv_heads, kv_heads))
    cu_seqlens = torch.tensor([0, 8], dtype=torch.int32, device=device)
    aiter_varlen_attention(q, k, v, cu_seqlens, 8, head_dim**-0.5, pad_head_dim_to)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started
