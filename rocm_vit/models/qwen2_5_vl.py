"""Qwen2.5-VL vision tower: windowed attention in most blocks, full attention in ``fullatt_block_indexes``.

``state_dict`` equals transformers' ``Qwen2_5_VisionTransformerPretrainedModel``. Invariant: the window
permutations (host indices) are per-call inputs and outputs of ``encode``, so a graph depends only on the
two segmentations.
"""

from __future__ import annotations

import torch
from torch import nn

from rocm_vit.attention import AttnArgs
from rocm_vit.fusion import add_norm, silu_mul
from rocm_vit.layout import VisionLayout, permute_merge_blocks, to_device_async
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
from rocm_vit.tower_config import Qwen25VLVisionConfig


class Qwen25VLVisionTower(VisionTower):
    """Qwen2.5-VL vision encoder (3B to 72B); returns ``[N / merge², out_hidden_size]`` in ``grid_thw`` order."""

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
        """All blocks, then the merger; tokens in window order; ``attn_args``: ``"full"`` and ``"window"``."""
        block_layer_args = [attn_args[segmentation] for segmentation in self._block_segmentations]
        normed, _ = run_blocks(self.blocks, x, block_layer_args, cos, sin, self.merger.ln_q)
        return self.merger.project(normed)

    def _prepare_layout(self, layout: VisionLayout) -> PreparedLayout:
        positions = layout.to_window_order(rotary_position_ids(layout))  # on the host
        cos, sin = self.rotary_pos_emb(to_device_async(positions, self.device))
        window_index = layout.window_tensor("window_index", self.device)
        return PreparedLayout(layout=layout, cos=cos, sin=sin, embed_inputs=(window_index,))

    def _restore_token_order(self, merged: torch.Tensor, layout: VisionLayout) -> torch.Tensor:
        return layout.from_window_order(merged)


class GatedMLP(nn.Module):
    """``down_proj(act(gate_proj(x)) * up_proj(x))``, with biases (transformers' ``Qwen2_5_VLMLP``).
    Held stacked and zero-padded to a multiple of 8: unaligned rows ran cuBLAS 3-4x slower (36fcd05).
    ``state_dict`` speaks transformers' names and shapes; the padding never leaves."""

    def __init__(self, config: Qwen25VLVisionConfig) -> None:
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.padded_size = padded_intermediate_size(config.intermediate_size)
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * self.padded_size, bias=True)
        self.down_proj = nn.Linear(self.padded_size, config.hidden_size, bias=True)
        self.hidden_act = config.hidden_act
        self.act_fn = ACTIVATIONS[config.hidden_act]
        with torch.no_grad():
            self.gate_up_proj.weight.copy_(self._stack(*self._unstack(self.gate_up_proj.weight)))
            self.gate_up_proj.bias.copy_(self._stack(*self._unstack(self.gate_up_proj.bias)))
            self.down_proj.weight[:, self.intermediate_size :] = 0
        self.register_state_dict_post_hook(_to_transformers)
        self.register_load_state_dict_pre_hook(_from_transformers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if self.hidden_act == "silu":  # Qwen2.5-VL's: one kernel where the GPU can
            return self.down_proj(silu_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(self.act_fn(gate) * up)

    def _unstack(self, stacked: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """transformers' gate and up rows (views) of a stacked, padded weight or bias."""
        width, padded = self.intermediate_size, self.padded_size
        return stacked[:width], stacked[padded : padded + width]

    def _stack(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """transformers' gate and up rows stacked at the padded width, zeros between and after."""
        padded = self.padded_size
        stacked = gate.new_zeros((2 * padded, *gate.shape[1:]))
        stacked[: gate.shape[0]] = gate
        stacked[padded : padded + up.shape[0]] = up
        return stacked


def padded_intermediate_size(size: int) -> int:
    """The gated MLP's width as held: a multiple of 8, so rows are 16-byte aligned in every dtype."""
    return -(-size // 8) * 8


_TRANSFORMERS_NAMES = ("gate_proj.weight", "gate_proj.bias", "up_proj.weight", "up_proj.bias")


def _to_transformers(module: GatedMLP, state: dict, prefix: str, local_metadata: dict) -> None:
    """``state_dict`` hook: the stacked, padded weights back to transformers' names and shapes (in its order)."""
    gate_weight, up_weight = module._unstack(state.pop(prefix + "gate_up_proj.weight"))
    gate_bias, up_bias = module._unstack(state.pop(prefix + "gate_up_proj.bias"))
    down_weight = state.pop(prefix + "down_proj.weight")[:, : module.intermediate_size].contiguous()
    down_bias = state.pop(prefix + "down_proj.bias")
    values = (gate_weight, gate_bias, up_weight, up_bias)
    state.update({prefix + name: value for name, value in zip(_TRANSFORMERS_NAMES, values, strict=True)})
    state[prefix + "down_proj.weight"] = down_weight
    state[prefix + "down_proj.bias"] = down_bias


def _from_transformers(module: GatedMLP, state: dict, prefix: str, *args: object) -> None:
    """``load_state_dict`` pre-hook: transformers' gate, up and down weights into the stacked, padded ones."""
    names = [prefix + name for name in _TRANSFORMERS_NAMES]
    if not all(name in state for name in names):
        return
    gate_weight, gate_bias, up_weight, up_bias = (state.pop(name) for name in names)
    state[prefix + "gate_up_proj.weight"] = module._stack(gate_weight, up_weight)
    state[prefix + "gate_up_proj.bias"] = module._stack(gate_bias, up_bias)
    down_weight = state.get(prefix + "down_proj.weight")
    if down_weight is not None and down_weight.shape[-1] == module.intermediate_size:
        padded = down_weight.new_zeros((down_weight.shape[0], module.padded_size))
        padded[:, : module.intermediate_size] = down_weight
        state[prefix + "down_proj.weight"] = padded


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
