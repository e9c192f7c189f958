"""rocm-vit settings: environment variables first, then an optional YAML file, then defaults.

SGLang's own names (``SGLANG_*``) are read as SGLang reads them, so one environment drives both.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import yaml

logger = logging.getLogger(__name__)

CONFIG_ENV = "ROCM_VIT_CONFIG"

# field name -> environment variable that sets it
ENV_NAMES: dict[str, str] = {
    "attention_backend": "ROCM_VIT_ATTENTION_BACKEND",
    "rotary": "ROCM_VIT_ROTARY",
    "fused_ops": "ROCM_VIT_FUSED_OPS",
    "disable": "ROCM_VIT_DISABLE",
    "use_aiter": "SGLANG_USE_AITER",
    "vit_cuda_graph": "SGLANG_VIT_ENABLE_CUDA_GRAPH",
    "graph_cache_capacity": "SGLANG_VIT_CUDA_GRAPH_CACHE_CAPACITY",
}

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True)
class Settings:
    """The settings in effect. ``None`` for a backend or rotary means "choose per platform"."""

    attention_backend: str | None = None
    rotary: str | None = None
    fused_ops: bool = True
    disable: bool = False
    use_aiter: bool = False
    vit_cuda_graph: bool = False
    graph_cache_capacity: int = 32

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Read settings from ``environ`` (default ``os.environ``) and the YAML file ``ROCM_VIT_CONFIG`` names.

    Raises ``ValueError`` naming the variable and its value when a value cannot be parsed.
    """
    environ = os.environ if environ is None else environ
    raw: dict[str, object] = {}
    config_path = environ.get(CONFIG_ENV)
    if config_path:
        raw.update(_read_yaml(Path(config_path)))
    for field_name, env_name in ENV_NAMES.items():
        if env_name in environ:
            raw[field_name] = environ[env_name]
    values = {f.name: _parse(f.name, f.type, raw[f.name]) for f in fields(Settings) if f.name in raw}
    return Settings(**values)


def _read_yaml(path: Path) -> dict[str, object]:
    try:
        loaded = yaml.safe_load(path.read_text()) or {}
    except OSError as err:
        raise ValueError(f"{CONFIG_ENV} = {str(path)!r} cannot be read: {err}") from err
    if not isinstance(loaded, dict):
        raise ValueError(f"{CONFIG_ENV} = {str(path)!r} must hold a mapping, got {type(loaded).__name__}")
    known = {f.name for f in fields(Settings)}
    unknown = sorted(set(loaded) - known)
    if unknown:
        raise ValueError(f"{CONFIG_ENV} = {str(path)!r} has unknown keys {unknown}; known: {sorted(known)}")
    return loaded


def _parse(name: str, annotation: str, value: object) -> object:
    source = ENV_NAMES.get(name, name)
    text = str(value).strip()
    if annotation == "bool":
        if isinstance(value, bool):
            return value
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ValueError(f"{source} = {value!r} is not a boolean (use 1/0, true/false)")
    if annotation == "int":
        try:
            number = int(text)
        except ValueError:
            raise ValueError(f"{source} = {value!r} is not an integer") from None
        if number < 0:
            raise ValueError(f"{source} = {value!r} must be >= 0")
        return number
    return text.lower() or None
