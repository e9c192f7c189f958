"""SGLang's Qwen3-VL blocks with rocm-vit's glue between SGLang's own linear modules.

``FusedBlocks(vit)`` runs the blocks, deepstack taps and merger of a tower of SGLang's
``Qwen3_VisionBlock`` (Qwen3-VL, Qwen3.5) as rocm-vit's own tower runs its blocks: each residual add
fused with the norm after it (``norm2``, then the next block's ``norm1``, the merger's norm after the
last block), q/k/v as views of ``qkv_proj``'s output where the attention reads strides, and the
rotary's cos/sin widened once per call instead of in every block. SGLang's ``qkv_proj``, ``proj``,
``linear_fc1``/``linear_fc2`` and the mergers' linears are called as SGLang's blocks call them, so
tensor parallelism (their all-reduces), quantization and weight loading stay SGLang's.
``unrecognised_reason(vit)`` says why a tower does not fit; SGLang's block loop then runs it.
The input is never written. Numerics: docs/numerics.md, "SGLang's blocks under the plugin".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from rocm_vit.fusion import add_norm, norm_kind
from rocm_vit.rotary import apply_rotary

# SGLang 0.5.23's VisionAttention options the fused attention does not reproduce: a tower using any
# of them runs SGLang's blocks.
_ATTENTION_OPTIONS_NOT_FUSED = ("qk_normalization", "qk_normalization_by_head_size")
_ATTENTION_MODULES_NOT_FUSED = ("customized_position_embedding_applier", "sinks")
_QWEN3_VL = "sglang.srt.models.qwen3_vl"


def unrecognised_reason(vit: nn.Module) -> str | None:
    """Why ``FusedBlocks`` cannot run ``vit`` (SGLang's vision tower), or ``None``."""
    others = [block for block in vit.blocks if not _is_sglangs(block, _QWEN3_VL, "Qwen3_VisionBlock")]
    kinds = sorted({type(block).__name__ for block in others})
    if kinds:
        return f"blocks of {', '.join(kinds)}: rocm-vit fuses SGLang's Qwen3_VisionBlock only"
    for index, block in enumerate(vit.blocks):
        problem = _block_problem(block)
        if problem is not None:
            return f"block {index}: {problem}"
    mergers = [("merger", vit.merger, False)]
    mergers += [(f"deepstack merger {i}", m, True) for i, m in enumerate(vit.deepstack_merger_list)]
    for name, merger, postshuffle in mergers:
        if not _is_sglangs(merger, _QWEN3_VL, "Qwen3VLMoeVisionPatchMerger"):
            return f"the {name} is a {type(merger).__name__}, not SGLang's Qwen3VLMoeVisionPatchMerger"
        if merger.use_postshuffle_norm != postshuffle:
            return f"the {name} has use_postshuffle_norm={merger.use_postshuffle_norm}"
        if norm_kind(merger.norm) != "layer_norm":
            return f"the {name}'s norm is a {type(merger.norm).__name__}, not an affine nn.LayerNorm"
    return None


class FusedBlocks:
    """The fused block loop over ``vit`` (``unrecognised_reason(vit)`` must be ``None``)."""

    def __init__(self, vit: nn.Module) -> None:
        self.vit = vit
        self._blocks = list(vit.blocks)
        # The norm each block's last residual add is fused with.
        self._next_norms = [block.norm1 for block in self._blocks[1:]] + [vit.merger.norm]
        indexes = getattr(vit, "deepstack_visual_indexes", None) or ()
        self._deepstack = dict(zip((int(i) for i in indexes), vit.deepstack_merger_list, strict=True))
        # SGLang's own backends copy q/k/v unless they read strides; rocm-vit's read them.
        self._strided_qkv = [
            block.attn.pass_strided_qkv or type(block.attn.qkv_backend).__module__.startswith("rocm_vit.")
            for block in self._blocks
        ]

    def run(
        self, x: torch.Tensor, block_args: Sequence[Mapping[str, Any]], cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        """Blocks, merger and deepstack mergers over ``x`` ``[N, hidden]``: ``[N / merge², out * (1 + taps)]``.

        ``block_args[i]``: block ``i``'s attention arguments as SGLang's block takes them
        (``cu_seqlens`` and ``forward_metadata``, or a graph runner's list and ``output_ws``).
        """
        head_size = self._blocks[0].attn.head_size
        if cos.shape[-1] * 2 == head_size:  # SGLang widens them in every block (VisionAttention.forward)
            cos, sin = torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)
        residual, normed = add_norm(x, None, self._blocks[0].norm1)
        deepstack = []
        for index, (block, args) in enumerate(zip(self._blocks, block_args, strict=True)):
            attended = _attention(block.attn, normed, args, cos, sin, self._strided_qkv[index])
            residual, normed = add_norm(residual, attended, block.norm2)
            residual, normed = add_norm(residual, _mlp(block.mlp, normed), self._next_norms[index])
            merger = self._deepstack.get(index)
            if merger is not None:  # post-shuffle norm: over merge² tokens at once
                _, merged_normed = add_norm(residual.view(-1, merger.hidden_size), None, merger.norm)
                deepstack.append(_project(merger, merged_normed))
        merged = _project(self.vit.merger, normed.view(-1, self.vit.merger.hidden_size))
        return torch.cat([merged, *deepstack], dim=1) if deepstack else merged


def _attention(
    attn: nn.Module,
    normed: torch.Tensor,
    args: Mapping[str, Any],
    cos: torch.Tensor,
    sin: torch.Tensor,
    strided_qkv: bool,
) -> torch.Tensor:
    """``VisionAttention.forward`` for one item of ``tokens`` rows, its projections SGLang's own."""
    tokens = normed.shape[0]
    qkv, _ = attn.qkv_proj(normed)
    q, k, v = qkv.split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
    q = q.view(tokens, attn.num_attention_heads_per_partition, attn.head_size)
    k = k.view(tokens, attn.num_attention_kv_heads_per_partition, attn.head_size)
    v = v.view(tokens, attn.num_attention_kv_heads_per_partition, attn.head_size)
    if not strided_qkv:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    apply_rotary(q, k, cos, sin)
    out = attn.qkv_backend.forward(
        q=q,
        k=k,
        v=v,
        bsz=1,
        seq_len=tokens,
        cu_seqlens=args["cu_seqlens"],
        attention_mask=None,
        forward_metadata=args.get("forward_metadata"),
        sequence_lengths=None,
        max_seqlen=None,
        output_ws=args.get("output_ws"),
        softmax_scale=attn.softmax_scale,
        window_size=(-1, -1),
        s_aux=None,
    )
    projected, _ = attn.proj(out.reshape(tokens, -1))
    return projected


def _mlp(mlp: nn.Module, normed: torch.Tensor) -> torch.Tensor:
    hidden, _ = mlp.linear_fc1(normed)
    out, _ = mlp.linear_fc2(mlp.act(hidden))
    return out


def _project(merger: nn.Module, normed: torch.Tensor) -> torch.Tensor:
    """``Qwen3VLMoeVisionPatchMerger.forward`` after its norm, for rows of merge² tokens."""
    if merger.disable_merger_proj:
        return normed
    hidden, _ = merger.linear_fc1(normed)
    out, _ = merger.linear_fc2(merger.act_fn(hidden))
    return out


def _block_problem(block: nn.Module) -> str | None:
    for name in ("norm1", "norm2"):
        norm = getattr(block, name)
        if norm_kind(norm) != "layer_norm":
            return f"{name} is a {type(norm).__name__}, not an affine nn.LayerNorm"
    attn = block.attn
    if not _is_sglangs(attn, "sglang.srt.layers.attention.vision", "VisionAttention"):
        return f"attn is a {type(attn).__name__}, not SGLang's VisionAttention"
    if not attn.use_qkv_parallel:
        return "its VisionAttention has no QKVParallelLinear (use_qkv_parallel=False)"
    used = [name for name in _ATTENTION_OPTIONS_NOT_FUSED if getattr(attn, name)]
    used += [name for name in _ATTENTION_MODULES_NOT_FUSED if getattr(attn, name) is not None]
    if used:
        return f"its VisionAttention uses {', '.join(used)}"
    if not all(hasattr(block.mlp, name) for name in ("linear_fc1", "linear_fc2", "act")):
        return f"mlp is a {type(block.mlp).__name__} without linear_fc1, linear_fc2 and act"
    return None


def _is_sglangs(module: nn.Module, module_name: str, class_name: str) -> bool:
    """Whether ``module`` is exactly SGLang's class (a subclass may change its forward)."""
    kind = type(module)
    return kind.__module__ == module_name and kind.__qualname__ == class_name
