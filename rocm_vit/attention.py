"""Attention backends: one class per kernel, each building the per-layer arguments it takes.

The tower and the graph runner never test a backend's name: they ask it for its arguments once per
segmentation (``layout_args``), so eager and captured runs launch the same kernels. Arguments hold
tensors and host ints only, never a value read back from the device (that would sync every call).
Which backend runs is the policy's; one that cannot run here fails in ``get_backend``, at tower
construction, not at the first request.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import operator
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from rocm_vit.backend_requirements import backend_unavailable_reason
from rocm_vit.backends.sdpa import sdpa_varlen
from rocm_vit.layout import AttentionLayout, Segmentation, VisionLayout
from rocm_vit.platform import PlatformName, platform_info
from rocm_vit.policy import active_policy, current_facts

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SegmentLengths:
    """Host segment lengths: what ``sdpa`` takes per layer."""

    seq_lens: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class VarlenArgs:
    """Int32 device offsets and the longest segment as a host int (``None`` only for ``triton_attn``
    and ``gluon_attn``, which then bound their grid by the token count). ``seq_lens`` is for a caller
    that chooses by lengths (SGLang's ``aiter_attn`` slot under ``auto``); no kernel reads it."""

    cu_seqlens: torch.Tensor
    max_seqlen: int | None
    seq_lens: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class PickedArgs:
    """``auto``'s pick for a segmentation and that backend's arguments."""

    backend: AttentionBackend
    args: LayerArgs


# One layer's attention arguments, whichever the backend.
LayerArgs = SegmentLengths | VarlenArgs | PickedArgs
# What a tower's ``forward_blocks`` takes: one layer's arguments per segmentation of the layout,
# keyed by its name (``"full"``; ``"window"`` too for a windowed layout).
AttnArgs = Mapping[str, LayerArgs]


class AttentionBackend(ABC):
    """Varlen non-causal attention over packed ``q`` ``[N, H, D]``, ``k``/``v`` ``[N, KH, D]``."""

    name: ClassVar[str]

    @classmethod
    def unavailable_reason(cls, platform: PlatformName | None = None) -> str | None:
        """Why this backend cannot run on ``platform`` (default: this one), or ``None`` when it can."""
        facts = current_facts()
        if platform is not None:
            facts = dataclasses.replace(facts, platform=platform)
        return backend_unavailable_reason(cls.name, facts)

    @abstractmethod
    def runner_args(self, segmentation: Segmentation | VisionLayout, cu_seqlens: torch.Tensor) -> LayerArgs:
        """The per-layer arguments for ``segmentation`` (a ``VisionLayout``: its full one).

        They must reference ``cu_seqlens``, not copy it: the graph runner passes its static buffer.
        """

    @property
    def reads_offsets_on_device(self) -> bool:
        """Whether ``per_call_args`` works: the kernel needs nothing of a layout but its device offsets."""
        return False

    def per_call_args(self, cu_seqlens: torch.Tensor, max_seqlen: int) -> LayerArgs:
        """Arguments that hold nothing of the layout but the device offsets and a bound on the longest
        segment, so one graph serves every layout of that shape (a ``PaddedLayout``)."""
        raise ValueError(f"{self.name} needs host segment lengths: it cannot take offsets per call")

    def layout_args(self, layout: VisionLayout | AttentionLayout, cu_seqlens: Mapping[str, torch.Tensor]) -> AttnArgs:
        """``runner_args`` of every segmentation of ``layout`` by name (``per_call_args`` where its
        offsets are a per-call input); ``cu_seqlens`` holds each one's int32 device offsets."""
        if layout.offsets_per_call:
            return {
                name: self.per_call_args(cu_seqlens[name], segmentation.max_seqlen)
                for name, segmentation in layout.segmentations.items()
            }
        return {
            name: self.runner_args(segmentation, cu_seqlens[name])
            for name, segmentation in layout.segmentations.items()
        }

    @abstractmethod
    def layer_args_from_tensor(
        self,
        cu_seqlens: torch.Tensor,
        max_seqlen: int | None = None,
        seq_lens: Sequence[int] | None = None,
    ) -> LayerArgs:
        """The per-layer arguments for a caller holding only ``cu_seqlens``. Pass the host data you
        have: without it a backend that needs lengths reads a device ``cu_seqlens`` back (a host
        sync, logged once)."""

    @abstractmethod
    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_args: LayerArgs, scale: float
    ) -> torch.Tensor:
        """Attention output ``[N, H, D]`` in ``v.dtype``; ``layer_args`` is what this backend built."""

    def prepare(self, head_dim: int, heads: int, kv_heads: int, dtype: torch.dtype, device: torch.device) -> None:
        """Compile now what this shape's first call would compile inside a request."""
        return


