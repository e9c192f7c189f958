"""SGLang's Qwen3-VL and Qwen2.5-VL blocks with rocm-vit's glue between SGLang's own linear modules.

``FusedBlocks(vit)`` runs the blocks, deepstack taps and merger of a tower of SGLang's
``Qwen3_VisionBlock`` (Qwen3-VL, Qwen3.5: LayerNorm) or ``Qwen2_5_VisionBlock`` (RMSNorm, windows) as
rocm-vit's own towers run theirs: each residual add fused with the norm after it (``norm2``, then the
next block's ``norm1``, the merger's norm after the last block), q/k/v as views of ``qkv_proj``'s
output where the attention reads strides, the rotary's cos/sin widened once per call instead of in
every block, and where the policy puts the GELU in fc1's epilogue (CUDA) Qwen3-VL's tanh-GELU in
``linear_fc1``'s GEMM wherever that GEMM is all fc1 does on this rank (``gelu_epilogue_problem``).
SGLang's ``qkv_proj``, ``proj``, MLPs and the mergers' linears are otherwise called as SGLang's
blocks call them, so tensor parallelism (their all-reduces), quantization and weight loading stay
SGLang's. ``unrecognised_reason(vit)`` says why a tower does not fit; SGLang's block loop then runs
it. The input is never written. Numerics: docs/numerics.md, "SGLang's blocks under the plugin".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rocm_vit.fusion import add_norm, norm_kind
from rocm_vit.policy import active_policy
from rocm_vit.rotary import apply_rotary

# SGLang 0.5.23's VisionAttention options the fused attention does not reproduce: a tower using any
# of them runs SGLang's blocks.
_ATTENTION_OPTIONS_NOT_FUSED = ("qk_normalization", "qk_normalization_by_head_size")
_ATTENTION_MODULES_NOT_FUSED = ("customized_position_embedding_applier", "sinks")


@dataclass(frozen=True)
class _Family:
    """SGLang's classes of one tower family, by module and name, and how its norms read."""

    module: str
    block: str
    mlp: str
    merger: str
    norm: str  # what fusion.add_norm fuses the blocks' and the merger's norms as
    merger_norm: str  # the merger's attribute holding its norm


_FAMILIES = (
    _Family(
        "sglang.srt.models.qwen3_vl",
        "Qwen3_VisionBlock",
        "Qwen3_VisionMLP",
        "Qwen3VLMoeVisionPatchMerger",
        "layer_norm",
        "norm",
    ),
    _Family(
        "sglang.srt.models.qwen2_5_vl",
        "Qwen2_5_VisionBlock",
        "Qwen2_5_VLMLP",
        "Qwen2_5_VisionPatchMerger",
        "rms_norm",
        "ln_q",
    ),
)


def unrecognised_reason(vit: nn.Module) -> str | None:
    """Why ``FusedBlocks`` cannot run ``vit`` (SGLang's vision tower), or ``None``."""
    family = _family(vit)
    if family is None:
        kinds = sorted({type(block).__name__ for block in vit.blocks})
        known = " or ".join(f.block for f in _FAMILIES)
        return f"blocks of {', '.join(kinds)}: rocm-vit fuses SGLang's {known}, one kind a tower"
    for index, block in enumerate(vit.blocks):
        problem = _block_problem(block, family)
        if problem is not None:
            return f"block {index}: {problem}"
    mergers = [("merger", vit.merger, False)]
    mergers += [(f"deepstack merger {i}", m, True) for i, m in enumerate(getattr(vit, "deepstack_merger_list", ()))]
    for name, merger, postshuffle in mergers:
        if not _is_sglangs(merger, family.module, family.merger):
            return f"the {name} is a {type(merger).__name__}, not SGLang's {family.merger}"
        if getattr(merger, "use_postshuffle_norm", False) != postshuffle:
            return f"the {name} has use_postshuffle_norm={merger.use_postshuffle_norm}"
        problem = _norm_problem(getattr(merger, family.merger_norm), family.norm)
        if problem is not None:
            return f"the {name}'s norm is {problem}"
    return None


