"""Tuned profiles: what ``rocm-vit tune`` measured on one GPU, stored as YAML for every later process.

Invariant: a profile is used only where its key (device, arch, versions that run kernels) matches this
process's; otherwise it is ignored with one warning. ``ROCM_VIT_PROFILE`` names a file or ``off``;
unset, one file per device and arch in the per-user cache.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rocm_vit.platform import PlatformInfo
from rocm_vit.version import KEYED_DISTRIBUTIONS, __version__, installed_distribution

logger = logging.getLogger(__name__)

PROFILE_ENV = "ROCM_VIT_PROFILE"
PROFILE_OFF = ("off", "0", "none", "false")  # values of PROFILE_ENV that mean "no profile"
PROFILE_FORMAT = 1


@dataclass(frozen=True)
class AttentionTiming:
    """One measured layout at one head dim: segment lengths and each backend's median milliseconds."""

    name: str
    seq_lens: tuple[int, ...]
    ms: Mapping[str, float]
    head_dim: int

    def fastest(self, allowed: Sequence[str]) -> str | None:
        """The fastest backend among ``allowed`` (those that can run now), or ``None``."""
        timed = [(ms, name) for name, ms in self.ms.items() if name in allowed]
        return min(timed)[1] if timed else None


@dataclass(frozen=True)
class GraphTiming:
    """Eager against graph replay at one patch count of the tuned preset."""

    patches: int
    eager_ms: float
    graph_ms: float


@dataclass(frozen=True)
class ConsumerTiming:
    """``gluon_attn`` with two and three consumer warpgroups; ``waves``: three-consumer programs per SM."""

    name: str
    waves: float
    two_ms: float
    three_ms: float


@dataclass(frozen=True)
class TunedProfile:
    """What ``rocm-vit tune`` measured, and the choices it derived (``three_consumer_waves``: ``inf``
    for nowhere, ``None`` unmeasured)."""

    key: Mapping[str, str]
    preset: str
    created: str
    attention: tuple[AttentionTiming, ...]
    rotary_ms: Mapping[str, float] = field(default_factory=dict)
    fused_ops_ms: Mapping[str, float] = field(default_factory=dict)
    graphs: tuple[GraphTiming, ...] = ()
    gluon_consumers: tuple[ConsumerTiming, ...] = ()
    three_consumer_waves: float | None = None
    path: str = ""

    @property
    def head_dims(self) -> tuple[int, ...]:
        return tuple(sorted({timing.head_dim for timing in self.attention}))

    def as_yaml(self) -> str:
        document = asdict(self)
        document.pop("path")
        document["format"] = PROFILE_FORMAT
        for timing in document["attention"]:
            timing["seq_lens"] = list(timing["seq_lens"])
            timing["ms"] = dict(timing["ms"])
        document["key"] = dict(self.key)
        return yaml.safe_dump(document, sort_keys=False, default_flow_style=None)


def profile_key(info: PlatformInfo) -> dict[str, str]:
    """What a profile must match to be used: the device, its arch and the versions that run kernels."""
    key = {"device": info.device_name, "arch": info.arch, "emulated_on": info.emulated_on}
    for name, distributions in KEYED_DISTRIBUTIONS.items():
        found = installed_distribution(distributions)
        key[name] = found[1] if found else "-"
    key["rocm_vit"] = __version__
    return key