class SdpaAttention(AttentionBackend):
    """Per-sequence ``scaled_dot_product_attention`` with host lengths: runs anywhere. SDPA picks its
    kernel from shapes and dtypes only, so eager and captured runs use the same one."""

    name = "sdpa"

    def runner_args(self, segmentation: Segmentation | VisionLayout, cu_seqlens: torch.Tensor) -> SegmentLengths:
        return SegmentLengths(segmentation.seq_lens)

    def layer_args_from_tensor(
        self,
        cu_seqlens: torch.Tensor,
        max_seqlen: int | None = None,
        seq_lens: Sequence[int] | None = None,
    ) -> SegmentLengths:
        return SegmentLengths(_host_seq_lens(self.name, cu_seqlens, seq_lens))

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_args: SegmentLengths, scale: float
    ) -> torch.Tensor:
        return sdpa_varlen(q, k, v, layer_args.seq_lens, scale)


class _VarlenAttention(AttentionBackend):
    """A kernel taking ``VarlenArgs``; subclasses set ``_attend(q, k, v, cu_seqlens, max_seqlen, scale)``."""

    _attend: Callable[..., torch.Tensor]

    def runner_args(self, segmentation: Segmentation | VisionLayout, cu_seqlens: torch.Tensor) -> VarlenArgs:
        return VarlenArgs(cu_seqlens, segmentation.max_seqlen)

    @property
    def reads_offsets_on_device(self) -> bool:
        return True

    def per_call_args(self, cu_seqlens: torch.Tensor, max_seqlen: int) -> VarlenArgs:
        return VarlenArgs(cu_seqlens, max_seqlen)

    def layer_args_from_tensor(
        self,
        cu_seqlens: torch.Tensor,
        max_seqlen: int | None = None,
        seq_lens: Sequence[int] | None = None,
    ) -> VarlenArgs:
        return VarlenArgs(cu_seqlens, host_max_seqlen(self.name, cu_seqlens, max_seqlen, seq_lens))

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_args: VarlenArgs, scale: float
    ) -> torch.Tensor:
        return self._attend(q, k, v, layer_args.cu_seqlens, layer_args.max_seqlen, scale)

    def prepare(self, head_dim: int, heads: int, kv_heads: int, dtype: torch.dtype, device: torch.device) -> None:
        """One call per kernel variant this shape can launch, on q, k, v views of one fused tensor as
        callers pass them: Triton compiles at first launch, 3-5 s inside a request on the H200."""
        device = torch.device(device)
        if device.type == "cuda":
            layouts = self._variant_layouts(heads, head_dim, dtype, device)
            self._compile_variants(layouts, head_dim, heads, kv_heads, dtype, device)

    def _compile_variants(
        self,
        layouts: list[tuple[int, int]],
        head_dim: int,
        heads: int,
        kv_heads: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        for segments, tokens in layouts:
            qkv = torch.randn(segments * tokens, heads + 2 * kv_heads, head_dim, device=device, dtype=dtype)
            q, k, v = qkv.split((heads, kv_heads, kv_heads), dim=1)
            offsets = torch.arange(0, segments * tokens + 1, tokens, dtype=torch.int32, device=device)
            self._attend(q, k, v, offsets, tokens, head_dim**-0.5)

    def _variant_layouts(
        self, heads: int, head_dim: int, dtype: torch.dtype, device: torch.device
    ) -> list[tuple[int, int]]:
        """``(segments, tokens each)`` calls launching every variant; none where the first call compiles all."""
        return []


class AiterAttention(_VarlenAttention):
    """aiter's ``flash_attn_varlen_func`` (ROCm): ``aiter`` is imported at the first call."""

    name = "aiter_attn"
    _pad_head_dim_to: int | None = None

    def __init__(self) -> None:
        from rocm_vit.backends.aiter_attn import aiter_varlen_attention

        self._attend = functools.partial(aiter_varlen_attention, pad_head_dim_to=self._pad_head_dim_to)

    def prepare(self, head_dim: int, heads: int, kv_heads: int, dtype: torch.dtype, device: torch.device) -> None:
        """Load aiter's module for this shape, or build it now if this install lacks it (fp16, say)."""
        from rocm_vit.backends.aiter_attn import prepare_aiter

        seconds = prepare_aiter(head_dim, heads, kv_heads, dtype, torch.device(device), self._pad_head_dim_to)
        logger.info(
            "%s: aiter's kernel for head dim %d, %s is ready (%.1f s to load or build)",
            self.name,
            head_dim,
            str(dtype).removeprefix("torch."),
            seconds,
        )


class AiterPaddedAttention(AiterAttention):
    """aiter with the head dim zero-padded to 128, where aiter has assembly kernels (72 and 80 have CK).
    Zero columns leave the scores unchanged; whether the faster kernel pays for the pads is for
    ``rocm-vit tune`` to measure."""

    name = "aiter_attn_pad128"
    _pad_head_dim_to = 128


class TritonAttention(_VarlenAttention):
    """rocm-vit's Triton varlen kernel (CUDA and ROCm; on a CPU only under ``TRITON_INTERPRET=1``).
    It reads segment bounds on the device; ``max_seqlen`` only sizes its grid."""

    name = "triton_attn"

    def __init__(self) -> None:
        from rocm_vit.backends.triton_attn import triton_varlen_attention

        # The platform's arch picks the tiles: under ROCm emulation an NVIDIA GPU runs the HIP ones.
        self._arch = platform_info().arch or None
        self._attend = functools.partial(triton_varlen_attention, arch=self._arch)

    def _variant_layouts(
        self, heads: int, head_dim: int, dtype: torch.dtype, device: torch.device
    ) -> list[tuple[int, int]]:
        from rocm_vit.backends.triton_attn import variant_layouts

        return variant_layouts(heads, head_dim, dtype, device, arch=self._arch)

    def layer_args_from_tensor(
        self,
        cu_seqlens: torch.Tensor,
        max_seqlen: int | None = None,
        seq_lens: Sequence[int] | None = None,
    ) -> VarlenArgs:
        # Without host data the grid is bounded by the token count: empty programs, never a device read.
        if max_seqlen is None and seq_lens is None and cu_seqlens.device.type != "cpu":
            return VarlenArgs(cu_seqlens, None)
        return super().layer_args_from_tensor(cu_seqlens, max_seqlen, seq_lens)


class GluonAttention(TritonAttention):
    """rocm-vit's Gluon kernel for Hopper (sm_90): FlashAttention-3's warp-specialised schedule, with
    triton_attn's contract; calls outside its scope run triton_attn inside the wrapper."""

    name = "gluon_attn"

    def __init__(self) -> None:
        from rocm_vit.backends.gluon_attn import gluon_varlen_attention

        # Where three consumer warpgroups start to pay: the tuned profile's crossover, else the kernel's.
        self._waves = active_policy().gluon_consumers.value
        self._attend = functools.partial(gluon_varlen_attention, three_consumer_waves=self._waves)

    def _variant_layouts(
        self, heads: int, head_dim: int, dtype: torch.dtype, device: torch.device
    ) -> list[tuple[int, int]]:
        from rocm_vit.backends.gluon_attn import variant_layouts

        return variant_layouts(heads, device, self._waves)


class TorchVarlenAttention(_VarlenAttention):
    """``torch.nn.attention.varlen.varlen_attn`` (torch >= 2.10; FlashAttention-2 on CUDA)."""

    name = "torch_varlen"

    def __init__(self) -> None:
        from rocm_vit.backends.torch_varlen import torch_varlen_attention

        self._attend = torch_varlen_attention


class Fa4Attention(_VarlenAttention):
    """FlashAttention-4's varlen kernel (``flash_attn.cute``; NVIDIA sm_90+): imported at the first call."""

    name = "fa4"

    def __init__(self) -> None:
        from rocm_vit.backends.fa4_attn import fa4_varlen_attention

        self._attend = fa4_varlen_attention


class AutoAttention(AttentionBackend):
    """A kernel per segmentation, by the policy's rule (default or tuned) from host lengths and head dim.
    Picked from the segmentation alone, so a captured graph replays what the eager run computed."""

    name = "auto"

    def __init__(self, head_dim: int | None = None) -> None:
        self._rule = active_policy().attention.rule
        self._head_dim = head_dim
        self._backends = {name: BACKENDS[name]() for name in self._rule.candidates}
        # Without host lengths or a bound (a device cu_seqlens only) the rule's one-launch kernel runs.
        self._without_lengths = self._backends[self._rule.without_lengths]
        self._picks: dict[tuple[int, ...], AttentionBackend] = {}  # host lengths -> backend

    def runner_args(self, segmentation: Segmentation | VisionLayout, cu_seqlens: torch.Tensor) -> PickedArgs:
        backend = self._pick(segmentation.seq_lens)
        return PickedArgs(backend, backend.runner_args(segmentation, cu_seqlens))

    @property
    def reads_offsets_on_device(self) -> bool:
        return self._without_lengths.reads_offsets_on_device

    def per_call_args(self, cu_seqlens: torch.Tensor, max_seqlen: int) -> PickedArgs:
        backend = self._pick_by_bound(max_seqlen)
        return PickedArgs(backend, backend.per_call_args(cu_seqlens, max_seqlen))

    def layer_args_from_tensor(
        self,
        cu_seqlens: torch.Tensor,
        max_seqlen: int | None = None,
        seq_lens: Sequence[int] | None = None,
    ) -> PickedArgs:
        if seq_lens is None and cu_seqlens.device.type == "cpu":
            seq_lens = _host_seq_lens(self.name, cu_seqlens, None)
        if seq_lens is not None:
            backend = self._pick(seq_lens)
        elif max_seqlen is not None:
            backend = self._pick_by_bound(max_seqlen)
        else:
            backend = self._without_lengths
        return PickedArgs(backend, backend.layer_args_from_tensor(cu_seqlens, max_seqlen, seq_lens))

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_args: PickedArgs, scale: float
    ) -> torch.Tensor:
        return layer_args.backend(q, k, v, layer_args.args, scale)

    def prepare(self, head_dim: int, heads: int, kv_heads: int, dtype: torch.dtype, device: torch.device) -> None:
        for backend in self._backends.values():
            backend.prepare(head_dim, heads, kv_heads, dtype, device)

    def _pick_by_bound(self, max_seqlen: int) -> AttentionBackend:
        """For a padded graph (device offsets, a bound only): the rule's pick for one ``max_seqlen``
        segment if it reads offsets on the device (the long-sequence kernel is faster there), else
        the one-launch kernel."""
        backend = self._pick((max_seqlen,))
        return backend if backend.reads_offsets_on_device else self._without_lengths

    def _pick(self, seq_lens: Sequence[int]) -> AttentionBackend:
        # Remembered per layout: eager callers ask for every layer of every call.
        key = tuple(seq_lens)
        backend = self._picks.get(key)
        if backend is None:
            if len(self._picks) >= _PICKS_KEPT:
                self._picks.clear()
            backend = self._picks[key] = self._backends[self._rule.pick(key, self._head_dim)[0]]
        return backend


