"""Reference vision towers with transformers-compatible weights."""

from rocm_vit.models.config import VisionConfig, preset, preset_names
from rocm_vit.models.qwen3_vl import Qwen3VLVisionTower

__all__ = ["Qwen3VLVisionTower", "VisionConfig", "preset", "preset_names"]
