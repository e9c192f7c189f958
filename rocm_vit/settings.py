"""rocm-vit settings: environment variables first, then an optional YAML file, then defaults.

SGLang's own names (``SGLANG_*``) are read exactly as SGLang 0.5.23 reads them, so one environment
drives both: ``SGLANG_USE_AITER`` through ``get_bool_env_var`` ("true"/"1" true, "false"/"0" false,
anything else warns once and counts as false) and ``SGLANG_VIT_ENABLE_CUDA_GRAPH`` through its
``EnvBool`` (also "yes"/"y" and "no"/"n"; anything else warns and takes the default, false).
rocm-vit's own variables are strict: a value they cannot parse raises ``ValueError``.
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
    "sglang_blocks": "ROCM_VIT_SGLANG_BLOCKS",
    "use_aiter": "SGLANG_USE_AITER",
    "vit_cuda_graph": "SGLANG_VIT_ENABLE_CUDA_GRAPH",
    "graph_cache_capacity": "SGLANG_VIT_CUDA_GRAPH_CACHE_CAPACITY",
    "graph_min_hits": "SGLANG_VIT_CUDA_GRAPH_MIN_HITS",
    "graph_max_tokens": "SGLANG_VIT_CUDA_GRAPH_MAX_TOKENS",
    "graph_memory_budget_mb": "SGLANG_VIT_CUDA_GRAPH_MEMORY_BUDGET_MB",
    "graph_padding": "SGLANG_VIT_CUDA_GRAPH_PADDING",
    "graph_capture_buckets": "SGLANG_VIT_CUDA_GRAPH_CAPTURE_BUCKETS",
}

# SGLang's readers of its boolean variables: get_bool_env_var (sglang.srt.utils.common) and
# EnvBool (sglang.srt.environ): (true words, false words).
_SGLANG_GET_BOOL_ENV_VAR = (("true", "1"), ("false", "0"))
_SGLANG_ENV_BOOL = (("true", "1", "yes", "y"), ("false", "0", "no", "n"))
_SGLANG_BOOLEANS = {"use_aiter": _SGLANG_GET_BOOL_ENV_VAR, "vit_cuda_graph": _SGLANG_ENV_BOOL}

# Settings of earlier releases that no longer do anything: read, warned about once, and ignored.
# Captures on a thread of their own broke when any other thread synchronized the device meanwhile
# (docs/design.md, "Hazards"): captures run inside the call that triggers them.
_REMOVED: dict[str, str] = {"graph_defer_captures": "SGLANG_VIT_CUDA_GRAPH_DEFER_CAPTURES"}

# ROCM_VIT_SGLANG_BLOCKS: rocm-vit's fused glue between SGLang's linear modules, or SGLang's own blocks.
SGLANG_BLOCKS = ("rocm-vit", "sglang")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


# The graph runner's defaults (rocm_vit.graphs takes them from here): at most this many graphs, and a
# layout captured on its second call, so one-off layouts (most of a real image mix) never are.
DEFAULT_CAPACITY = 32
DEFAULT_MIN_HITS = 2
# A memory guard, not where graphs stop paying (the cost model decides that): staging is allocated
# at this many patches (its bytes: docs/benchmarks.md, "Figures behind constants"), and larger calls
# run eagerly.
DEFAULT_MAX_TOKENS = 8192


@dataclass(frozen=True)
class Settings:
    """The settings in effect. ``None`` for a backend or rotary means "choose per platform"."""

    attention_backend: str | None = None
    rotary: str | None = None
    fused_ops: bool = True
    disable: bool = False
    sglang_blocks: str = "rocm-vit"  # SGLANG_BLOCKS: what runs between SGLang's linear modules under the plugin
    use_aiter: bool = False
    vit_cuda_graph: bool = False
    graph_cache_capacity: int = DEFAULT_CAPACITY
    graph_min_hits: int = DEFAULT_MIN_HITS
    graph_max_tokens: int | None = None  # None: DEFAULT_MAX_TOKENS (rocm_vit.policy.runner_options)
    graph_memory_budget_mb: int | None = None  # None: 1/64 of the device's memory, 256 MiB .. 4 GiB
    graph_padding: bool = True  # small layouts padded to shared buckets (docs/design.md, "Padding")
    graph_capture_buckets: bool = True  # padded buckets captured at server start (docs/sglang.md)

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
    for field_name, env_name in _REMOVED.items():
        if (field_name in raw or env_name in environ) and env_name not in _warned_removed:
            _warned_removed.add(env_name)
            logger.warning("%s is no longer used: graph captures run inside the call that triggers them", env_name)
        raw.pop(field_name, None)
    values = {f.name: _parse(f.name, f.type, raw[f.name]) for f in fields(Settings) if f.name in raw}
    return Settings(**values)


def _read_yaml(path: Path) -> dict[str, object]:
    try:
        loaded = yaml.safe_load(path.read_text()) or {}
    except OSError as err:
        raise ValueError(f"{CONFIG_ENV} = {str(path)!r} cannot be read: {err}") from err
    if not isinstance(loaded, dict):
        raise ValueError(f"{CONFIG_ENV} = {str(path)!r} must hold a mapping, got {type(loaded).__name__}")
    known = {f.name for f in fields(Settings)} | set(_REMOVED)
    unknown = sorted(set(loaded) - known)
    if unknown:
        raise ValueError(f"{CONFIG_ENV} = {str(path)!r} has unknown keys {unknown}; known: {sorted(known)}")
    return loaded


def _parse(name: str, annotation: str, value: object) -> object:
    source = ENV_NAMES.get(name, name)
    text = str(value).strip()
    if name in _SGLANG_BOOLEANS and not isinstance(value, bool):
        return _sglang_bool(source, text, *_SGLANG_BOOLEANS[name])
    if annotation == "int | None":
        return None if not text else _parse(name, "int", value)
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
    if name == "sglang_blocks":
        if text.lower() not in SGLANG_BLOCKS:
            raise ValueError(f"{source} = {value!r} is not one of {', '.join(SGLANG_BLOCKS)}")
        return text.lower()
    return text.lower() or None


def _sglang_bool(source: str, text: str, true_words: tuple[str, ...], false_words: tuple[str, ...]) -> bool:
    """A boolean as SGLang reads this variable: unknown words warn once and count as false."""
    word = text.lower()
    if word in true_words:
        return True
    if word not in false_words and source not in _warned_sglang_booleans:
        _warned_sglang_booleans.add(source)
        logger.warning(
            "%s = %r is not one of %s; treated as false, as SGLang does", source, text, true_words + false_words
        )
    return False


_warned_sglang_booleans: set[str] = set()
_warned_removed: set[str] = set()