# Layouts whose pick AutoAttention remembers (a serving mix has far fewer distinct ones).
_PICKS_KEPT = 4096


BACKENDS: dict[str, type[AttentionBackend]] = {
    backend.name: backend
    for backend in (
        SdpaAttention,
        AiterAttention,
        AiterPaddedAttention,
        TritonAttention,
        GluonAttention,
        TorchVarlenAttention,
        Fa4Attention,
        AutoAttention,
    )
}


def resolve_backend_name(name: str | None = None) -> tuple[str, str]:
    """The explicit ``name``, else the policy's (``ROCM_VIT_ATTENTION_BACKEND``, tuned or default), and why."""
    if name:
        return name, "requested by the caller"
    attention = active_policy().attention
    return attention.backend, attention.reason


def get_backend(name: str | None = None, head_dim: int | None = None) -> AttentionBackend:
    """Build the backend (``head_dim``: what ``auto`` tuned for); fails now, naming what is missing."""
    chosen, reason = resolve_backend_name(name)
    platform = active_policy().facts.platform
    backend_cls = BACKENDS.get(chosen)
    if backend_cls is None:
        raise ValueError(f"attention backend {chosen!r} ({reason}) is unknown; known: {sorted(BACKENDS)}")
    missing = backend_cls.unavailable_reason(platform)
    if missing:
        raise RuntimeError(f"attention backend {chosen!r} ({reason}) cannot run on {platform}: {missing}")
    logger.debug("attention backend %s (%s)", chosen, reason)
    return AutoAttention(head_dim) if backend_cls is AutoAttention else backend_cls()


def _host_seq_lens(backend: str, cu_seqlens: torch.Tensor, seq_lens: Sequence[int] | None) -> tuple[int, ...]:
    if seq_lens is not None:
        return tuple(operator.index(length) for length in seq_lens)
    if cu_seqlens.device.type != "cpu":
        _warn_device_read(backend)
    offsets = cu_seqlens.tolist()
    return tuple(end - start for start, end in itertools.pairwise(offsets))


def host_max_seqlen(
    backend: str, cu_seqlens: torch.Tensor, max_seqlen: int | None, seq_lens: Sequence[int] | None
) -> int:
    """``max_seqlen`` as a host int: given, from host ``seq_lens``, else read back once (with a warning)."""
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
