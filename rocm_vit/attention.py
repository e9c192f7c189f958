"""Attention backends: one class per kernel, each declaring the argument list it takes per layer.

The tower and the graph runner never test a backend's name: they ask the backend for its list
(``runner_args``) once per layout segmentation and hand each layer the list of the segmentation it
attends within (DESIGN.md, Attention backend); ``layout_args`` builds them all. Callers without a
layout (SGLang's ``VisionAttention``) build the list from a ``cu_seqlens`` tensor with
``attn_args_from_tensor``.

Selection (``default_backend_name``): ROCm with aiter and ``SGLANG_USE_AITER=1`` -> ``aiter_attn``;
ROCm otherwise -> ``triton_attn``; CUDA -> ``auto`` (a kernel per layout, from host-side lengths,
``fa4`` among them for long segments where flash-attn-4 is installed); CPU -> ``sdpa``.
``ROCM_VIT_ATTENTION_BACKEND`` or an explicit name overrides it, and a backend that cannot run here
fails in ``get_backend``, at tower construction, not at the first request.
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
import logging
import operator
import os
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar

import torch

from rocm_vit.backends.sdpa import sdpa_varlen
from rocm_vit.layout import Segmentation, VisionLayout
from rocm_vit.platform import PlatformName, current_platform, platform_info
from rocm_vit.settings import Settings, load_settings

logger = logging.getLogger(__name__)

# The CUDA rule (``pick_cuda_backend``), from `rocm-vit bench-attn` and graph-timed sweeps on an H200
# (bf16, 16 heads, head dim 72, torch 2.11; docs/benchmarks.md). SDPA's default kernel there is
# cuDNN's fused attention (the profiler shows cudnn_generated_fort_native_sdpa_sm90_flash_fprop):
# fastest on long segments (1x1024: 19.7 us vs 23.4 triton_attn; 1x4096: 216 vs 236; 1x12800: 2.0-2.1
# ms vs 2.14-2.18) and on a few long ragged segments (4 segments >= 1024 tokens: 0.35 ms vs 0.38).
# Below 1024 tokens triton_attn is as fast or faster (1x196: 8.7 us vs 9.4 plus a memset; 4x196: 8.5
# vs 11.1; 16x256: 25.0 vs 25.5), and many or short ragged segments pay one SDPA launch each
# (16 segments: 1.0 ms) where one triton_attn launch takes 0.20 ms (torch_varlen 0.28). SDPA's other
# cost: cuDNN builds a plan on the first call of each new shape (50-250 ms, 660 ms for 16 ragged
# lengths); under graphs the warm-up before capture pays it once per layout.
CUDA_SDPA_MAX_SEGMENTS = 4
CUDA_SDPA_MIN_SEGMENT_TOKENS = 1024
# FlashAttention-4 (``fa4``, where installed on sm_90+) for layouts whose longest segment has at least
# this many tokens. H200, head dim 72, graph-timed: 1x12800 1.48 ms vs 2.15 cuDNN SDPA; 2x8192 1.24
# vs 1.57; 1x4096 188 us vs 211; ragged (4096, 1024, 2048, 512) 244 us vs 335 triton_attn. Shorter
# layouts lose: 1x1024 23.6 us vs 20.7 SDPA, 16x256 46 vs 27, 1x196 11.2 vs 7.5 triton_attn.
CUDA_FA4_MIN_LONGEST_TOKENS = 2048
# The varlen kernel for the other layouts, in order of preference where available.
CUDA_VARLEN_PREFERENCE = ("triton_attn", "torch_varlen")

# What a tower's ``forward_blocks`` takes: one backend argument list per segmentation of the
# layout, keyed by its name (``"full"``; ``"window"`` too for a windowed layout).
AttnArgs = dict[str, list]


class AttentionBackend(ABC):
    """Varlen non-causal attention over packed ``q`` ``[N, H, D]``, ``k``/``v`` ``[N, KH, D]``."""

    name: ClassVar[str]

    @classmethod
    def unavailable_reason(cls, platform: PlatformName) -> str | None:
        """Why this backend cannot run on ``platform`` (what is missing), or ``None`` when it can."""
        return None

    @abstractmethod
    def runner_args(self, segmentation: Segmentation | VisionLayout, cu_seqlens: torch.Tensor) -> list:
        """The per-layer argument list for ``segmentation``; ``cu_seqlens`` is its int32 device tensor.

        A ``VisionLayout`` stands for its full segmentation. The graph runner passes its own static
        ``cu_seqlens`` buffer, so the list must reference that tensor rather than copy it, and must
        hold nothing read back from the device.
        """

    def layout_args(self, layout: VisionLayout, cu_seqlens: Mapping[str, torch.Tensor]) -> AttnArgs:
        """``runner_args`` of every segmentation of ``layout``, by name: what ``forward_blocks`` takes.

        ``cu_seqlens`` maps each segmentation's name to its int32 device tensor (the layout's own,
        or the graph runner's static buffers).
        """
        return {
            name: self.runner_args(segmentation, cu_seqlens[name])
            for name, segmentation in layout.segmentations.items()
        }

    @abstractmethod
    def attn_args_from_tensor(
        self,
        cu_seqlens: torch.Tensor,
        max_seqlen: int | None = None,
        seq_lens: Sequence[int] | None = None,
    ) -> list:
        """The per-layer argument list for a caller that holds only a ``cu_seqlens`` tensor.

        ``max_seqlen`` and ``seq_lens`` are host data the caller may already have; pass them. A
        backend that needs host lengths takes them from a CPU ``cu_seqlens`` for free and, only as
        a last resort, reads a device ``cu_seqlens`` back (a host sync, logged once per backend).
        """

    @abstractmethod
    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_args: list, scale: float
    ) -> torch.Tensor:
        """Attention output ``[N, H, D]`` in ``v.dtype``."""


class SdpaAttention(AttentionBackend):
    """Per-sequence ``scaled_dot_product_attention`` with host lengths: runs anywhere.

    SDPA picks its kernel from shapes and dtypes only, so eager and captured runs use the same one.
    """

    name = "sdpa"

    def runner_args(self, segmentation: Segmentation | VisionLayout, cu_seqlens: torch.Tensor) -> list:
        return [segmentation.seq_lens]

    def attn_args_from_tensor(
        self,
        cu_seqlens: torch.Tensor,
        max_seqlen: int | None = None,
        seq_lens: Sequence[int] | None = None,
    ) -> list:
        return [_host_seq_lens(self.name, cu_seqlens, seq_lens)]

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_args: list, scale: float
    ) -> torch.Tensor:
        (seq_lens,) = attn_args
        return sdpa_varlen(q, k, v, seq_lens, scale)


class _VarlenAttention(AttentionBackend):
    """A kernel taking ``[cu_seqlens, max_seqlen]``: the int32 device offsets and a host int.

    Subclasses set ``_attend(q, k, v, cu_seqlens, max_seqlen, scale)``, their kernel's wrapper.
    """

    _attend: Callable[..., torch.Tensor]

    def runner_args(self, segmentation: Segmentation | VisionLayout, cu_seqlens: torch.Tensor) -> list:
        return [cu_seqlens, segmentation.max_seqlen]

    def attn_args_from_tensor(
        self,
        cu_seqlens: torch.Tensor,
        max_seqlen: int | None = None,
        seq_lens: Sequence[int] | None = None,
    ) -> list:
        return [cu_seqlens, _host_max_seqlen(self.name, cu_seqlens, max_seqlen, seq_lens)]

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_args: list, scale: float
    ) -> torch.Tensor:
        cu_seqlens, max_seqlen = attn_args
        return self._attend(q, k, v, cu_seqlens, max_seqlen, scale)


class AiterAttention(_VarlenAttention):
    """aiter's ``flash_attn_varlen_func`` (ROCm): ``aiter`` is imported at the first call."""

    name = "aiter_attn"

    def __init__(self) -> None:
        from rocm_vit.backends.aiter_attn import aiter_varlen_attention

        self._attend = aiter_varlen_attention

    @classmethod
    def unavailable_reason(cls, platform: PlatformName) -> str | None:
        if platform != "rocm":
            return f"aiter_attn needs ROCm on an AMD Instinct GPU; this machine is {platform}"
        if not _module_available("aiter"):
            from rocm_vit.backends.aiter_attn import AITER_MISSING

            return AITER_MISSING
        return None


