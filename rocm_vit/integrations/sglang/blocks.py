"""The block loop the adapter runs, and the arguments SGLang's attention backends take when graphs are on.

``SGLangBlocks`` runs a tower's blocks, deepstack taps and merger: rocm-vit's fused glue between
SGLang's linear modules (``fused_blocks``) where it recognises the blocks and
``ROCM_VIT_SGLANG_BLOCKS`` allows, else SGLang's own block loop as its eager ``forward`` runs it. The
adapter's eager path (``eager``, from ``run``'s arguments) and what the runner captures
(``forward_blocks``) share one loop. ``GraphArgs`` says, per backend, the list a block's
``cu_seqlens`` takes in graph mode, built from a layout's ``segment_args``.
"""

from __future__ import annotations

import functools
import itertools
import logging
import operator
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rocm_vit.attention import VarlenArgs
from rocm_vit.integrations.sglang.contract import parameters
from rocm_vit.integrations.sglang.fused_blocks import FusedBlocks, unrecognised_reason
from rocm_vit.integrations.sglang.prepare import embed_patches
from rocm_vit.integrations.sglang.ranks import ForwardFailedUnderTP, stream_capturing
from rocm_vit.layout import AttentionLayout
from rocm_vit.recent import remember

logger = logging.getLogger(__name__)

# Host layouts kept per tower: building one is cheap, but a server repeats a few sizes endlessly.
_LAYOUT_CACHE_SIZE = 256


@dataclass(frozen=True)
class GraphArgs:
    """How one SGLang vision attention backend reads ``cu_seqlens`` when graphs are on.

    ``build(args)`` turns a segmentation's ``VarlenArgs`` (int32 device offsets, host maximum, host
    segment lengths: ``segment_args``) into the list the backend's forward takes: the one place
    SGLang's list shapes are made. It runs inside the captured function, so whatever it derives on
    the device belongs to the graph. ``output_workspace``: the backend writes into ``output_ws``.
    """

    build: Callable[[VarlenArgs], list]
    output_workspace: bool = False


def _offsets_and_max(args: VarlenArgs) -> list:
    return [args.cu_seqlens, args.max_seqlen]


def _offsets_max_and_host_lengths(args: VarlenArgs) -> list:
    # rocm-vit's AiterVisionAttention: under a tuned profile it picks a kernel per layout by these.
    return [args.cu_seqlens, args.max_seqlen, args.seq_lens]


def _offsets_lengths_and_max(args: VarlenArgs) -> list:
    cu_seqlens = args.cu_seqlens
    return [cu_seqlens, cu_seqlens[1:] - cu_seqlens[:-1], args.max_seqlen]


# SGLang 0.5.23, layers/attention/vision.py: what each backend's forward reads in graph mode.
# "aiter_attn" is rocm-vit's AiterVisionAttention. SGLang's "sdpa" is not here: it reads cu_seqlens
# back to the host, which a capture forbids.
SGLANG_GRAPH_ARGS: dict[str, GraphArgs] = {
    "triton_attn": GraphArgs(_offsets_lengths_and_max, output_workspace=True),
    "fa3": GraphArgs(_offsets_and_max),
    "fa4": GraphArgs(_offsets_and_max),
    "aiter_attn": GraphArgs(_offsets_max_and_host_lengths),
}


