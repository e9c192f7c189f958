"""Reference vision towers with transformers-compatible weights."""

from rocm_vit.models.qwen2_5_vl import Qwen25VLVisionTower
from rocm_vit.models.qwen3_vl import Qwen3VLVisionTower
from rocm_vit.models.tower import VisionTower
from rocm_vit.tower_config import Qwen3VLVisionConfig, Qwen25VLVisionConfig, TowerConfig, preset, preset_names

TOWERS: dict[str, type[VisionTower]] = {
    tower.config_class.model_type: tower for tower in (Qwen3VLVisionTower, Qwen25VLVisionTower)
}


def tower_class(config: TowerConfig) -> type[VisionTower]:
    """The tower class that builds ``config``, by its ``model_type`` (what a preset names)."""
    return TOWERS[config.model_type]


__all__ = [
    "TOWERS",
    "Qwen3VLVisionConfig",
    "Qwen3VLVisionTower",
    "Qwen25VLVisionConfig",
    "Qwen25VLVisionTower",
    "TowerConfig",
    "VisionTower",
    "preset",
    "preset_names",
    "tower_class",
]