class TritonAttention(_VarlenAttention):
    """rocm-vit's Triton varlen kernel (CUDA and ROCm; on a CPU only under ``TRITON_INTERPRET=1``).

    Its list is ``[cu_seqlens, max_seqlen]``, not SGLang's ``[cu_seqlens, seq_lens, max_seqlen]``:
    the kernel reads each segment's bounds from ``cu_seqlens`` on the device and uses
    ``max_seqlen`` only to size its grid, so per-segment host lengths would be dead weight.
    """

    name = "triton_attn"

    def __init__(self) -> None:
        from rocm_vit.backends.triton_attn import triton_varlen_attention

        # The platform's arch picks the tiles: under ROCm emulation an NVIDIA GPU runs the HIP ones.
        self._attend = functools.partial(triton_varlen_attention, arch=platform_info().arch or None)

    @classmethod
    def unavailable_reason(cls, platform: PlatformName) -> str | None:
        if not _module_available("triton"):
            return "triton is not installed (it ships with torch on CUDA and ROCm builds)"
        if platform == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            return "triton_attn needs a CUDA or ROCm GPU (or TRITON_INTERPRET=1, for tests)"
        return None

    def attn_args_from_tensor(
        self,
        cu_seqlens: torch.Tensor,
        max_seqlen: int | None = None,
        seq_lens: Sequence[int] | None = None,
    ) -> list:
        # max_seqlen only bounds the grid: without host data the kernel bounds it by the token
        # count (None), which costs empty programs but never a device read.
        if max_seqlen is None and seq_lens is None and cu_seqlens.device.type != "cpu":
            return [cu_seqlens, None]
        return super().attn_args_from_tensor(cu_seqlens, max_seqlen, seq_lens)


