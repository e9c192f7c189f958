"""Qwen3-VL / Qwen3.5 vision tower with transformers-compatible weights and a graphable block stack.

Parameter names and shapes equal transformers' ``Qwen3VLVisionModel``, so HF vision weights load
unchanged. What the forward shares with the other towers (host layouts, ``encode``): ``tower.py``.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from rocm_vit.attention import AttnArgs
from rocm_vit.fusion import add_norm, add_position_embedding, linear_gelu_tanh
from rocm_vit.layout import VisionLayout, to_device_async
from rocm_vit.models.positions import position_embedding_taps, rotary_position_ids
from rocm_vit.models.side_stream import SideStream
from rocm_vit.models.tower import (
    ACTIVATIONS,
    PatchEmbed,
    PreparedLayout,
    VisionBlock,
    VisionRotaryEmbedding,
    VisionTower,
    layer_norm,
    run_blocks,
)
from rocm_vit.tower_config import Qwen3VLVisionConfig


class Qwen3VLVisionTower(VisionTower):
    """Qwen3-VL (deepstack) or Qwen3.5 vision encoder: ``[N / merge², out_hidden_size * (1 +
    len(deepstack))]``, the merged tokens then each deepstack feature on dim 1, as SGLang."""

    config_class = Qwen3VLVisionConfig
    config: Qwen3VLVisionConfig

    def __init__(self, config: Qwen3VLVisionConfig, attention_backend: str | None = None) -> None:
        super().__init__(config, attention_backend)
        self.patch_embed = PatchEmbed(config, bias=True)
        self.pos_embed = nn.Embedding(config.num_position_embeddings, config.hidden_size)
        self.rotary_pos_emb = VisionRotaryEmbedding(config.head_dim, config.rope_theta)
        self.blocks = nn.ModuleList(
            [VisionBlock(config, self.attention, layer_norm, VisionMLP(config)) for _ in range(config.depth)]
        )
        self.merger = PatchMerger(config, postshuffle_norm=False)
        self.deepstack_merger_list = nn.ModuleList(
            [PatchMerger(config, postshuffle_norm=True) for _ in config.deepstack_visual_indexes]
        )
        self._side_stream = SideStream()

    def prepare_capture(self) -> None:
        self._side_stream.prepare(self.device)

    def embed(self, pixel_values: torch.Tensor, pos_taps: torch.Tensor, pos_weights: torch.Tensor) -> torch.Tensor:
        """Patch embedding plus the position table interpolated at ``pos_taps`` ``[N, 4]`` with ``pos_weights``."""
        x = self.patch_embed(pixel_values)
        return add_position_embedding(x, self.pos_embed.weight, pos_taps, pos_weights)

    def forward_blocks(
        self, x: torch.Tensor, attn_args: AttnArgs, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        """All blocks (full attention), the merger and the deepstack mergers."""
        block_layer_args = [attn_args["full"]] * len(self.blocks)
        indexes = self.config.deepstack_visual_indexes
        # Each deepstack merger starts as soon as its block is done, beside the later blocks.
        taps = {
            index: functools.partial(self._side_stream.launch, merger)
            for index, merger in zip(indexes, self.deepstack_merger_list, strict=True)
        }
        normed, tapped = run_blocks(self.blocks, x, block_layer_args, cos, sin, self.merger.norm, taps)
        merged = self.merger.project(normed)
        deepstack = [tapped[index] for index in indexes]
        self._side_stream.join(deepstack)
        return torch.cat([merged, *deepstack], dim=1) if deepstack else merged

    def _prepare_layout(self, layout: VisionLayout) -> PreparedLayout:
        taps, weights = position_embedding_taps(layout, self.config.num_grid_per_side)
        cos, sin = self.rotary_pos_emb(to_device_async(rotary_position_ids(layout), self.device))
        # [N, 4] indices into the learned position table and their bilinear weights.
        embed_inputs = (to_device_async(taps, self.device), to_device_async(weights, self.device))
        return PreparedLayout(layout=layout, cos=cos, sin=sin, embed_inputs=embed_inputs)


class VisionMLP(nn.Module):
    def __init__(self, config: Qwen3VLVisionConfig) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(config.hidden_size, config.intermediate_size, bias=True)
        self.linear_fc2 = nn.Linear(config.intermediate_size, config.hidden_size, bias=True)
        self.hidden_act = config.hidden_act
        self.act_fn = ACTIVATIONS[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.hidden_act == "gelu_pytorch_tanh":  # Qwen3-VL's: fused into fc1 where the GPU can
            return self.linear_fc2(linear_gelu_tanh(x, self.linear_fc1))
        return self.linear_fc2(self.act_fn(self.linear_fc1(x)))


class PatchMerger(nn.Module):
    """LayerNorm, merge² tokens into one, project; deepstack mergers normalise after the shuffle."""

    def __init__(self, config: Qwen3VLVisionConfig, postshuffle_norm: bool) -> None:
        super().__init__()
        self.merged_size = config.hidden_size * config.spatial_merge_size**2
        self.postshuffle_norm = postshuffle_norm
        self.norm = nn.LayerNorm(self.merged_size if postshuffle_norm else config.hidden_size, eps=1e-6)
        self.linear_fc1 = nn.Linear(self.merged_size, self.merged_size)
        self.act_fn = nn.GELU()
        self.linear_fc2 = nn.Linear(self.merged_size, config.out_hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.postshuffle_norm:
            return self.project(add_norm(x.view(-1, self.merged_size), None, self.norm)[1])
        return self.project(add_norm(x, None, self.norm)[1])

    def project(self, normed: torch.Tensor) -> torch.Tensor:
        """The merge and MLP, for tokens already through ``norm`` (the block stack fuses the final one)."""
        return self.linear_fc2(self.act_fn(self.linear_fc1(normed.view(-1, self.merged_size))))
