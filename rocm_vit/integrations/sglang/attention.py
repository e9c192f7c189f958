"""SGLang's vision attention on rocm-vit: the ``aiter_attn`` slot and the rotary policy.

Both keep SGLang's signatures, read nothing back from the device when host data is given, and run
the same function with and without graphs. What SGLang's own versions did: docs/sglang.md, "What
the plugin changes".
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

import torch
from sglang.srt.layers.attention.vision import VisionAttentionMetadata, resolve_seqlens
from sglang.srt.layers.rotary_embedding.utils import apply_rotary_pos_emb_native_eager
from torch import nn

from rocm_vit.attention import AutoAttention, get_backend
from rocm_vit.policy import active_policy
from rocm_vit.rotary import apply_rotary

logger = logging.getLogger(__name__)


class AiterVisionAttention(nn.Module):
    """SGLang's ``aiter_attn`` slot, backed by rocm-vit's aiter varlen attention or the tuned ``auto``.

    Construction fails where aiter cannot run, as SGLang's does. Under ``auto``, the eager path reads
    the segment lengths back once per forward to choose as the graph path does: the same bits.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        choice = active_policy().attention.for_aiter
        head_dim = kwargs.get("head_dim")
        self.attention = get_backend(choice.value, head_dim)
        logger.debug("SGLang's aiter_attn slot: %s (%s)", choice.value, choice.reason)
        self._prepare(head_dim, kwargs.get("num_heads"), kwargs.get("num_kv_heads"))

    def _prepare(self, head_dim: int | None, heads: int | None, kv_heads: int | None) -> None:
        """Load or build aiter's kernel while SGLang builds the model (under its dtype and device as
        defaults), not in the first request; a failure is left to the first call."""
        dtype, device = torch.get_default_dtype(), torch.get_default_device()
        if dtype not in (torch.float16, torch.bfloat16) or not all(isinstance(n, int) for n in (head_dim, heads)):
            logger.debug("aiter_attn: not prepared (default dtype %s, head dim %s, heads %s)", dtype, head_dim, heads)
            return
        try:
            self.attention.prepare(head_dim, heads, kv_heads if isinstance(kv_heads, int) else heads, dtype, device)
        except Exception:  # construction must not fail over a warm-up; the first call reports it
            logger.exception("aiter_attn: preparing aiter's kernel for head dim %d failed", head_dim)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_seqlens: torch.Tensor | list | Any | None,
        bsz: int,
        seq_len: int,
        softmax_scale: float | None = None,
        forward_metadata: VisionAttentionMetadata | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """Attention over packed ``q`` ``[N, H, D]``, ``k``/``v`` ``[N, KH, D]``; returns ``[N, H, D]``.

        ``cu_seqlens``: a graph runner's list, or (eager) a tensor, SGLang's ``SingletonCache`` or
        ``None``; ``forward_metadata.max_seqlen`` or a ``max_seqlen`` keyword spares the device read.
        """
        if isinstance(cu_seqlens, list):
            layer_args = self.attention.layer_args_from_tensor(*cu_seqlens)
        elif forward_metadata is not None:
            offsets, max_seqlen = forward_metadata.cu_seqlens, forward_metadata.max_seqlen
            host_lengths = self._host_lengths(forward_metadata)
            layer_args = self.attention.layer_args_from_tensor(offsets, max_seqlen, host_lengths)
        else:
            offsets = resolve_seqlens(cu_seqlens, bsz, seq_len, device=q.device)
            max_seqlen = kwargs.get("max_seqlen")
            host_max = max_seqlen if isinstance(max_seqlen, int) else None
            layer_args = self.attention.layer_args_from_tensor(offsets, host_max)
        scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
        return self.attention(q, k, v, layer_args, scale)

    def _host_lengths(self, metadata: VisionAttentionMetadata) -> tuple[int, ...] | None:
        """The segment lengths ``auto`` chooses by: read once per forward (every layer gets the same
        metadata object), none for aiter, which needs only ``max_seqlen``."""
        global _last_lengths
        if not isinstance(self.attention, AutoAttention):
            return None
        last = _last_lengths  # one read: another thread may replace it, never change it
        if last[0] is not metadata:
            offsets = metadata.cu_seqlens.tolist()  # one host read per forward, not per layer
            last = _last_lengths = (metadata, tuple(end - start for start, end in itertools.pairwise(offsets)))
        return last[1]


# The metadata of the latest forward and its host segment lengths, shared by every layer. Holding
# the metadata keeps it alive, so the identity check cannot match a newer object at its address.
_last_lengths: tuple[VisionAttentionMetadata | None, tuple[int, ...]] = (None, ())


def rotary_pos_emb(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """SGLang's ``apply_rotary_pos_emb`` contract on rocm-vit's rotary: the rotated ``(q, k)``, in place
    for ``[N, H, D]`` q/k and ``[N, D]`` cos/sin; other shapes keep SGLang's native helper."""
    if unsqueeze_dim != 1 or q.dim() != 3 or k.dim() != 3 or cos.dim() != 2 or sin.dim() != 2:
        return apply_rotary_pos_emb_native_eager(q, k, cos, sin, unsqueeze_dim)
    apply_rotary(q, k, cos, sin)
    return q, k