def default_profile_path(info: PlatformInfo) -> Path:
    """The per-user file ``rocm-vit tune`` writes for this device (one per device name and arch)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    emulated = f"-on-{info.emulated_on}" if info.emulated_on else ""
    slug = re.sub(r"[^a-z0-9]+", "-", f"{info.device_name}-{info.arch}{emulated}".lower()).strip("-")
    return cache / "rocm-vit" / "profiles" / f"{slug}.yaml"


def profile_path(info: PlatformInfo, environ: Mapping[str, str] | None = None) -> Path | None:
    """The profile file this process reads: ``ROCM_VIT_PROFILE``, or the default; ``None`` for ``off``."""
    environ = os.environ if environ is None else environ
    value = environ.get(PROFILE_ENV, "").strip()
    if value.lower() in PROFILE_OFF:
        return None
    return Path(value) if value else default_profile_path(info)


def load_profile(info: PlatformInfo, environ: Mapping[str, str] | None = None) -> tuple[TunedProfile | None, str]:
    """The profile in force and a sentence saying which (or why none); ``ValueError`` where the file
    ``ROCM_VIT_PROFILE`` names cannot be read."""
    if info.name == "cpu":
        return None, "none (no GPU)"
    path = profile_path(info, environ)
    if path is None:
        return None, f"none ({PROFILE_ENV}=off)"
    explicit = bool((os.environ if environ is None else environ).get(PROFILE_ENV, "").strip())
    if not path.exists():
        if explicit:
            raise ValueError(f"{PROFILE_ENV} = {str(path)!r} does not exist")
        return None, f"none (no profile at {path}; run rocm-vit tune)"
    profile = read_profile(path)
    mismatch = _key_mismatch(profile.key, profile_key(info))
    if mismatch:
        _warn_stale(str(path), mismatch)
        return None, f"none ({path} ignored: {mismatch})"
    return profile, f"{path} (tuned {profile.created} with {profile.preset})"


def read_profile(path: Path) -> TunedProfile:
    """Parse a profile file; ``ValueError`` naming the file when it is not one."""
    try:
        document = yaml.safe_load(path.read_text())
        if not isinstance(document, dict) or document.get("format") != PROFILE_FORMAT:
            raise ValueError(f"not a format-{PROFILE_FORMAT} rocm-vit profile")
        return TunedProfile(
            key={str(k): str(v) for k, v in document["key"].items()},
            preset=str(document["preset"]),
            created=str(document["created"]),
            attention=tuple(
                AttentionTiming(
                    str(row["name"]),
                    tuple(int(n) for n in row["seq_lens"]),
                    {str(k): float(v) for k, v in row["ms"].items()},
                    int(row["head_dim"]),
                )
                for row in document["attention"]
            ),
            rotary_ms={str(k): float(v) for k, v in (document.get("rotary_ms") or {}).items()},
            fused_ops_ms={str(k): float(v) for k, v in (document.get("fused_ops_ms") or {}).items()},
            graphs=tuple(GraphTiming(**row) for row in document.get("graphs") or ()),
            gluon_consumers=tuple(ConsumerTiming(**row) for row in document.get("gluon_consumers") or ()),
            three_consumer_waves=_optional_float(document.get("three_consumer_waves")),
            path=str(path),
        )
    except (OSError, AttributeError, KeyError, TypeError, ValueError, yaml.YAMLError) as err:
        raise ValueError(f"{str(path)!r} is not a usable rocm-vit profile: {type(err).__name__}: {err}") from err


def write_profile(profile: TunedProfile, path: Path) -> None:
    """Write ``profile`` to ``path`` atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(path.suffix + ".partial")
    partial.write_text(profile.as_yaml())
    partial.replace(path)


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _key_mismatch(stored: Mapping[str, str], current: Mapping[str, str]) -> str:
    for name, value in current.items():
        if stored.get(name) != value:
            return f"measured with {name} {stored.get(name)!r}, this process has {value!r}"
    return ""


@functools.cache
def _warn_stale(path: str, mismatch: str) -> None:
    logger.warning("tuned profile %s is ignored: %s; run rocm-vit tune again", path, mismatch)


def profile_summary(profile: TunedProfile | None) -> dict[str, Any]:
    """What doctor prints about a profile: where, when, what it measured."""
    if profile is None:
        return {}
    return {
        "path": profile.path,
        "preset": profile.preset,
        "created": profile.created,
        "attention_layouts": len(profile.attention),
        "head_dims": list(profile.head_dims),
        "graph_timings": len(profile.graphs),
    }
