"""SGLang's ``ViTCudaGraphRunner``, rebuilt on ``rocm_vit.graphs.ViTGraphRunner``.

SGLang 0.5.23's runner knows only the triton_attn / fa3 / fa4 argument lists, gives every graph a
private pool and keeps every graph forever, captures in global error mode (other threads may not
touch the GPU meanwhile), returns its static output buffer (the next replay overwrites what the
caller holds) and rounds fp32 cos/sin to the ViT dtype in graph mode only. The adapter keeps its
constructor and ``run(...)`` signature, so SGLang's models call it unchanged, and hands the block
stack to rocm-vit's runner: one graph per exact layout keyed from host data, one shared pool, at
most ``SGLANG_VIT_CUDA_GRAPH_CACHE_CAPACITY`` graphs (default 32; later layouts run the same blocks
eagerly), thread-local capture inside SGLang's tensor-parallel capture context, owned outputs, and
cos/sin in the dtype the model passed.

Qwen2.5-VL's windowed calls (``cu_window_seqlens``, ``output_indices``, ``position_embeddings``)
and attention backends without a graph-safe argument list still go to SGLang's own runner.
"""

from __future__ import annotations

import functools
import itertools
import logging
import operator
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rocm_vit.attention import AttentionBackend, AttnArgs
from rocm_vit.graphs import GraphMechanism, ViTGraphRunner
from rocm_vit.integrations.sglang.imports import original
from rocm_vit.layout import Segmentation, VisionLayout
from rocm_vit.settings import Settings, load_settings

logger = logging.getLogger(__name__)

_RUNNER_MODULE = "sglang.srt.multimodal.vit_cuda_graph_runner"

# Host layouts kept per tower: building one is cheap, but a server repeats a few sizes endlessly.
_LAYOUT_CACHE_SIZE = 256


@dataclass(frozen=True)
class _GraphArgs:
    """How one SGLang vision attention backend reads ``cu_seqlens`` when graphs are on.

    ``build(cu_seqlens, max_seqlen)`` turns the int32 device offsets and the host maximum into the
    list the backend's forward takes; it runs inside the captured function, so whatever it derives
    on the device belongs to the graph. ``output_workspace``: the backend writes into ``output_ws``.
    """

    build: Callable[[torch.Tensor, int], list]
    output_workspace: bool = False


def _offsets_and_max(cu_seqlens: torch.Tensor, max_seqlen: int) -> list:
    return [cu_seqlens, max_seqlen]


def _offsets_lengths_and_max(cu_seqlens: torch.Tensor, max_seqlen: int) -> list:
    return [cu_seqlens, cu_seqlens[1:] - cu_seqlens[:-1], max_seqlen]


# SGLang 0.5.23, layers/attention/vision.py: what each backend's forward reads in graph mode.
# "aiter_attn" is rocm-vit's AiterVisionAttention. SGLang's "sdpa" is not here: it reads cu_seqlens
# back to the host, which a capture forbids.
SGLANG_GRAPH_ARGS: dict[str, _GraphArgs] = {
    "triton_attn": _GraphArgs(_offsets_lengths_and_max, output_workspace=True),
    "fa3": _GraphArgs(_offsets_and_max),
    "fa4": _GraphArgs(_offsets_and_max),
    "aiter_attn": _GraphArgs(_offsets_and_max),
}


