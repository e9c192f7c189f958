"""What the vendor varlen kernels (aiter, torch varlen, FlashAttention-4) take besides q, k, v.

Each wants int32 contiguous segment offsets on q's device and the longest segment as a host int. A
tensor ``max_seqlen`` is refused rather than read: reading it would sync the device in every forward.
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
