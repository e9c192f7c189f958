"""What each attention backend needs to run, declared once per backend, and the one check of it.

Invariant: the policy chooses only among backends ``unavailable_reason`` accepts; modules are found,
never imported. Adding a backend: one class in ``rocm_vit.attention``, one entry in ``REQUIREMENTS``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from rocm_vit.backends.aiter_attn import AITER_MISSING
from rocm_vit.backends.fa4_attn import FA4_MISSING
from rocm_vit.platform import Facts, PlatformName

ANY_PLATFORM: frozenset[PlatformName] = frozenset({"cuda", "rocm", "cpu"})


@dataclass(frozen=True)
class Requirements:
    """What backend ``name`` needs; each refusal message names what is missing (``head_dims`` None: any)."""

    name: str
    platforms: frozenset[PlatformName] = ANY_PLATFORM
    platform_needs: str = ""
    modules: Mapping[str, str] = field(default_factory=dict)
    cpu_needs_interpreter: bool = False  # on a CPU it runs only under TRITON_INTERPRET=1 (tests)
    min_capability: tuple[int, int] | None = None
    max_capability: tuple[int, int] | None = None
    capability_needs: str = ""
    head_dims: tuple[int, ...] | None = None

    def unavailable_reason(self, facts: Facts, head_dim: int | None = None) -> str | None:
        """Why this backend cannot run with ``facts`` (at ``head_dim``, when given), or ``None``."""
        if facts.platform not in self.platforms:
            return f"{self.name} needs {self.platform_needs}; this machine is {facts.platform}"
        missing = next((why for module, why in self.modules.items() if module not in facts.modules), None)
        if missing is not None:
            return missing
        if facts.platform == "cpu" and self.cpu_needs_interpreter and not facts.triton_interpret:
            return f"{self.name} needs a CUDA or ROCm GPU (or TRITON_INTERPRET=1, for tests)"
        if facts.platform == "cuda" and (self.min_capability or self.max_capability):
            capability = facts.capability or (0, 0)
            if capability < (self.min_capability or capability) or capability > (self.max_capability or capability):
                return f"{self.capability_needs}; this GPU is sm_{capability[0]}{capability[1]}"
        return self.head_dim_reason(head_dim)

    def head_dim_reason(self, head_dim: int | None) -> str | None:
        """Why the kernel does not take ``head_dim`` (``None``: unknown, so no reason), or ``None``."""
        if head_dim is None or self.head_dims is None or head_dim in self.head_dims:
            return None
        return f"{self.name} takes head dims {', '.join(map(str, self.head_dims))}, not {head_dim}"


_AITER_PLATFORM = "ROCm on an AMD Instinct GPU"
_NVIDIA = "an NVIDIA GPU (CUDA)"

REQUIREMENTS: dict[str, Requirements] = {
    needs.name: needs
    for needs in (
        Requirements("sdpa"),
        Requirements("aiter_attn", frozenset({"rocm"}), _AITER_PLATFORM, {"aiter": AITER_MISSING}),
        Requirements("aiter_attn_pad128", frozenset({"rocm"}), _AITER_PLATFORM, {"aiter": AITER_MISSING}),
        Requirements(
            "triton_attn",
            modules={"triton": "triton is not installed (it ships with torch on CUDA and ROCm builds)"},
            cpu_needs_interpreter=True,
        ),
        Requirements(
            "gluon_attn",
            frozenset({"cuda"}),
            "an NVIDIA Hopper GPU (sm_90)",
            {
                "triton.experimental.gluon": (
                    "this Triton has no Gluon (triton.experimental.gluon); gluon_attn was run with Triton 3.6"
                )
            },
            min_capability=(9, 0),
            max_capability=(9, 0),
            capability_needs="gluon_attn's kernel is Hopper's (wgmma and TMA, sm_90)",
            head_dims=(64, 72, 80),  # backends/gluon_attn.py's GLUON_HEAD_DIMS; other calls run triton_attn
        ),
        Requirements(
            "torch_varlen",
            frozenset({"cuda"}),
            _NVIDIA,
            {
                "torch.nn.attention.varlen": (
                    f"torch_varlen needs torch >= 2.10 (torch.nn.attention.varlen); this is torch {torch.__version__}"
                )
            },
        ),
        Requirements(
            "fa4",
            frozenset({"cuda"}),
            _NVIDIA,
            {"flash_attn.cute": FA4_MISSING},
            min_capability=(9, 0),
            capability_needs="fa4 is used from sm_90 (Hopper) on",
        ),
        Requirements(
            "auto",
            frozenset({"cuda", "rocm"}),
            "a GPU: it picks among GPU kernels per layout (on a CPU name a backend or use the default)",
        ),
    )
}


def backend_unavailable_reason(name: str, facts: Facts, head_dim: int | None = None) -> str | None:
    """Why backend ``name`` cannot run with ``facts``, or ``None``; ``KeyError`` for an undeclared name."""
    return REQUIREMENTS[name].unavailable_reason(facts, head_dim)