class FusedBlocks:
    """The fused block loop over ``vit`` (``unrecognised_reason(vit)`` must be ``None``)."""

    def __init__(self, vit: nn.Module) -> None:
        family = _family(vit)
        self._blocks = list(vit.blocks)
        self._norm1 = [_fusable(block.norm1) for block in self._blocks]
        self._norm2 = [_fusable(block.norm2) for block in self._blocks]
        # The norm each block's last residual add is fused with.
        self._next_norms = [*self._norm1[1:], _fusable(getattr(vit.merger, family.merger_norm))]
        self._project: Callable[[nn.Module, torch.Tensor], torch.Tensor] = (
            _project_qwen3_vl if family.merger_norm == "norm" else _project_qwen2_5_vl
        )
        self._merger = vit.merger
        indexes = getattr(vit, "deepstack_visual_indexes", None) or ()
        self._deepstack = dict(zip((int(i) for i in indexes), getattr(vit, "deepstack_merger_list", ()), strict=True))
        # Per block: whether fc1 may take the GELU in its epilogue, and whether fc1 is split over ranks.
        self._gelu_in_fc1 = [gelu_epilogue_problem(block.mlp) is None for block in self._blocks]
        self._fc1_split = [
            takes and _tp_size(block.mlp.linear_fc1) > 1
            for takes, block in zip(self._gelu_in_fc1, self._blocks, strict=True)
        ]
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
        (``cu_seqlens`` and ``forward_metadata``, or a graph runner's list and ``output_ws``), for the
        segmentation (items or windows) it attends within.
        """
        head_size = self._blocks[0].attn.head_size
        if cos.shape[-1] * 2 == head_size:  # SGLang widens them in every block (VisionAttention.forward)
            cos, sin = torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)
        residual, normed = add_norm(x, None, self._norm1[0])
        # Once a call: the policy, and whether this call gathers fc1's input over ranks (sequence parallelism).
        epilogue = (
            active_policy().gelu_epilogue.value and x.is_cuda and not (any(self._fc1_split) and _sequence_parallel())
        )
        deepstack = []
        for index, (block, args) in enumerate(zip(self._blocks, block_args, strict=True)):
            attended = _attention(block.attn, normed, args, cos, sin, self._strided_qkv[index])
            residual, normed = add_norm(residual, attended, self._norm2[index])
            gelu_in_fc1 = epilogue and self._gelu_in_fc1[index]
            mlp_out = _mlp_gelu_in_fc1(block.mlp, normed) if gelu_in_fc1 else block.mlp(normed)
            residual, normed = add_norm(residual, mlp_out, self._next_norms[index])
            merger = self._deepstack.get(index)
            if merger is not None:  # post-shuffle norm: over merge² tokens at once
                _, merged_normed = add_norm(residual.view(-1, merger.hidden_size), None, merger.norm)
                deepstack.append(_project_qwen3_vl(merger, merged_normed))
        merged = self._project(self._merger, normed.view(-1, self._merger.hidden_size))
        return torch.cat([merged, *deepstack], dim=1) if deepstack else merged


class _RMSNormView:
    """SGLang's ``RMSNorm`` as ``fusion.add_norm`` reads a norm: fused, rocm-vit's kernel (transformers'
    rounding: normalised, rounded, then scaled); plain, SGLang's module on the rounded sum."""

    norm_kind = "rms_norm"

    def __init__(self, norm: nn.Module) -> None:
        self.weight = norm.weight
        self.eps = norm.variance_epsilon
        self._norm = norm

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._norm(x)


def _fusable(norm: nn.Module) -> Any:
    return norm if isinstance(norm, nn.LayerNorm) else _RMSNormView(norm)


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


def gelu_epilogue_problem(mlp: nn.Module) -> str | None:
    """Why ``mlp``'s activation cannot run in its ``linear_fc1``'s GEMM epilogue, or ``None``.

    The epilogue stands in for fc1's ``quant_method.apply`` (``F.linear`` unquantized) and the
    activation, so only where that is all fc1 does: no quantization, its bias in its output, no
    gather of its output over ranks (a sequence-parallel gather of its input is checked per call).
    """
    act = getattr(mlp, "act", None)
    if type(act).__name__ != "GELUTanh":
        return f"its activation is {type(act).__name__}, not transformers' GELUTanh"
    if getattr(getattr(act, "act", None), "keywords", None) != {"approximate": "tanh"}:
        return "its GELUTanh is the Python formula, not torch's tanh-GELU"
    fc1 = getattr(mlp, "linear_fc1", None)
    method = type(getattr(fc1, "quant_method", None)).__name__
    if method != "UnquantizedLinearMethod":
        return f"linear_fc1 runs {method}"
    if fc1.bias is None or fc1.skip_bias_add:
        return "linear_fc1 does not add its bias to its output"
    if fc1.gather_output and _tp_size(fc1) > 1:
        return "linear_fc1 gathers its output over ranks"
    return None


def _mlp_gelu_in_fc1(mlp: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``Qwen3_VisionMLP.forward`` with the tanh-GELU in fc1's cuBLASLt GEMM: one rounding where SGLang's
    pair rounds twice, as rocm-vit's own tower (``gelu_epilogue_problem`` must be ``None``; CUDA only)."""
    fc1 = mlp.linear_fc1
    hidden = torch._addmm_activation(fc1.bias, x, fc1.weight.t(), use_gelu=True)
    out, _ = mlp.linear_fc2(hidden)
    return out


def _tp_size(linear: nn.Module) -> int:
    from sglang.srt.distributed.utils import get_group_rank_size

    return get_group_rank_size(linear.tp_group)[1]


def _sequence_parallel() -> bool:
    from sglang.srt.runtime_context import get_forward

    return bool(get_forward().sp_active)


def _project_qwen3_vl(merger: nn.Module, normed: torch.Tensor) -> torch.Tensor:
    """``Qwen3VLMoeVisionPatchMerger.forward`` after its norm, for rows of merge² tokens."""
    if merger.disable_merger_proj:
        return normed
    hidden, _ = merger.linear_fc1(normed)
    out, _ = merger.linear_fc2(merger.act_fn(hidden))
    return out


def _project_qwen2_5_vl(merger: nn.Module, normed: torch.Tensor) -> torch.Tensor:
    """``Qwen2_5_VisionPatchMerger.forward`` after its ``ln_q``, for rows of merge² tokens."""
    fc1, act, fc2 = merger.mlp
    hidden, _ = fc1(normed)
    out, _ = fc2(act(hidden))
    return out


def _family(vit: nn.Module) -> _Family | None:
    for family in _FAMILIES:
        if all(_is_sglangs(block, family.module, family.block) for block in vit.blocks):
            return family
    return None


def _block_problem(block: nn.Module, family: _Family) -> str | None:
    for name in ("norm1", "norm2"):
        problem = _norm_problem(getattr(block, name), family.norm)
        if problem is not None:
            return f"{name} is {problem}"
    attn = block.attn
    if not _is_sglangs(attn, "sglang.srt.layers.attention.vision", "VisionAttention"):
        return f"attn is a {type(attn).__name__}, not SGLang's VisionAttention"
    if not attn.use_qkv_parallel:
        return "its VisionAttention has no QKVParallelLinear (use_qkv_parallel=False)"
    used = [name for name in _ATTENTION_OPTIONS_NOT_FUSED if getattr(attn, name)]
    used += [name for name in _ATTENTION_MODULES_NOT_FUSED if getattr(attn, name) is not None]
    if used:
        return f"its VisionAttention uses {', '.join(used)}"
    if not _is_sglangs(block.mlp, family.module, family.mlp):
        return f"mlp is a {type(block.mlp).__name__}, not SGLang's {family.mlp}"
    return None


def _norm_problem(norm: nn.Module, kind: str) -> str | None:
    """Why ``norm`` is not a norm of ``kind`` the fused kernel computes as its module does, or ``None``."""
    if kind == "layer_norm":
        return None if norm_kind(norm) == "layer_norm" else f"a {type(norm).__name__}, not an affine nn.LayerNorm"
    if not _is_sglangs(norm, "sglang.srt.layers.layernorm", "RMSNorm"):
        return f"a {type(norm).__name__}, not SGLang's RMSNorm"
    plain = (
        norm.has_weight
        and norm.variance_size_override is None
        and not norm.fp32_residual
        and norm.override_orig_dtype is None
        and not getattr(norm, "x_pad_to_multiple", 0)
    )
    return None if plain else "an RMSNorm with options the fused kernel does not have"


def _is_sglangs(module: nn.Module, module_name: str, class_name: str) -> bool:
    """Whether ``module`` is exactly SGLang's class (a subclass may change its forward)."""
    kind = type(module)
    return kind.__module__ == module_name and kind.__qualname__ == class_name
