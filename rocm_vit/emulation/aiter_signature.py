"""aiter's ``flash_attn_varlen_func`` parameter lists, pinned from the source, to compare against.

Each list holds ``(name, kind name, repr of the default or None)``, so a test can tell the installed
aiter from the one the stand-in models. Where each was read: docs/design.md, "The aiter stand-in".
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

Parameter = tuple[str, str, "str | None"]

PYPI_RELEASE = "0.1.7.post2.dev18"
TARGET_RELEASE = "v0.1.20.post1"
TARGET_RELEASE_COMMIT = "de07f3885ee5f2030ba72b6cc5940d674fd457cf"
MAIN_COMMIT = "e4048607a535ace3a2b51ded31b1c8c2d45c0879"
MAIN_DATE = "2026-08-22"

_P = "POSITIONAL_OR_KEYWORD"

# q .. cu_seqlens_k_padded, the prefix every pinned version shares but for window_size's default.
_COMMON_HEAD: tuple[Parameter, ...] = (
    ("q", _P, None),
    ("k", _P, None),
    ("v", _P, None),
    ("cu_seqlens_q", _P, None),
    ("cu_seqlens_k", _P, None),
    ("max_seqlen_q", _P, None),
    ("max_seqlen_k", _P, None),
    ("min_seqlen_q", _P, "0"),
    ("dropout_p", _P, "0.0"),
    ("softmax_scale", _P, "None"),
    ("logits_soft_cap", _P, "0.0"),
    ("causal", _P, "False"),
)
_COMMON_TAIL: tuple[Parameter, ...] = (
    ("bias", _P, "None"),
    ("alibi_slopes", _P, "None"),
    ("deterministic", _P, "False"),
    ("return_lse", _P, "False"),
    ("return_attn_probs", _P, "False"),
    ("how_v3_bf16_cvt", _P, "1"),
    ("block_table", _P, "None"),
    ("out", _P, "None"),
    ("cu_seqlens_q_padded", _P, "None"),
    ("cu_seqlens_k_padded", _P, "None"),
)

PYPI_PARAMETERS: tuple[Parameter, ...] = (*_COMMON_HEAD, ("window_size", _P, "(-1, -1)"), *_COMMON_TAIL)
RELEASE_PARAMETERS: tuple[Parameter, ...] = (
    *_COMMON_HEAD,
    ("window_size", _P, "(-1, -1, 0)"),
    *_COMMON_TAIL,
    ("sink_ptr", _P, "None"),
)
MAIN_PARAMETERS: tuple[Parameter, ...] = RELEASE_PARAMETERS

# Version -> pinned list, for comparing an installed aiter with the list of its own version.
PINNED: dict[str, tuple[Parameter, ...]] = {
    PYPI_RELEASE: PYPI_PARAMETERS,
    TARGET_RELEASE: RELEASE_PARAMETERS,
    f"main@{MAIN_COMMIT[:12]}": MAIN_PARAMETERS,
}


def parameter_list(func: Callable) -> list[Parameter]:
    """``(name, kind, repr(default) or None)`` for each parameter of ``func``, in order."""
    return [
        (name, parameter.kind.name, None if parameter.default is inspect.Parameter.empty else repr(parameter.default))
        for name, parameter in inspect.signature(func).parameters.items()
    ]
