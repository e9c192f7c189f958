"""rocm-vit's own Qwen3-VL tower holding an SGLang tower's weights, for ``rocm-vit bench-sglang``.

Beside SGLang's tower under the plugin, what is left of the gap once weights, layouts and the
attention kernel are the same is SGLang's block itself. So the own tower takes SGLang's parameters
(renamed to transformers' names) and the kernel SGLang's configuration runs: SGLang's own Triton
kernel for ``triton_attn``, the plugin's pick for the ``aiter_attn`` slot, ``sdpa`` on a CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from rocm_vit.attention import AttentionBackend, get_backend, host_max_seqlen
from rocm_vit.layout import Segmentation, VisionLayout
from rocm_vit.models.qwen3_vl import Qwen3VLVisionTower
from rocm_vit.policy import active_policy
from rocm_vit.tower_config import Qwen3VLVisionConfig

# SGLang's parameter names that differ from transformers' (SGLang's load_weights maps the other way).
_SGLANG_TO_OWN = ((".attn.qkv_proj.", ".attn.qkv."),)


def own_tower(sglang_tower: nn.Module, config: Qwen3VLVisionConfig, attention: str) -> Qwen3VLVisionTower:
    """rocm-vit's tower at ``config``'s sizes on ``sglang_tower``'s device and dtype, with a copy of
    its weights and the kernel SGLang's ``--mm-attention-backend attention`` runs (``ValueError``
    for a backend without a twin here)."""
    parameter = next(sglang_tower.parameters())
    with torch.device(parameter.device):
        tower = Qwen3VLVisionTower(config, attention_backend="sdpa")
    tower = tower.to(dtype=parameter.dtype).eval()
    tower.load_state_dict(own_state_dict(sglang_tower), strict=True)
    _attend_with(tower, _twin_backend(attention, config.head_dim))
    return tower


def own_state_dict(sglang_tower: nn.Module) -> dict[str, torch.Tensor]:
    """``sglang_tower``'s parameters under transformers' names (rocm-vit's tower takes those)."""
    renamed = {}
    for name, parameter in sglang_tower.named_parameters():
        for sglang_part, own_part in _SGLANG_TO_OWN:
            name = name.replace(sglang_part, own_part)
        renamed[name] = parameter.detach()
    return renamed


def _twin_backend(attention: str, head_dim: int) -> AttentionBackend:
    if attention == "triton_attn":
        return SGLangTritonAttention()
    if attention == "aiter_attn":  # what the plugin's AiterVisionAttention builds
        return get_backend(active_policy().attention.for_aiter.value, head_dim)
    if attention == "sdpa":
        return get_backend("sdpa")
    raise ValueError(f"attention = {attention!r} has no twin in rocm-vit's own tower (triton_attn, aiter_attn, sdpa)")


def _attend_with(tower: Qwen3VLVisionTower, backend: AttentionBackend) -> None:
    # The tower builds its backend by name; SGLang's kernel has none in rocm-vit's registry.
    tower.attention = backend
    for block in tower.blocks:
        block.attn.backend = backend


@dataclass(frozen=True, slots=True)
class SGLangTritonArgs:
    """What ``context_attention_fwd`` takes: int32 offsets and lengths on the device, the longest
    segment as a host int."""

    cu_seqlens: torch.Tensor
    seq_lens: torch.Tensor
    max_seqlen: int


class SGLangTritonAttention(AttentionBackend):
    """SGLang's Triton varlen kernel (``context_attention_fwd``), as its ``triton_attn`` calls it.

    The lengths are derived from the offsets on the device once per layout (per forward eagerly,
    per graph captured), as the plugin's graph arguments derive them once per forward.
    """

    name = "sglang_triton_attn"

    def runner_args(self, segmentation: Segmentation | VisionLayout, cu_seqlens: torch.Tensor) -> SGLangTritonArgs:
        return _args(cu_seqlens, segmentation.max_seqlen)

    @property
    def reads_offsets_on_device(self) -> bool:
        return True

    def per_call_args(self, cu_seqlens: torch.Tensor, max_seqlen: int) -> SGLangTritonArgs:
        return _args(cu_seqlens, max_seqlen)

    def layer_args_from_tensor(
        self, cu_seqlens: torch.Tensor, max_seqlen: int | None = None, seq_lens: Sequence[int] | None = None
    ) -> SGLangTritonArgs:
        return _args(cu_seqlens, host_max_seqlen(self.name, cu_seqlens, max_seqlen, seq_lens))

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_args: SGLangTritonArgs, scale: float
    ) -> torch.Tensor:
        from sglang.srt.layers.attention.vision import context_attention_fwd

        output = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        context_attention_fwd(
            q,
            k,
            v,
            output,
            layer_args.cu_seqlens,
            layer_args.seq_lens,
            layer_args.max_seqlen,
            is_causal=False,
            sm_scale=scale,
        )
        return output


def _args(cu_seqlens: torch.Tensor, max_seqlen: int) -> SGLangTritonArgs:
    return SGLangTritonArgs(cu_seqlens, cu_seqlens[1:] - cu_seqlens[:-1], max_seqlen)
