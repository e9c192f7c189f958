"""NEOX (rotate-half) vision RoPE in plain torch: the reference, the CPU path and the fallback.

The operations of transformers' ``apply_rotary_pos_emb_vision``, so bit-identical to the Hugging Face
tower on a CPU and to ``triton_rope`` on a GPU (both round each fp32 product and sum separately).
``rotated_native`` is the same math as a pure function, what ROCm compiles: a compiled in-place helper
fails on views of one fused qkv under ``inference_mode`` (AOTAutograd replays aliased mutations).
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
    q_rotated, k_rotated = rotated_native(q, k, cos, sin)
    q.copy_(q_rotated)
    k.copy_(k_rotated)


def rotated_native(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rotated q, rotated k)`` as new tensors in q's and k's own dtypes; the inputs are only read.

    Shapes and rounding as ``rotary_native_``: fp32 math, one round-to-nearest-even cast per result,
    which is what ``copy_`` of the fp32 result into q or k does.
    """
    cos = cos.unsqueeze(-2).float()
    sin = sin.unsqueeze(-2).float()
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x_float = x.float()
    return (x_float * cos + _rotate_half(x_float) * sin).to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
