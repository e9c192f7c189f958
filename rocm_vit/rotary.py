"""Vision RoPE dispatch: one implementation per process, the same in eager and graph mode.

Graph replay is bit-identical to eager only if both run the same rotary code, so the choice is the
policy's (per platform, tuned by ``rocm-vit tune``, or ``ROCM_VIT_ROTARY``), fixed for the process,
and never depends on whether a capture is running.
"""

from __future__ import annotations

import functools
import logging
import types
from collections.abc import Callable

import torch

from rocm_vit.backends.rope_torch import rotary_native_, rotated_native
from rocm_vit.policy import active_policy

logger = logging.getLogger(__name__)

RotaryFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Apply NEOX (rotate-half) RoPE to ``q`` and ``k`` in place; ``cos`` and ``sin`` are only read.

    q ``[N, H, D]``, k ``[N, KH, D]`` (KH may differ from H), cos/sin ``[N, D]``, any float dtypes
    (Qwen3-VL passes fp32 cos/sin); the math runs in fp32 and each result is rounded to its own
    tensor's dtype, so q and k may differ in dtype. Nothing is returned and nothing else is written.

    CUDA: the Triton kernel (one launch, no allocation, capturable; other shapes: the native helper,
    which allocates fp32 temporaries). ROCm: the native math under ``torch.compile``, compiled per
    dtype and stride pattern by the first call (the runner's eager warm-up, before any capture); a
    failed compile is logged once and that pattern served natively for good. CPU: the native helper.
    Triton and native round like transformers' eager helper bit for bit; the compiled one may differ
    in the last bit. Contract: docs/design.md, "Rotary".
    """
    implementation(rotary_impl_name())(q, k, cos, sin)


def rotary_impl_name() -> str:
    """``"triton"``, ``"compiled"`` or ``"native"``: what ``apply_rotary`` uses (the policy's choice).

    Raises ``ValueError`` when ``ROCM_VIT_ROTARY`` names no implementation.
    """
    return active_policy().rotary.value


@functools.cache
def implementation(name: str) -> RotaryFn:
    """The rotary function called ``name``, built once per process (the compiled one keeps its cache)."""
    builders = {"triton": _triton_or_native, "compiled": _compiled, "native": lambda: rotary_native_}
    return builders[name]()


def _triton_or_native() -> RotaryFn:
    # Imported only once Triton is chosen: importing it on a ROCm box that uses the compiled path,
    # or on a CPU-only install, would be wasted work.
    from rocm_vit.backends import triton_rope

    supports, kernel = triton_rope.triton_rotary_supports, triton_rope.triton_rotary_

    def rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
        if supports(q, k, cos, sin):
            kernel(q, k, cos, sin)
        else:
            rotary_native_(q, k, cos, sin)

    return rotary


def _compiled() -> RotaryFn:
    compiled: dict[tuple, Callable | None] = {}  # call pattern -> its compiled function, None: failed

    def rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
        pattern = _call_pattern(q, k, cos, sin)
        rotated = compiled.get(pattern, _NOT_YET)
        if rotated is _NOT_YET:
            rotated = compiled[pattern] = _compile_for_one_pattern()
        if rotated is not None:
            try:
                q_rotated, k_rotated = rotated(q, k, cos, sin)
            except Exception as error:  # a compiler failure must not fail the request
                compiled[pattern] = None
                logger.warning(
                    "rotary: torch.compile failed for %s (%s: %s); these calls use the native helper",
                    pattern,
                    type(error).__name__,
                    error,
                )
            else:
                q.copy_(q_rotated)
                k.copy_(k_rotated)
                return
        rotary_native_(q, k, cos, sin)

    return rotary


_NOT_YET = object()


def _compile_for_one_pattern() -> Callable:
    """``rope_torch.rotated_native`` under ``torch.compile``, with a code object of its own.

    fullgraph: fail at the first call, not run part of it eagerly. dynamic: one compile for every
    token count. A code object per call pattern, because Dynamo's recompile limit (8) is per code
    object and past it a graph and an eager run could disagree in the last bit (docs/design.md,
    "Hazards"). Pure, because a compiled in-place one failed on fused-qkv views under inference_mode.
    """
    code = rotated_native.__code__.replace()
    fresh = types.FunctionType(code, rotated_native.__globals__, rotated_native.__name__, rotated_native.__defaults__)
    return torch.compile(fresh, fullgraph=True, dynamic=True)


def _call_pattern(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple:
    """What a compilation depends on besides the token count: dtypes, head layout, strides, grad mode.

    Each pattern has its own compiled function; a failed one falls back for good, so graph captures
    and eager runs of a pattern always agree.
    """
    tensors = (q, k, cos, sin)
    return (
        tuple(t.dtype for t in tensors),
        tuple(tuple(t.shape[1:]) for t in tensors),
        tuple(t.stride() for t in tensors),
        torch.is_inference_mode_enabled(),
        torch.is_grad_enabled(),
    )