class TorchVarlenAttention(_VarlenAttention):
    """``torch.nn.attention.varlen.varlen_attn`` (torch >= 2.10; FlashAttention-2 on CUDA)."""

    name = "torch_varlen"

    def __init__(self) -> None:
        from rocm_vit.backends.torch_varlen import torch_varlen_attention

        self._attend = torch_varlen_attention

    @classmethod
    def unavailable_reason(cls, platform: PlatformName) -> str | None:
        if platform != "cuda":
            return f"torch_varlen needs an NVIDIA GPU (CUDA); this machine is {platform}"
        if not _module_available("torch.nn.attention.varlen"):
            return f"torch_varlen needs torch >= 2.10 (torch.nn.attention.varlen); this is torch {torch.__version__}"
        return None


class Fa4Attention(_VarlenAttention):
    """FlashAttention-4's varlen kernel (``flash_attn.cute``; NVIDIA sm_90+): imported at the first call."""

    name = "fa4"

    def __init__(self) -> None:
        from rocm_vit.backends.fa4_attn import fa4_varlen_attention

        self._attend = fa4_varlen_attention

    @classmethod
    def unavailable_reason(cls, platform: PlatformName) -> str | None:
        if platform != "cuda":
            return f"fa4 needs an NVIDIA GPU (CUDA); this machine is {platform}"
        if not _module_available("flash_attn.cute"):
            from rocm_vit.backends.fa4_attn import FA4_MISSING

            return FA4_MISSING
        major, minor = torch.cuda.get_device_capability()
        if major < 9:
            return f"fa4 is used from sm_90 (Hopper) on; this GPU is sm_{major}{minor}"
        return None


