"""Vision tower configurations: transformers' field names, built from a config object, a dict or a preset.

One dataclass per tower family; a preset names its family with ``model_type`` (``rocm_vit/presets.yaml``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, ClassVar

import yaml


@dataclass(frozen=True)
class TowerConfig:
    """The fields every Qwen-VL vision tower has, with transformers' names (defaults: Qwen3-VL-8B)."""

    model_type: ClassVar[str]

    depth: int = 27
    hidden_size: int = 1152
    num_heads: int = 16
    intermediate_size: int = 4304
    out_hidden_size: int = 3584
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    hidden_act: str = "gelu_pytorch_tanh"
    in_channels: int = 3
    rope_theta: float = 10000.0

    @classmethod
    def from_config(cls, config: Any) -> TowerConfig:
        """Accept a transformers vision config, an instance of this class or a mapping with the same field names."""
        if isinstance(config, cls):
            return config
        values = dict(config) if isinstance(config, Mapping) else config.to_dict()
        rope = values.get("rope_parameters") or {}
        if "rope_theta" not in values and "rope_theta" in rope:
            values["rope_theta"] = rope["rope_theta"]
        kwargs = {}
        for known in dataclasses.fields(cls):
            if known.name in values:
                value = values[known.name]
                # Lists from JSON or transformers become tuples: the config stays hashable.
                kwargs[known.name] = tuple(value or ()) if isinstance(known.default, tuple) else value
        built = cls(**kwargs)
        built.validate()
        return built

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def window_merge_blocks(self) -> int | None:
        """Window side in merge blocks for towers with windowed attention; ``None``: every block attends fully."""
        return None

    def validate(self) -> None:
        """Raise ``ValueError`` naming the field when the sizes cannot form a tower."""
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size = {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if self.head_dim % 4:
            raise ValueError(f"head dim {self.head_dim} must be divisible by 4 for the 2-D rotary embedding")

    def _check_block_indexes(self, name: str, indexes: tuple[int, ...]) -> None:
        for index in indexes:
            if not 0 <= index < self.depth:
                raise ValueError(f"{name} has {index}, outside depth {self.depth}")


@dataclass(frozen=True)
class Qwen3VLVisionConfig(TowerConfig):
    """The fields of transformers' ``Qwen3VLVisionConfig`` that shape the tower (Qwen3-VL, Qwen3.5)."""

    model_type: ClassVar[str] = "qwen3_vl"

    deepstack_visual_indexes: tuple[int, ...] = (8, 16, 24)
    num_position_embeddings: int = 2304

    @property
    def num_grid_per_side(self) -> int:
        return int(self.num_position_embeddings**0.5)

    def validate(self) -> None:
        super().validate()
        if self.num_grid_per_side**2 != self.num_position_embeddings:
            raise ValueError(f"num_position_embeddings = {self.num_position_embeddings} is not a square")
        self._check_block_indexes("deepstack_visual_indexes", self.deepstack_visual_indexes)


@dataclass(frozen=True)
class Qwen25VLVisionConfig(TowerConfig):
    """The fields of transformers' ``Qwen2_5_VLVisionConfig`` that shape the tower (defaults: the 7B tower)."""

    model_type: ClassVar[str] = "qwen2_5_vl"

    depth: int = 32
    hidden_size: int = 1280
    intermediate_size: int = 3420
    patch_size: int = 14
    hidden_act: str = "silu"
    window_size: int = 112
    fullatt_block_indexes: tuple[int, ...] = (7, 15, 23, 31)

    @property
    def window_merge_blocks(self) -> int:
        """Window side in merge blocks, rounded down as transformers does (112 px -> 4 blocks of 28 px)."""
        return self.window_size // self.spatial_merge_size // self.patch_size

    def validate(self) -> None:
        super().validate()
        if self.window_merge_blocks < 1:
            raise ValueError(
                f"window_size = {self.window_size} is smaller than one merge block "
                f"({self.spatial_merge_size} x {self.patch_size} px)"
            )
        self._check_block_indexes("fullatt_block_indexes", self.fullatt_block_indexes)


CONFIG_CLASSES: dict[str, type[TowerConfig]] = {
    cls.model_type: cls for cls in (Qwen3VLVisionConfig, Qwen25VLVisionConfig)
}


def preset_names() -> list[str]:
    return list(_presets())


def preset(name: str, **overrides: Any) -> TowerConfig:
    """A shipped preset (``rocm_vit/presets.yaml``), fields optionally overridden (``depth=2``)."""
    presets = _presets()
    if name not in presets:
        raise ValueError(f"preset {name!r} is unknown; known: {sorted(presets)}")
    fields = {**presets[name], **overrides}
    model_type = fields.pop("model_type")
    if model_type not in CONFIG_CLASSES:
        raise ValueError(f"preset {name!r}: model_type = {model_type!r} is not one of {sorted(CONFIG_CLASSES)}")
    return CONFIG_CLASSES[model_type].from_config(fields)


def _presets() -> dict[str, dict]:
    text = resources.files("rocm_vit").joinpath("presets.yaml").read_text()
    return yaml.safe_load(text)
