"""Vision tower configuration: transformers' field names, built from a config object, a dict or a preset."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml


@dataclass(frozen=True)
class VisionConfig:
    """The fields of transformers' ``Qwen3VLVisionConfig`` that shape the tower."""

    depth: int = 27
    hidden_size: int = 1152
    num_heads: int = 16
    intermediate_size: int = 4304
    out_hidden_size: int = 3584
    deepstack_visual_indexes: tuple[int, ...] = (8, 16, 24)
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    num_position_embeddings: int = 2304
    hidden_act: str = "gelu_pytorch_tanh"
    in_channels: int = 3
    rope_theta: float = 10000.0

    @classmethod
    def from_config(cls, config: Any) -> VisionConfig:
        """Accept a transformers vision config, a ``VisionConfig`` or a mapping with the same field names."""
        if isinstance(config, VisionConfig):
            return config
        values = dict(config) if isinstance(config, Mapping) else config.to_dict()
        rope = values.get("rope_parameters") or {}
        if "rope_theta" not in values and "rope_theta" in rope:
            values["rope_theta"] = rope["rope_theta"]
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {name: values[name] for name in known if name in values}
        if "deepstack_visual_indexes" in kwargs:
            kwargs["deepstack_visual_indexes"] = tuple(kwargs["deepstack_visual_indexes"] or ())
        built = cls(**kwargs)
        built.validate()
        return built

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def num_grid_per_side(self) -> int:
        return int(self.num_position_embeddings**0.5)

    def validate(self) -> None:
        """Raise ``ValueError`` naming the field when the sizes cannot form a tower."""
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size = {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if self.head_dim % 4:
            raise ValueError(f"head dim {self.head_dim} must be divisible by 4 for the 2-D rotary embedding")
        if self.num_grid_per_side**2 != self.num_position_embeddings:
            raise ValueError(f"num_position_embeddings = {self.num_position_embeddings} is not a square")
        for index in self.deepstack_visual_indexes:
            if not 0 <= index < self.depth:
                raise ValueError(f"deepstack_visual_indexes has {index}, outside depth {self.depth}")


def preset_names() -> list[str]:
    return list(_presets())


def preset(name: str, **overrides: Any) -> VisionConfig:
    """A shipped preset (``rocm_vit/presets.yaml``), with fields optionally overridden (e.g. ``depth=2``)."""
    presets = _presets()
    if name not in presets:
        raise ValueError(f"preset {name!r} is unknown; known: {sorted(presets)}")
    return VisionConfig.from_config({**presets[name], **overrides})


def _presets() -> dict[str, dict]:
    text = resources.files("rocm_vit").joinpath("presets.yaml").read_text()
    return yaml.safe_load(text)
