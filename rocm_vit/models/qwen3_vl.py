"""Qwen3-VL / Qwen3.5 vision tower with transformers-compatible weights and a graphable block stack.

Parameter names and shapes equal transformers' ``Qwen3VLVisionModel``, so the vision weights of an
HF checkpoint load unchanged. Everything that depends on the image layout is computed on the host
(``VisionLayout``) and reaches the device through non-blocking copies, so a forward never waits on
the device. ``forward_blocks`` is the one function that both eager mode and graph capture run.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rocm_vit.attention import AttentionBackend, get_backend
from rocm_vit.graphs import ViTGraphRunner
from rocm_vit.layout import VisionLayout, to_device_async
from rocm_vit.models.config import VisionConfig
from rocm_vit.rotary import apply_rotary

logger = logging.getLogger(__name__)

_ACTIVATIONS = {
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "silu": F.silu,
}

# Prepared layouts kept per tower: the host work and host-to-device copies of a repeated image
# size are done once. Small, since each entry holds a few int/float tensors per patch.
_LAYOUT_CACHE_SIZE = 64


class Qwen3VLVisionTower(nn.Module):
    """Qwen3-VL (deepstack) or Qwen3.5 (no deepstack) vision encoder.

    ``tower(pixel_values, grid_thw)`` returns ``[N / merge², out_hidden_size * (1 + len(deepstack))]``:
    the merged tokens, then each deepstack feature, concatenated on dim 1 (SGLang's convention).
    """

    def __init__(self, config: VisionConfig, attention_backend: str | None = None) -> None:
        super().__init__()
        config.validate()
        if config.hidden_act not in _ACTIVATIONS:
            raise ValueError(f"hidden_act = {config.hidden_act!r} is not one of {sorted(_ACTIVATIONS)}")
        self.config = config
        self.attention: AttentionBackend = get_backend(attention_backend)
        self.patch_embed = PatchEmbed(config)
        self.pos_embed = nn.Embedding(config.num_position_embeddings, config.hidden_size)
        self.rotary_pos_emb = VisionRotaryEmbedding(config.head_dim, config.rope_theta)
        self.blocks = nn.ModuleList([VisionBlock(config, self.attention) for _ in range(config.depth)])
        self.merger = PatchMerger(config, postshuffle_norm=False)
        self.deepstack_merger_list = nn.ModuleList(
            [PatchMerger(config, postshuffle_norm=True) for _ in config.deepstack_visual_indexes]
        )
        self._deepstack_slot = {block: slot for slot, block in enumerate(config.deepstack_visual_indexes)}
        self._layouts: OrderedDict[tuple, _PreparedLayout] = OrderedDict()
        self._graph_runner: ViTGraphRunner | None = None

    @classmethod
    def from_config(cls, config: Any, attention_backend: str | None = None) -> Qwen3VLVisionTower:
        """Build from transformers' ``Qwen3VLVisionConfig``, a dict of its fields, or a ``VisionConfig``."""
        return cls(VisionConfig.from_config(config), attention_backend=attention_backend)

    @property
    def graph_runner(self) -> ViTGraphRunner | None:
        """The runner ``enable_graphs`` installed, or ``None`` while the tower runs eagerly."""
        return self._graph_runner

    @property
    def dtype(self) -> torch.dtype:
        return self.pos_embed.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.pos_embed.weight.device

    def forward(
        self,
        pixel_values: torch.Tensor,
        grid_thw: Sequence[Sequence[int]] | torch.Tensor,
        *,
        use_graphs: bool = True,
    ) -> torch.Tensor:
        """Encode packed patches ``[N, C * T * P * P]`` described by host-side ``grid_thw``.

        With graphs enabled the block stack runs through the graph runner; ``use_graphs=False``
        runs this call eagerly anyway (what ``rocm-vit verify`` compares against).
        """
        prepared = self._prepare(grid_thw, pixel_values.shape[0])
        x, cos, sin = self.embed(pixel_values, prepared)
        if use_graphs and self._graph_runner is not None:
            return self._graph_runner.run(x, prepared.layout, cos, sin)
        attn_args = self.attention.runner_args(prepared.layout, prepared.cu_seqlens)
        return self.forward_blocks(x, attn_args, cos, sin)

    def embed(self, pixel_values: torch.Tensor, prepared: _PreparedLayout) -> tuple[torch.Tensor, ...]:
        """Patch embedding plus interpolated position embedding, and the fp32 rotary ``cos``/``sin``."""
        x = self.patch_embed(pixel_values)
        taps = self.pos_embed(prepared.pos_taps) * prepared.pos_weights[:, :, None]
        x = x + taps.sum(1).to(x.dtype)
        cos, sin = self.rotary_pos_emb(prepared.rotary_positions)
        return x, cos, sin

    def forward_blocks(self, x: torch.Tensor, attn_args: list, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """All blocks, the merger and the deepstack mergers: what eager mode runs and graphs capture."""
        deepstack = []
        for index, block in enumerate(self.blocks):
            x = block(x, attn_args, cos, sin)
            slot = self._deepstack_slot.get(index)
            if slot is not None:
                deepstack.append(self.deepstack_merger_list[slot](x))
        merged = self.merger(x)
        return torch.cat([merged, *deepstack], dim=1) if deepstack else merged

    def enable_graphs(
        self,
        capacity: int | None = None,
        min_hits: int = 1,
        max_tokens: int | None = None,
        **runner_options: Any,
    ) -> ViTGraphRunner:
        """Run later calls through a ``ViTGraphRunner`` and return it (see ``rocm_vit.graphs``).

        ``runner_options`` go to the runner (``capture_context``, ``mechanism``). On a CPU tower the
        runner serves every call eagerly and logs that once.
        """
        self._graph_runner = ViTGraphRunner(
            self.forward_blocks,
            self.attention,
            capacity=capacity,
            min_hits=min_hits,
            max_tokens=max_tokens,
            **runner_options,
        )
        return self._graph_runner

    def disable_graphs(self) -> None:
        """Back to eager; the runner's graphs and pool are released when nothing else holds it."""
        self._graph_runner = None

    def _prepare(self, grid_thw: Sequence[Sequence[int]] | torch.Tensor, num_patches: int) -> _PreparedLayout:
        layout = VisionLayout.from_grid_thw(grid_thw, self.config.spatial_merge_size, num_patches=num_patches)
        key = (layout.grid_thw, self.device)
        prepared = self._layouts.get(key)
        if prepared is None:
            prepared = _PreparedLayout.build(layout, self.config, self.device)
            self._layouts[key] = prepared
            if len(self._layouts) > _LAYOUT_CACHE_SIZE:
                self._layouts.popitem(last=False)
        else:
            self._layouts.move_to_end(key)
        return prepared


@dataclass(frozen=True)
class _PreparedLayout:
    """A layout with its device-side index tensors, copied once from pinned host memory."""

    layout: VisionLayout
    cu_seqlens: torch.Tensor
    rotary_positions: torch.Tensor
    pos_taps: torch.Tensor
    pos_weights: torch.Tensor

    @classmethod
    def build(cls, layout: VisionLayout, config: VisionConfig, device: torch.device) -> _PreparedLayout:
        taps, weights = layout.position_embedding_taps(config.num_grid_per_side)
        return cls(
            layout=layout,
            cu_seqlens=layout.cu_seqlens_tensor(device),
            rotary_positions=to_device_async(layout.rotary_position_ids(), device),
            pos_taps=to_device_async(taps, device),
            pos_weights=to_device_async(weights, device),
        )


class PatchEmbed(nn.Module):
    """Conv3d patchify with kernel == stride, computed as one matmul (same weights as transformers)."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        kernel = (config.temporal_patch_size, config.patch_size, config.patch_size)
        self.proj = nn.Conv3d(config.in_channels, config.hidden_size, kernel_size=kernel, stride=kernel, bias=True)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        weight = self.proj.weight.view(self.proj.out_channels, -1)
        return F.linear(pixel_values.to(weight.dtype), weight, self.proj.bias)


class VisionRotaryEmbedding(nn.Module):
    """Axial 2-D rotary angles: the first half of each head rotates by row, the second by column."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        axis_dim = head_dim // 2
        inv_freq = 1.0 / (theta ** (torch.arange(0, axis_dim, 2, dtype=torch.float) / axis_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``positions`` ``[N, 2]`` -> fp32 ``cos``, ``sin`` ``[N, head_dim]`` in NEOX layout."""
        angles = (positions[..., None].float() * self.inv_freq).flatten(1)
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos(), angles.sin()


class VisionAttention(nn.Module):
    def __init__(self, config: VisionConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=True)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.backend = backend

    def forward(self, x: torch.Tensor, attn_args: list, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(x.shape[0], 3, self.num_heads, self.head_dim).unbind(1)
        apply_rotary(q, k, cos, sin)
        out = self.backend(q, k, v, attn_args, self.scale)
        return self.proj(out.reshape(x.shape[0], -1))


class VisionMLP(nn.Module):
    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(config.hidden_size, config.intermediate_size, bias=True)
        self.linear_fc2 = nn.Linear(config.intermediate_size, config.hidden_size, bias=True)
        self.act_fn = _ACTIVATIONS[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(self.act_fn(self.linear_fc1(x)))


class VisionBlock(nn.Module):
    def __init__(self, config: VisionConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(config.hidden_size, eps=1e-6)
        self.norm2 = nn.LayerNorm(config.hidden_size, eps=1e-6)
        self.attn = VisionAttention(config, backend)
        self.mlp = VisionMLP(config)

    def forward(self, x: torch.Tensor, attn_args: list, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), attn_args, cos, sin)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    """LayerNorm, then merge² neighbouring tokens into one and project to ``out_hidden_size``.

    The deepstack mergers normalise after the shuffle (over the merged width); the final one before.
    """

    def __init__(self, config: VisionConfig, postshuffle_norm: bool) -> None:
        super().__init__()
        self.merged_size = config.hidden_size * config.spatial_merge_size**2
        self.postshuffle_norm = postshuffle_norm
        self.norm = nn.LayerNorm(self.merged_size if postshuffle_norm else config.hidden_size, eps=1e-6)
        self.linear_fc1 = nn.Linear(self.merged_size, self.merged_size)
        self.act_fn = nn.GELU()
        self.linear_fc2 = nn.Linear(self.merged_size, config.out_hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.postshuffle_norm:
            x = self.norm(x.view(-1, self.merged_size))
        else:
            x = self.norm(x).view(-1, self.merged_size)
        return self.linear_fc2(self.act_fn(self.linear_fc1(x)))
