"""NEOX (rotate-half) vision RoPE in plain torch: the reference, the CPU path and the fallback.

It performs exactly the operations of transformers' ``apply_rotary_pos_emb_vision`` (Qwen3-VL), so on
a CPU its result is bit-identical to the Hugging Face tower, and on a GPU in eager mode it matches
the Triton kernel in ``triton_rope`` bit for bit (both round each fp32 product and sum separately).
"""

from __future__ import annotations

import torch


def rotary_native_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotate ``q`` and ``k`` in place.

    q ``[..., N, H, D]``, k ``[..., N, KH, D]``, cos/sin ``[..., N, D]`` broadcastable against them
    after inserting the head axis; any float dtypes, any strides. The math runs in fp32 and each
    result is rounded back to its own tensor's dtype, as transformers does. Allocates fp32
    temporaries, so it is a fallback, not the fast path.
    """
    cos = cos.unsqueeze(-2).float()
    sin = sin.unsqueeze(-2).float()
    for x in (q, k):
        x_float = x.float()
        # The fp32 result is a fresh tensor, so copying it into x is safe even when x is already fp32
        # (then x.float() is x itself).
        x.copy_(x_float * cos + _rotate_half(x_float) * sin)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
