"""What the varlen kernels take besides q, k, v, and the checks rocm-vit's own kernels share.

A tensor ``max_seqlen`` is refused rather than read: reading it would sync the device in every forward.
"""

from __future__ import annotations

import operator

import torch


def varlen_offsets(cu_seqlens: torch.Tensor, max_seqlen: int, device: torch.device) -> tuple[torch.Tensor, int]:
    """``(cu_seqlens as int32 contiguous on device, max_seqlen as int)``; the graph runner's static
    buffer passes through as is, an eager caller's int64 or CPU offsets cost one device op."""
    if isinstance(max_seqlen, torch.Tensor):
        raise TypeError("max_seqlen must be a host int, not a tensor: reading it would sync the device")
    cu_seqlens = cu_seqlens.to(device=device, dtype=torch.int32, non_blocking=True).contiguous()
    return cu_seqlens, operator.index(max_seqlen)


def check_varlen_inputs(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int | None
) -> None:
    """Raise ``ValueError``/``TypeError`` naming what does not fit the varlen contract."""
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"q, k, v must be [N, H, D]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} do not fit q {tuple(q.shape)}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"q has {q.shape[1]} heads, not a multiple of the {k.shape[1]} k/v heads")
    if not 16 <= q.shape[2] <= 256:
        raise ValueError(f"head dim {q.shape[2]} is outside the supported 16..256")
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        raise ValueError("q, k and v need a contiguous last (head) dim")
    if cu_seqlens.dim() != 1 or cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"cu_seqlens must be 1-D int32 (or int64); got {tuple(cu_seqlens.shape)} {cu_seqlens.dtype}")
    if isinstance(max_seqlen, torch.Tensor):
        raise TypeError("max_seqlen must be a host int or None, not a tensor: reading it would sync the device")


def varlen_output(q: torch.Tensor, v: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """``out`` checked against q's shape and v's dtype, or a new ``[N, H, D]`` tensor of v's dtype."""
    if out is None:
        return torch.empty(q.shape, dtype=v.dtype, device=q.device)
    if out.shape != q.shape or out.dtype != v.dtype or out.device != q.device or out.stride(-1) != 1:
        raise ValueError(
            f"out is {tuple(out.shape)} {out.dtype} on {out.device}; expected {tuple(q.shape)} "
            f"{v.dtype} on {q.device} with a contiguous last dim"
        )
    return out


def longest_segment_bound(tokens: int, cu_seqlens: torch.Tensor, max_seqlen: int | None) -> int:
    """Rows the grid must cover per segment: ``max_seqlen`` capped at ``tokens`` (``None``: ``tokens``);
    0 when there is nothing to compute (no tokens, no segments), so the caller launches nothing."""
    if tokens == 0 or cu_seqlens.shape[0] <= 1:
        return 0
    return max(0, tokens if max_seqlen is None else min(operator.index(max_seqlen), tokens))
