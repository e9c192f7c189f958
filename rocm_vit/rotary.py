"""Vision RoPE dispatch: one implementation per process, the same in eager and graph mode.

Invariant: the choice is the policy's, fixed for the process and independent of capture, so replay equals eager.
"""

from __future__ import annotations

import contextlib
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
    """NEOX RoPE on q ``[N, H, D]`` and k ``[N, KH, D]`` in place, cos/sin ``[N, D]`` only read.

    fp32 math, each result rounded to its own dtype. Contract: docs/design.md, "Rotary".
    """
    implementation(rotary_impl_name())(q, k, cos, sin)


def rotary_impl_name() -> str:
    """``"triton"``, ``"compiled"`` or ``"native"`` (the policy's); ``ValueError`` for a bad ``ROCM_VIT_ROTARY``."""
    return active_policy().rotary.value


@functools.cache
def implementation(name: str) -> RotaryFn:
    """The rotary function called ``name``, built once per process (the compiled one keeps its cache)."""
    builders = {"triton": _triton_or_native, "compiled": _compiled, "native": lambda: rotary_native_}
    return builders[name]()


def _triton_or_native() -> RotaryFn:
    # Imported only once Triton is chosen.
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
        tracing = rotated is _NOT_YET  # Dynamo traces at this call
        if tracing:
            rotated = compiled[pattern] = _compile_for_one_pattern()
        if rotated is not None:
            try:
                with _one_mode_without_grad(), _without_duck_sizing() if tracing else contextlib.nullcontext():
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


def _one_mode_without_grad() -> contextlib.AbstractContextManager:
    """Inference mode wherever grad is off: Dynamo guards on the grad mode, so a helper compiled
    while a server starts under ``no_grad`` (SGLang's default, and its captures) would compile
    again inside the first request of a server that runs under ``inference_mode``
    (``SGLANG_ENABLE_TORCH_INFERENCE_MODE``). Its outputs only feed the copies into q and k."""
    return contextlib.nullcontext() if torch.is_grad_enabled() else torch.inference_mode()


def _without_duck_sizing() -> contextlib.AbstractContextManager:
    """Dynamo's duck sizing gives sizes equal at trace time one symbol: a first call of 16 tokens
    through 16 heads compiled ``q.size(0) == q.size(1)`` into the guards, and the first request of
    any other size compiled again (seconds on ROCm). Off while tracing, the token count stays its
    own symbol. Only then: the patch costs ~40 us a call, the traced code nothing."""
    from torch.fx.experimental import _config as fx_config

    if not hasattr(fx_config, "use_duck_shape"):  # a torch without the switch
        return contextlib.nullcontext()
    return fx_config.patch(use_duck_shape=False)


def _compile_for_one_pattern() -> Callable:
    """``rope_torch.rotated_native`` under ``torch.compile`` (fullgraph, dynamic), a code object of its own.

    Own code object: Dynamo's recompile limit is per code object (docs/design.md, "Hazards"). Pure: a
    compiled in-place one failed on fused-qkv views under inference_mode.
    """
    code = rotated_native.__code__.replace()
    fresh = types.FunctionType(code, rotated_native.__globals__, rotated_native.__name__, rotated_native.__defaults__)
    return torch.compile(fresh, fullgraph=True, dynamic=True)


def _call_pattern(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple:
    """What a compilation depends on besides the token count; a failed pattern stays native for good."""
    tensors = (q, k, cos, sin)
    return (
        tuple(t.dtype for t in tensors),
        tuple(tuple(t.shape[1:]) for t in tensors),
        tuple(t.stride() for t in tensors),
        torch.is_grad_enabled(),  # without grad, always run in inference mode (_one_mode_without_grad)
        q.is_inference(),  # other dispatch keys: Dynamo traces again, so it is a pattern of its own
    )
