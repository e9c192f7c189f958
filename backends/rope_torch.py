"""NEOX (rotate-half) vision RoPE in plain torch: the reference, the CPU path and the fallback.

Invariant: transformers' ``apply_rotary_pos_emb_vision`` operations, so bit-identical to it on a CPU and
to ``triton_rope`` on a GPU. ``rotated_native`` is the pure form the compiled rotary compiles (``rotary.py``).
"""

from __future__ import annotations

import torch


def rotary_native_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotate q ``[..., N, H, D]`` and k ``[..., N, KH, D]`` in place; cos/sin ``[..., N, D]``; any dtypes.

    fp32 math, each result rounded to its own dtype; allocates fp32 temporaries.
    """
    q_rotated, k_rotated = rotated_native(q, k, cos, sin)
    q.copy_(q_rotated)
    k.copy_(k_rotated)


def rotated_native(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rotated q, rotated k)`` as new tensors, shapes and rounding as ``rotary_native_``; inputs only read."""
    cos = cos.unsqueeze(-2).float()
    sin = sin.unsqueeze(-2).float()
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x_float = x.float()
    return (x_float * cos + _rotate_half(x_float) * sin).to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