class ViTGraphRunnerAdapter:
    """Drop-in ``ViTCudaGraphRunner(vit)`` whose ``run`` delegates to ``rocm_vit.graphs.ViTGraphRunner``.

    ``vit`` is SGLang's vision tower: ``blocks`` (each with ``attn``, SGLang's ``VisionAttention``),
    ``merger`` and, for Qwen3-VL, ``deepstack_visual_indexes`` and ``deepstack_merger_list``.
    ``mechanism`` replaces CUDA/HIP graphs (tests on a CPU pass a stand-in).
    """

    def __init__(self, vit: nn.Module, *, mechanism: GraphMechanism | None = None) -> None:
        self.vit = vit
        # SGLang's runner: windowed layouts, unsupported backends, and SGLang's TP capture context.
        self._upstream = original(_RUNNER_MODULE, "ViTCudaGraphRunner")(vit)
        self._layouts: OrderedDict[tuple[int, ...], VisionLayout] = OrderedDict()
        deepstack_indexes = getattr(vit, "deepstack_visual_indexes", None) or ()
        self._deepstack_slots = {block: slot for slot, block in enumerate(deepstack_indexes)}
        backend = getattr(vit.blocks[0].attn, "qkv_backend_name", None)
        spec = SGLANG_GRAPH_ARGS.get(backend)
        settings = _settings()
        self._runner: ViTGraphRunner | None = None
        if spec is not None:
            self._runner = ViTGraphRunner(
                functools.partial(self._forward_blocks, spec),
                _SegmentOffsets(),
                capacity=settings.graph_cache_capacity,
                capture_context=self._upstream._capture_context,
                mechanism=mechanism,
            )
        if settings.vit_cuda_graph:
            if spec is None:
                logger.warning(
                    "rocm-vit graph runner: SGLang's %s attention cannot be captured as it reads its "
                    "arguments; SGLang's own runner serves %s",
                    backend,
                    type(vit).__name__,
                )
            else:
                logger.info(
                    "rocm-vit graph runner for %s: attention %s, at most %d graphs",
                    type(vit).__name__,
                    backend,
                    settings.graph_cache_capacity,
                )

    def run(
        self,
        x: torch.Tensor,
        cu_seqlens: torch.Tensor,
        cu_window_seqlens: torch.Tensor | None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None,
        rotary_pos_emb_cos: torch.Tensor | None = None,
        rotary_pos_emb_sin: torch.Tensor | None = None,
        output_indices: torch.Tensor | None = None,
        attention_layout_key: Hashable | None = None,
    ) -> torch.Tensor:
        """SGLang's ``ViTCudaGraphRunner.run``: blocks, merger and deepstack mergers over ``x`` ``[N, hidden]``.

        ``attention_layout_key`` (SGLang passes ``(tuple(cu_seqlens), None)``) supplies the
        segment offsets from the host; without it a CPU ``cu_seqlens`` does, and a device one is
        read back once per call, as SGLang's runner does. Returns a tensor the caller owns.
        """
        windowed = cu_window_seqlens is not None or output_indices is not None or position_embeddings is not None
        if self._runner is None or windowed or rotary_pos_emb_cos is None or rotary_pos_emb_sin is None:
            return self._upstream.run(
                x,
                cu_seqlens,
                cu_window_seqlens,
                position_embeddings,
                rotary_pos_emb_cos,
                rotary_pos_emb_sin,
                output_indices,
                attention_layout_key,
            )
        layout = self._layout(_host_offsets(cu_seqlens, attention_layout_key))
        return self._runner.run(x, layout, rotary_pos_emb_cos, rotary_pos_emb_sin)

    def stats(self) -> dict[str, Any]:
        """The rocm-vit runner's counters (captures, replays, eager runs by reason, memory)."""
        return {} if self._runner is None else self._runner.stats()

    def _forward_blocks(
        self, spec: _GraphArgs, x: torch.Tensor, attn_args: AttnArgs, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        """What eager runs and graphs capture: SGLang's blocks, merger and deepstack mergers."""
        vit = self.vit
        cu_seqlens = spec.build(*attn_args["full"])
        output_ws = None
        if spec.output_workspace:
            attn = vit.blocks[0].attn
            shape = (x.shape[0], attn.num_attention_heads_per_partition, attn.head_size)
            output_ws = torch.empty(shape, dtype=x.dtype, device=x.device)
        hidden = x.unsqueeze(1)  # SGLang's blocks take [S, B=1, hidden]
        deepstack = []
        for index, block in enumerate(vit.blocks):
            hidden = block(
                hidden, cu_seqlens=cu_seqlens, rotary_pos_emb_cos=cos, rotary_pos_emb_sin=sin, output_ws=output_ws
            )
            slot = self._deepstack_slots.get(index)
            if slot is not None:
                deepstack.append(vit.deepstack_merger_list[slot](hidden))
        merged = vit.merger(hidden)
        return torch.cat([merged, *deepstack], dim=1) if deepstack else merged

    def _layout(self, offsets: tuple[int, ...]) -> VisionLayout:
        layout = self._layouts.get(offsets)
        if layout is None:
            # SGLang hands the runner segment offsets, not grid_thw: the layout carries the one
            # segmentation, which is all the runner reads (graph key, cu_seqlens, max_seqlen).
            seq_lens = tuple(end - start for start, end in itertools.pairwise(offsets))
            layout = VisionLayout((), self.vit.spatial_merge_size, seq_lens, offsets, max(seq_lens))
            self._layouts[offsets] = layout
            if len(self._layouts) > _LAYOUT_CACHE_SIZE:
                self._layouts.popitem(last=False)
        return layout


class _SegmentOffsets(AttentionBackend):
    """The list the runner builds per segmentation for an SGLang tower: ``[cu_seqlens, max_seqlen]``.

    The kernel is SGLang's (each block's ``VisionAttention``); ``_forward_blocks`` turns this list
    into the one that backend reads. The runner never attends itself, so only ``runner_args`` runs.
    """

    name = "sglang"

    def runner_args(self, segmentation: Segmentation | VisionLayout, cu_seqlens: torch.Tensor) -> list:
        return [cu_seqlens, segmentation.max_seqlen]

    def attn_args_from_tensor(
        self, cu_seqlens: torch.Tensor, max_seqlen: int | None = None, seq_lens: Sequence[int] | None = None
    ) -> list:
        raise NotImplementedError("SGLang towers attend in SGLang's VisionAttention")

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_args: list, scale: float
    ) -> torch.Tensor:
        raise NotImplementedError("SGLang towers attend in SGLang's VisionAttention")


def _host_offsets(cu_seqlens: torch.Tensor, attention_layout_key: Hashable | None) -> tuple[int, ...]:
    """Segment offsets as host ints, from SGLang's layout key when it carries them."""
    if isinstance(attention_layout_key, tuple) and attention_layout_key and isinstance(attention_layout_key[0], tuple):
        return tuple(operator.index(offset) for offset in attention_layout_key[0])
    if cu_seqlens.device.type != "cpu":
        _warn_device_read()
    return tuple(cu_seqlens.tolist())


@functools.cache
def _warn_device_read() -> None:
    logger.warning(
        "rocm-vit graph runner: no attention_layout_key from the model; reading cu_seqlens back from "
        "the device on every call (a host sync)"
    )


def _settings() -> Settings:
    try:
        return load_settings()
    except ValueError as error:
        # Serving must not fail over a mistyped variable; the doctor reports it.
        logger.error("rocm-vit graph runner: %s; using the default settings", error)
        return Settings()