class CudaAutoAttention(AttentionBackend):
    """CUDA's default: per segmentation, the kernel ``pick_cuda_backend`` names from host-side lengths.

    The choice is made in ``runner_args`` from the segmentation alone, so one layout always gets the
    same kernels and a captured graph replays exactly what the eager run computed. Its list is
    ``[backend, that backend's list]``.
    """

    name = "auto"

    def __init__(self) -> None:
        self._sdpa = SdpaAttention()
        self._varlen = BACKENDS[cuda_varlen_name()]()
        self._long = Fa4Attention() if Fa4Attention.unavailable_reason("cuda") is None else None

    @classmethod
    def unavailable_reason(cls, platform: PlatformName) -> str | None:
        if platform != "cuda":
            return f"auto picks among CUDA kernels per layout; on {platform} name a backend or use the default"
        return None

    def runner_args(self, segmentation: Segmentation | VisionLayout, cu_seqlens: torch.Tensor) -> list:
        backend = self._pick(segmentation.seq_lens)
        return [backend, backend.runner_args(segmentation, cu_seqlens)]

    def attn_args_from_tensor(
        self,
        cu_seqlens: torch.Tensor,
        max_seqlen: int | None = None,
        seq_lens: Sequence[int] | None = None,
    ) -> list:
        # Choosing needs host lengths; without them (a device tensor only) the varlen kernel runs,
        # since it needs none.
        if seq_lens is None and cu_seqlens.device.type == "cpu":
            seq_lens = _host_seq_lens(self.name, cu_seqlens, None)
        backend = self._varlen if seq_lens is None else self._pick(seq_lens)
        return [backend, backend.attn_args_from_tensor(cu_seqlens, max_seqlen, seq_lens)]

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_args: list, scale: float
    ) -> torch.Tensor:
        backend, backend_args = attn_args
        return backend(q, k, v, backend_args, scale)

    def _pick(self, seq_lens: Sequence[int]) -> AttentionBackend:
        name, _ = pick_cuda_backend(seq_lens, self._varlen.name, self._long.name if self._long else None)
        by_name = {SdpaAttention.name: self._sdpa, self._varlen.name: self._varlen}
        if self._long is not None:
            by_name[self._long.name] = self._long
        return by_name[name]


BACKENDS: dict[str, type[AttentionBackend]] = {
    backend.name: backend
    for backend in (
        SdpaAttention,
        AiterAttention,
        TritonAttention,
        TorchVarlenAttention,
        Fa4Attention,
        CudaAutoAttention,
    )
}


def pick_cuda_backend(
    seq_lens: Sequence[int], varlen_name: str = "triton_attn", long_name: str | None = None
) -> tuple[str, str]:
    """The CUDA rule: ``("sdpa", varlen_name or long_name, why)`` for a layout's host-side segment lengths.

    ``long_name`` (FlashAttention-4, where installed) when the longest segment has at least
    ``CUDA_FA4_MIN_LONGEST_TOKENS`` tokens. Otherwise SDPA when every segment has at least
    ``CUDA_SDPA_MIN_SEGMENT_TOKENS`` tokens and it runs as one batched call (all equally long) or as
    a few calls; the one-launch varlen kernel otherwise.
    """
    lengths = [operator.index(length) for length in seq_lens]
    if long_name is not None and max(lengths) >= CUDA_FA4_MIN_LONGEST_TOKENS:
        return long_name, f"longest of {len(lengths)} segments has {max(lengths)} tokens: {long_name}"
    if min(lengths) < CUDA_SDPA_MIN_SEGMENT_TOKENS:
        return varlen_name, f"shortest of {len(lengths)} segments has {min(lengths)} tokens: one varlen launch"
    if len(set(lengths)) == 1:
        return SdpaAttention.name, f"{len(lengths)} equal segments: one batched SDPA call"
    if len(lengths) <= CUDA_SDPA_MAX_SEGMENTS:
        return SdpaAttention.name, f"{len(lengths)} segments of >= {CUDA_SDPA_MIN_SEGMENT_TOKENS} tokens"
    return varlen_name, f"{len(lengths)} segments of >= {CUDA_SDPA_MIN_SEGMENT_TOKENS} tokens: one varlen launch"


