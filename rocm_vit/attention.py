"""Attention backends: one class per kernel, each declaring the argument list it takes per layer.

The tower and the graph runner never test a backend's name: they ask the backend for its list
(``runner_args``) once per layout and hand that list to every layer (DESIGN.md, Attention backend).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import ClassVar

import torch

from rocm_vit.backends.sdpa import sdpa_varlen
from rocm_vit.layout import VisionLayout
from rocm_vit.platform import PlatformName, current_platform
from rocm_vit.settings import load_settings

logger = logging.getLogger(__name__)


class AttentionBackend(ABC):
    """Varlen non-causal attention over packed ``q`` ``[N, H, D]``, ``k``/``v`` ``[N, KH, D]``."""

    name: ClassVar[str]

    @classmethod
    def unavailable_reason(cls, platform: PlatformName) -> str | None:
        """Why this backend cannot run on ``platform`` (what is missing), or ``None`` when it can."""
        return None

    @abstractmethod
    def runner_args(self, layout: VisionLayout, cu_seqlens: torch.Tensor) -> list:
        """The per-layer argument list for ``layout``; ``cu_seqlens`` is its int32 device tensor.

        The graph runner passes its own static ``cu_seqlens`` buffer, so the list must reference
        that tensor rather than copy it, and must hold nothing read back from the device.
        """

    @abstractmethod
    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_args: list, scale: float
    ) -> torch.Tensor:
        """Attention output ``[N, H, D]`` in ``v.dtype``."""


class SdpaAttention(AttentionBackend):
    """Per-sequence ``scaled_dot_product_attention`` with host lengths: runs anywhere."""

    name = "sdpa"

    def runner_args(self, layout: VisionLayout, cu_seqlens: torch.Tensor) -> list:
        return [layout.seq_lens]

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_args: list, scale: float
    ) -> torch.Tensor:
        (seq_lens,) = attn_args
        return sdpa_varlen(q, k, v, seq_lens, scale)


BACKENDS: dict[str, type[AttentionBackend]] = {SdpaAttention.name: SdpaAttention}


def default_backend_name(platform: PlatformName) -> tuple[str, str]:
    """The backend chosen on ``platform`` without an override, and why (for ``rocm-vit doctor``)."""
    return "sdpa", f"default on {platform}"


def resolve_backend_name(name: str | None = None) -> tuple[str, str]:
    """Apply the explicit ``name``, else ``ROCM_VIT_ATTENTION_BACKEND``, else the platform default."""
    if name:
        return name, "requested by the caller"
    override = load_settings().attention_backend
    if override:
        return override, "set by ROCM_VIT_ATTENTION_BACKEND"
    return default_backend_name(current_platform())


def get_backend(name: str | None = None) -> AttentionBackend:
    """Build the backend to use; fails now, naming backend, platform and what is missing, if it cannot run."""
    chosen, reason = resolve_backend_name(name)
    platform = current_platform()
    backend_cls = BACKENDS.get(chosen)
    if backend_cls is None:
        raise ValueError(f"attention backend {chosen!r} ({reason}) is unknown; known: {sorted(BACKENDS)}")
    missing = backend_cls.unavailable_reason(platform)
    if missing:
        raise RuntimeError(f"attention backend {chosen!r} ({reason}) cannot run on {platform}: {missing}")
    logger.debug("attention backend %s (%s)", chosen, reason)
    return backend_cls()
