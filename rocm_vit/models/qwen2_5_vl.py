"""Qwen2.5-VL vision tower: windowed attention in most blocks, full attention in ``fullatt_block_indexes``.

Parameter names and shapes equal transformers' ``Qwen2_5_VisionTransformerPretrainedModel``, so the
vision weights of an HF checkpoint load unchanged.

Window attention needs the tokens of each 112 x 112 px window (4 x 4 merge blocks) side by side.
As in transformers, ``embed`` permutes the patch embeddings and the rotary positions into window
order (whole merge blocks move, so the merger still sees each block's four tokens together), every
block attends within its segmentation of that order, and ``_restore_token_order`` puts the merged
tokens back. Both permutations run in eager and graph mode alike, on index tensors computed on the
host (``VisionLayout``) and copied once per layout. The first is part of ``encode``, the captured
part, and takes its index as a per-call input; the second runs after it. So a graph depends only on
the two segmentations, and layouts that cut into the same windows share one.
"""

from __future__ import annotations

import torch
from torch import nn

from rocm_vit.attention import AttnArgs
from rocm_vit.fusion import add_norm
from rocm_vit.layout import VisionLayout, permute_merge_blocks, to_device_async
from rocm_vit.models.config import Qwen25VLVisionConfig
from rocm_vit.models.positions import rotary_position_ids
from rocm_vit.models.tower import (
    ACTIVATIONS,
    PatchEmbed,
    PreparedLayout,
    VisionBlock,
    VisionRotaryEmbedding,
    VisionTower,
    rms_norm,
    run_blocks,
)


class Qwen25VLVisionTower(VisionTower):
    """Qwen2.5-VL vision encoder (3B, 7B, 32B and 72B share it but for the merger's output width).

    ``tower(pixel_values, grid_thw)`` returns ``[N / merge², out_hidden_size]`` in ``grid_thw`` order.
    """

    config_class = Qwen25VLVisionConfig
    config: Qwen25VLVisionConfig

    def __init__(self, config: Qwen25VLVisionConfig, attention_backend: str | None = None) -> None:
        super().__init__(config, attention_backend)
        self.patch_embed = PatchEmbed(config, bias=False)
        self.rotary_pos_emb = VisionRotaryEmbedding(config.head_dim, config.rope_theta)
        self.blocks = nn.ModuleList(
            [VisionBlock(config, self.attention, rms_norm, GatedMLP(config)) for _ in range(config.depth)]
        )
        self.merger = PatchMerger(config)
        full_attention = set(config.fullatt_block_indexes)
        self._block_segmentations = tuple(
            "full" if index in full_attention else "window" for index in range(config.depth)
        )

    def embed(self, pixel_values: torch.Tensor, window_index: torch.Tensor) -> torch.Tensor:
        """Patch embedding, its merge blocks moved into window order by ``window_index``."""
        return permute_merge_blocks(self.patch_embed(pixel_values), window_index, self.config.spatial_merge_size**2)

    def forward_blocks(
        self, x: torch.Tensor, attn_args: AttnArgs, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        """All blocks, each attending within its windows or its whole frame, then the merger.

        Tokens arrive and leave in window order; ``attn_args`` has ``"full"`` and ``"window"``.
        """
        block_attn_args = [attn_args[segmentation] for segmentation in self._block_segmentations]
        normed, _ = run_blocks(self.blocks, x, block_attn_args, cos, sin, self.merger.ln_q)
        return self.merger.project(normed)

    def _prepare_layout(self, layout: VisionLayout) -> PreparedLayout:
        positions = layout.to_window_order(rotary_position_ids(layout))  # on the host
        cos, sin = self.rotary_pos_emb(to_device_async(positions, self.device))
        window_index = layout.window_tensor("window_index", self.device)
        return PreparedLayout(layout=layout, cos=cos, sin=sin, embed_inputs=(window_index,))

    def _restore_token_order(self, merged: torch.Tensor, layout: VisionLayout) -> torch.Tensor:
        return layout.from_window_order(merged)


class GatedMLP(nn.Module):
    """``down_proj(act(gate_proj(x)) * up_proj(x))``, with biases (transformers' ``Qwen2_5_VLMLP``)."""

    def __init__(self, config: Qwen25VLVisionConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=True)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=True)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=True)
        self.act_fn = ACTIVATIONS[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class PatchMerger(nn.Module):
    """RMSNorm, then merge² neighbouring tokens into one and project to ``out_hidden_size``."""

    def __init__(self, config: Qwen25VLVisionConfig) -> None:
        super().__init__()
        self.merged_size = config.hidden_size * config.spatial_merge_size**2
        self.ln_q = rms_norm(config.hidden_size)
        self.mlp = nn.Sequential(
            nn.Linear(self.merged_size, self.merged_size),
            nn.GELU(),
            nn.Linear(self.merged_size, config.out_hidden_size),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.project(add_norm(x, None, self.ln_q)[1])

    def project(self, normed: torch.Tensor) -> torch.Tensor:
        """The merge and MLP, for tokens already through ``ln_q`` (the block stack fuses it)."""
        return self.mlp(normed.view(-1, self.merged_size))