class SGLangBlocks:
    """The block loop over ``vit`` (checked by ``contract.eager_unsupported_reason``): its
    full-attention blocks (Qwen2.5-VL), deepstack taps (Qwen3-VL) and rotary form, read once.

    ``sglang_blocks``: ``"rocm-vit"`` runs ``FusedBlocks`` where ``unrecognised_reason`` finds nothing
    against it (else SGLang's loop, logged once with the reason); ``"sglang"`` SGLang's loop.
    ``blocks`` says which runs and why.
    """

    def __init__(self, vit: nn.Module, sglang_blocks: str = "rocm-vit") -> None:
        self.vit = vit
        self._fused: FusedBlocks | None = None
        if sglang_blocks == "sglang":
            self.blocks = "sglang: ROCM_VIT_SGLANG_BLOCKS=sglang"
        else:
            try:
                problem = unrecognised_reason(vit)
            except Exception as error:  # a changed SGLang release: its own blocks serve
                problem = f"reading its blocks failed ({type(error).__name__}: {error})"
            if problem is None:
                self._fused = FusedBlocks(vit)
                self.blocks = "rocm-vit: fused glue between SGLang's linear modules"
            else:
                self.blocks = f"sglang: {problem}"
                logger.warning("rocm-vit: SGLang's own blocks run %s: %s", type(vit).__name__, problem)
        self._full_attention_blocks = frozenset(int(i) for i in getattr(vit, "fullatt_block_indexes", None) or ())
        self._deepstack_slots = {
            block: slot for slot, block in enumerate(getattr(vit, "deepstack_visual_indexes", None) or ())
        }
        self._takes_position_embeddings = "position_embeddings" in parameters(vit.blocks[0].forward)
        self._layouts: OrderedDict[tuple, AttentionLayout] = OrderedDict()

    def layout(self, offsets: tuple[int, ...], window_offsets: tuple[int, ...] | None) -> AttentionLayout:
        """The layout of SGLang's host segment offsets (Qwen2.5-VL's window offsets too), built once
        for the last ``_LAYOUT_CACHE_SIZE`` seen."""
        # SGLang hands the runner segment offsets, not grid_thw: the layout carries them as given
        # (Qwen2.5-VL's leading empty segment included, so the kernels see what eager passes them).
        # The window permutation stays SGLang's (output_indices), outside the graph key.
        layout = self._layouts.get((offsets, window_offsets))
        if layout is None:
            if window_offsets is not None and window_offsets[-1] != offsets[-1]:
                raise ValueError(f"cu_window_seqlens ends at {window_offsets[-1]} but cu_seqlens at {offsets[-1]}")
            layout = AttentionLayout.from_offsets(offsets, window_offsets)
            remember(self._layouts, (offsets, window_offsets), layout, _LAYOUT_CACHE_SIZE)
        return layout

    def eager(
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
        """The tower's blocks as SGLang's eager ``forward`` runs them (graphs off), from ``run``'s arguments.

        Each block gets the offsets tensor and SGLang's precomputed metadata of the segmentation it
        attends within; the longest segment comes from the host layout key where SGLang passed one.
        """
        key = attention_layout_key if isinstance(attention_layout_key, tuple) else ()
        segmentations = {"full": (cu_seqlens, key[0] if len(key) > 0 else None)}
        if cu_window_seqlens is not None:
            segmentations["window"] = (cu_window_seqlens, key[1] if len(key) > 1 else None)
        from sglang.srt.layers.attention.vision import prepare_vision_attention_metadata

        block_args = {}
        for name, (offsets, host) in segmentations.items():
            metadata = prepare_vision_attention_metadata(offsets, offsets.device, max_seqlen=longest(host))
            block_args[name] = {"cu_seqlens": offsets, "forward_metadata": metadata}
        rotary = self.rotary_kwargs(position_embeddings, rotary_pos_emb_cos, rotary_pos_emb_sin)
        merged = self.run_blocks(x, block_args, rotary)
        return merged if output_indices is None else merged.index_select(0, output_indices)

    def run_blocks(
        self, x: torch.Tensor, block_args: Mapping[str, Mapping[str, Any]], rotary: Mapping[str, Any]
    ) -> torch.Tensor:
        """SGLang's block loop, its deepstack taps, the merger and the concatenation: what the eager
        path (``eager``) and the graph path (``forward_blocks``) share. ``block_args``: per
        segmentation (``"full"``, Qwen2.5-VL's ``"window"``), the keyword arguments a block attending
        within it takes; ``rotary``: the rotary keyword arguments every block takes."""
        vit = self.vit
        per_block = [block_args[self._segmentation(index, block_args)] for index in range(len(vit.blocks))]
        if self._fused is not None:
            cos, sin = rotary.get("position_embeddings") or (rotary["rotary_pos_emb_cos"], rotary["rotary_pos_emb_sin"])
            return self._fused.run(x, per_block, cos, sin)
        hidden = x.unsqueeze(1)  # SGLang's blocks take [S, B=1, hidden]
        deepstack = []
        for index, block in enumerate(vit.blocks):
            hidden = block(hidden, **per_block[index], **rotary)
            slot = self._deepstack_slots.get(index)
            if slot is not None:
                deepstack.append(vit.deepstack_merger_list[slot](hidden))
        merged = vit.merger(hidden)
        return torch.cat([merged, *deepstack], dim=1) if deepstack else merged

    def _segmentation(self, index: int, block_args: Mapping[str, Any]) -> str:
        """Qwen2.5-VL: blocks outside ``fullatt_block_indexes`` attend within windows."""
        return "window" if "window" in block_args and index not in self._full_attention_blocks else "full"

    def use_sglang_blocks(self, why: str) -> None:
        """SGLang's own block loop from now on (the adapter's fallback once its runner stopped)."""
        if self._fused is not None:
            self._fused = None
            self.blocks = f"sglang: {why}"

    def rotary_kwargs(
        self,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
    ) -> dict[str, Any]:
        """The rotary as this tower's blocks take it: Qwen2.5-VL's ``position_embeddings=(cos, sin)``,
        Qwen3-VL's ``rotary_pos_emb_cos`` and ``rotary_pos_emb_sin``."""
        if self._takes_position_embeddings:
            return {"position_embeddings": position_embeddings}
        return {"rotary_pos_emb_cos": cos, "rotary_pos_emb_sin": sin}

    def rotary(
        self,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None,
        cos: torch.Tensor | None,
        sin: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The call's ``(cos, sin)`` when it comes in the form this tower's blocks take, else ``None``."""
        if self._takes_position_embeddings:
            return position_embeddings if position_embeddings is not None and cos is None else None
        return (cos, sin) if cos is not None and sin is not None and position_embeddings is None else None

    def forward_blocks(
        self,
        spec: GraphArgs,
        x: torch.Tensor,
        attn_args: Mapping[str, VarlenArgs],
        cos: torch.Tensor,
        sin: torch.Tensor,
        *embed_inputs: torch.Tensor,
        shares_collectives: bool = False,
    ) -> torch.Tensor:
        """What eager runs and graphs capture: SGLang's blocks, merger and deepstack mergers.
        ``shares_collectives``: under tensor parallelism, a raise outside a capture is
        ``ForwardFailedUnderTP`` (some all-reduces may have run).

        ``attn_args`` is ``segment_args``'s; each block gets its segmentation's in SGLang's list shape.
        With ``embed_inputs`` (the adapter's ``run_embedding``) ``x`` is the patches, embedded first
        (``prepare.embed_patches``).
        """
        if embed_inputs:
            x = embed_patches(self.vit, x, *embed_inputs)
        output_ws = None
        if spec.output_workspace:
            attn = self.vit.blocks[0].attn
            shape = (x.shape[0], attn.num_attention_heads_per_partition, attn.head_size)
            output_ws = torch.empty(shape, dtype=x.dtype, device=x.device)
        block_args = {name: {"cu_seqlens": spec.build(one), "output_ws": output_ws} for name, one in attn_args.items()}
        try:
            return self.run_blocks(x, block_args, self.rotary_kwargs((cos, sin), cos, sin))
        except Exception as error:
            if not shares_collectives or stream_capturing():  # a capture launches nothing: the runner handles it
                raise
            raise ForwardFailedUnderTP from error


def segment_args(layout: AttentionLayout, cu_seqlens: Mapping[str, torch.Tensor]) -> dict[str, VarlenArgs]:
    """The runner's ``layout_args`` for an SGLang tower: per segmentation, its offsets tensor, longest
    segment and host lengths. The kernel is SGLang's (each block's ``VisionAttention``), so nothing
    here attends; ``GraphArgs.build`` turns these into the list that backend reads. A padded layout's
    graph serves layouts of other lengths: no host lengths, and its token count as the longest."""
    if layout.offsets_per_call:
        return {
            name: VarlenArgs(cu_seqlens[name], segmentation.max_seqlen)
            for name, segmentation in layout.segmentations.items()
        }
    return {
        name: VarlenArgs(cu_seqlens[name], segmentation.max_seqlen, segmentation.seq_lens)
        for name, segmentation in layout.segmentations.items()
    }


def longest(offsets: tuple[int, ...] | None) -> int | None:
    """The longest segment of host offsets, or ``None`` (SGLang then reads it from the device)."""
    if not isinstance(offsets, tuple) or len(offsets) < 2:
        return None
    return max(end - start for start, end in itertools.pairwise(offsets))


def host_offsets(
    cu_seqlens: torch.Tensor, cu_window_seqlens: torch.Tensor | None, attention_layout_key: Hashable | None
) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """Full and window segment offsets as host ints, from SGLang's layout key when it carries them.

    What the key lacks is read from the tensors: at most one read back from the device per call.
    """
    key = attention_layout_key if isinstance(attention_layout_key, tuple) else ()
    full = key[0] if len(key) > 0 and isinstance(key[0], tuple) else None
    window = key[1] if len(key) > 1 and isinstance(key[1], tuple) else None
    missing = [t for t, known in ((cu_seqlens, full), (cu_window_seqlens, window)) if t is not None and known is None]
    if missing:
        if any(t.device.type != "cpu" for t in missing):
            _warn_device_read()
        values = torch.cat([t.reshape(-1).to(torch.int64) for t in missing]).tolist()  # one sync
        if full is None:
            full, values = tuple(values[: cu_seqlens.numel()]), values[cu_seqlens.numel() :]
        if cu_window_seqlens is not None and window is None:
            window = tuple(values)
    if cu_window_seqlens is None:
        window = None
    return tuple(operator.index(v) for v in full), None if window is None else tuple(operator.index(v) for v in window)


@functools.cache
def _warn_device_read() -> None:
    logger.warning(
        "rocm-vit graph runner: no attention_layout_key from the model; reading cu_seqlens back from "
        "the device on every call (a host sync)"
    )