def cuda_varlen_name() -> str:
    """The varlen kernel ``auto`` uses on CUDA: the first available of ``CUDA_VARLEN_PREFERENCE``."""
    for name in CUDA_VARLEN_PREFERENCE:
        if BACKENDS[name].unavailable_reason("cuda") is None:
            return name
    return SdpaAttention.name


def default_backend_name(platform: PlatformName, settings: Settings | None = None) -> tuple[str, str]:
    """The backend chosen on ``platform`` without an override, and why (for ``rocm-vit doctor``).

    Availability is checked without importing aiter (``importlib.util.find_spec``).
    """
    settings = settings or load_settings()
    if platform == "rocm":
        has_aiter = _module_available("aiter")
        if has_aiter and settings.use_aiter:
            return AiterAttention.name, "ROCm with aiter installed and SGLANG_USE_AITER=1"
        why = "SGLANG_USE_AITER is off" if has_aiter else "aiter is not installed (pip install rocm-vit[aiter])"
        if TritonAttention.unavailable_reason(platform) is None:
            return TritonAttention.name, f"ROCm and {why}: rocm-vit's Triton varlen kernel"
        return SdpaAttention.name, f"ROCm, {why} and triton is missing"
    if platform == "cuda":
        fa4_missing = Fa4Attention.unavailable_reason(platform)
        long_rule = (
            f"fa4 when the longest segment has >= {CUDA_FA4_MIN_LONGEST_TOKENS} tokens, else "
            if fa4_missing is None
            else f"(fa4 unused: {fa4_missing}) "
        )
        return CudaAutoAttention.name, (
            f"CUDA: per layout, {long_rule}SDPA when every segment has >= {CUDA_SDPA_MIN_SEGMENT_TOKENS} tokens "
            f"and they are equal or <= {CUDA_SDPA_MAX_SEGMENTS}, else {cuda_varlen_name()}"
        )
    return SdpaAttention.name, f"{platform}: per-sequence scaled_dot_product_attention"


def resolve_backend_name(name: str | None = None) -> tuple[str, str]:
    """Apply the explicit ``name``, else ``ROCM_VIT_ATTENTION_BACKEND``, else the platform default."""
    if name:
        return name, "requested by the caller"
    settings = load_settings()
    if settings.attention_backend:
        return settings.attention_backend, "set by ROCM_VIT_ATTENTION_BACKEND"
    return default_backend_name(current_platform(), settings)


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


def _module_available(name: str) -> bool:
    """Whether ``name`` can be imported, found without importing it (aiter's import is heavy)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        # A parent package that fails to import, or a module put in sys.modules without a spec.
        return sys.modules.get(name) is not None


def _host_seq_lens(backend: str, cu_seqlens: torch.Tensor, seq_lens: Sequence[int] | None) -> tuple[int, ...]:
    if seq_lens is not None:
        return tuple(operator.index(length) for length in seq_lens)
    if cu_seqlens.device.type != "cpu":
        _warn_device_read(backend)
    offsets = cu_seqlens.tolist()
    return tuple(end - start for start, end in itertools.pairwise(offsets))


def _host_max_seqlen(
    backend: str, cu_seqlens: torch.Tensor, max_seqlen: int | None, seq_lens: Sequence[int] | None
) -> int:
    if isinstance(max_seqlen, torch.Tensor):
        raise TypeError(f"{backend}: max_seqlen must be a host int, not a tensor (reading it would sync)")
    if max_seqlen is not None:
        return operator.index(max_seqlen)
    return max(_host_seq_lens(backend, cu_seqlens, seq_lens), default=0)


@functools.cache
def _warn_device_read(backend: str) -> None:
    logger.warning(
        "%s: cu_seqlens is on the device and no max_seqlen/seq_lens was given; reading it back "
        "syncs the host with the GPU on every call. Pass the host-side lengths.",
        backend,
    )
