"""One resolved Policy: attention kernel, rotary, fused ops, side stream, graph limits and cost model, and why.

``resolve_policy`` is pure over platform facts, settings and an optional tuned profile. Invariant: the
policy is fixed for the life of a process, so replay equals eager (``use_policy``: tune and tests only).
Defaults measured on an H200, guesses elsewhere. Contract: docs/design.md, "Policy".
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import logging
import math
import operator
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import torch

from rocm_vit.backend_requirements import REQUIREMENTS, backend_unavailable_reason
from rocm_vit.graphs.cost import PAYBACK_SHARE, CostModel, fit_cost_model
from rocm_vit.graphs.options import RunnerOptions
from rocm_vit.platform import Facts, platform_info
from rocm_vit.profile import (
    PROFILE_ENV,
    PROFILE_OFF,
    AttentionTiming,
    TunedProfile,
    load_profile,
    profile_summary,
    read_profile,
)
from rocm_vit.settings import DEFAULT_MAX_TOKENS, ENV_NAMES, Settings, load_settings
from rocm_vit.tower_config import preset

logger = logging.getLogger(__name__)

# Modules whose presence changes a choice; found with find_spec, never imported.
PROBED_MODULES = tuple(dict.fromkeys(["triton", *(name for needs in REQUIREMENTS.values() for name in needs.modules)]))

# The CUDA rule (``pick_cuda_backend``); measured: docs/long-sequences.md,
# "The rule at photo sizes without a long-sequence kernel".
CUDA_PARTIAL_TILE_VARLEN = "triton_attn"
CUDA_SDPA_MAX_SEGMENTS = 4
CUDA_SDPA_MIN_SEGMENT_TOKENS = 1024
# Long-sequence kernels, from this longest segment up (docs/benchmarks.md, "`rocm-vit bench-attn`").
CUDA_LONG_KERNELS = ("fa4", "gluon_attn")
CUDA_LONG_MIN_TOKENS = {"fa4": 2048, "gluon_attn": 2048}
CUDA_VARLEN_PREFERENCE = ("triton_attn", "torch_varlen")
# What ``auto`` may pick per layout on each platform, when available (aiter only with SGLANG_USE_AITER=1).
AUTO_CANDIDATES: dict[str, tuple[str, ...]] = {
    "cuda": ("fa4", "gluon_attn", "sdpa", "triton_attn", "torch_varlen"),
    "rocm": ("aiter_attn", "aiter_attn_pad128", "triton_attn", "sdpa"),
    "cpu": ("sdpa",),
}
# A tuned attention pick replaces the default rule's only where that was measured this much slower.
TUNED_MARGIN = 0.03
# Tile size whose multiples attention kernels handle without a ragged last tile (a nearness feature).
ALIGNMENT_TOKENS = 128
ROTARY_IMPLS = ("triton", "compiled", "native")
# ROCm takes the Triton kernel too: one launch for q and k, AOT-checked for gfx942/gfx950, where the compiled
# helper launched four (two kernels, two copies) behind ~0.25 ms of Dynamo and Inductor host work a block
# (docs/benchmarks.md, "Eager host cost"). Without Triton, GPUs take the native helper: the
# compiled one is no choice there (``rotary_unavailable_reason``).
_DEFAULT_ROTARY = {"cuda": "triton", "rocm": "triton", "cpu": "native"}
_ROTARY_WHY = {
    "triton": "the Triton kernel, one launch for q and k where the compiled helper launches four",
    "native": "the native helper, transformers' own operations",
}
# How each rotary's results compare with transformers' ``apply_rotary_pos_emb_vision`` (docs/numerics.md).
ROTARY_ROUNDING = {
    "triton": "as transformers, bit for bit (shapes the kernel does not cover run the native helper)",
    "compiled": "within one rounding of transformers, not bit for bit: Inductor may fuse a product into its sum",
    "native": "as transformers, bit for bit",
}


@dataclass(frozen=True)
class Choice:
    """One decision and the sentence that explains it."""

    value: Any
    reason: str


class AttentionRule(Protocol):
    """Picks a backend name for one segmentation from its host-side segment lengths."""

    candidates: tuple[str, ...]  # every name ``pick`` may return
    without_lengths: str  # what runs for a caller with a device ``cu_seqlens`` and no host lengths

    def pick(self, seq_lens: Sequence[int], head_dim: int | None = None) -> tuple[str, str]: ...


@dataclass(frozen=True)
class FixedRule:
    """Every layout on one backend."""

    backend: str

    @property
    def candidates(self) -> tuple[str, ...]:
        return (self.backend,)

    @property
    def without_lengths(self) -> str:
        return self.backend

    def pick(self, seq_lens: Sequence[int], head_dim: int | None = None) -> tuple[str, str]:
        return self.backend, f"{self.backend} for every layout"


@dataclass(frozen=True)
class CudaRule:
    """The hand-written CUDA rule (``pick_cuda_backend``) over the kernels available."""

    varlen: str
    long: str | None = None

    @property
    def candidates(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(name for name in ("sdpa", self.varlen, self.long) if name))

    @property
    def without_lengths(self) -> str:
        return self.varlen

    def pick(self, seq_lens: Sequence[int], head_dim: int | None = None) -> tuple[str, str]:
        long = self.long
        if long is not None and REQUIREMENTS[long].head_dim_reason(head_dim) is not None:
            long = None
        return pick_cuda_backend(seq_lens, self.varlen, long)


@dataclass(frozen=True)
class TunedRule:
    """The fastest available backend at the nearest measured layout (``_layout_features``).

    Replaces ``fallback``'s pick only where that was measured over ``TUNED_MARGIN`` slower; unmeasured
    head dims and layouts with no runnable measured backend use ``fallback``.
    """

    timings: tuple[AttentionTiming, ...]
    allowed: tuple[str, ...]
    fallback: AttentionRule

    @property
    def candidates(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((*self.allowed, *self.fallback.candidates)))

    @property
    def without_lengths(self) -> str:
        return self.fallback.without_lengths

    def pick(self, seq_lens: Sequence[int], head_dim: int | None = None) -> tuple[str, str]:
        timings = [timing for timing in self.timings if head_dim is None or timing.head_dim == head_dim]
        if not timings:
            name, why = self.fallback.pick(seq_lens, head_dim)
            measured = ", ".join(str(d) for d in sorted({timing.head_dim for timing in self.timings}))
            return name, f"head dim {head_dim} not tuned (the profile measured {measured}): {why}"
        features = _layout_features(seq_lens)
        nearest = min(timings, key=lambda timing: _distance(features, _layout_features(timing.seq_lens)))
        name = nearest.fastest(self.allowed)
        default, why = self.fallback.pick(seq_lens, head_dim)
        if name is None:
            return default, f"no backend measured at {nearest.name} can run here: {why}"
        if default in nearest.ms and nearest.ms[default] <= nearest.ms[name] * (1 + TUNED_MARGIN):
            return (
                default,
                f"tuned: at {nearest.name} the default {default} is within {TUNED_MARGIN:.0%} of the fastest",
            )
        return name, f"tuned: nearest measured layout {nearest.name}, {name} {nearest.ms[name]:.4g} ms"


@dataclass(frozen=True)
class AttentionPolicy:
    """``backend``: what ``get_backend()`` builds; ``for_aiter``: what serves a caller naming aiter."""

    backend: str
    reason: str
    rule: AttentionRule
    for_aiter: Choice = Choice("aiter_attn", "named by the caller: aiter_attn for every layout")

    def pick(self, seq_lens: Sequence[int], head_dim: int | None = None) -> tuple[str, str]:
        return self.rule.pick(seq_lens, head_dim)


@dataclass(frozen=True)
class Policy:
    """Every choice, each with its reason; ``report`` is what ``rocm-vit doctor`` prints."""

    facts: Facts
    attention: AttentionPolicy
    rotary: Choice
    fused_ops: Choice
    gelu_epilogue: Choice
    side_stream: Choice
    graph_cost: Choice  # value: the CostModel graph admission predicts savings with
    gluon_consumers: Choice  # value: the waves from which gluon_attn runs three consumers; None: its default
    profile: Choice  # value: the TunedProfile in force, or None

    def report(self) -> dict[str, Any]:
        return {
            "attention": {
                "backend": self.attention.backend,
                "why": self.attention.reason,
                "for_aiter": {"backend": self.attention.for_aiter.value, "why": self.attention.for_aiter.reason},
            },
            "rotary": {
                "implementation": self.rotary.value,
                "rounding": ROTARY_ROUNDING[self.rotary.value],
                "why": self.rotary.reason,
            },
            "fused_ops": {"block_ops": "fused" if self.fused_ops.value else "plain", "why": self.fused_ops.reason},
            "gelu_epilogue": {"on": self.gelu_epilogue.value, "why": self.gelu_epilogue.reason},
            "side_stream": {"on": self.side_stream.value, "why": self.side_stream.reason},
            "graph_cost": {**_cost_report(self.graph_cost.value), "why": self.graph_cost.reason},
            "gluon_consumers": {
                "three_from_waves": _json_waves(self.gluon_consumers.value),
                "why": self.gluon_consumers.reason,
            },
            "profile": {"in_force": self.profile.reason, **profile_summary(self.profile.value)},
        }


def resolve_policy(
    facts: Facts, settings: Settings, profile: TunedProfile | None = None, profile_status: str = ""
) -> Policy:
    """The policy for ``facts`` under ``settings`` and ``profile``: pure, so tests are tables over it.

    Raises ``ValueError`` naming the variable when a setting names no known implementation.
    """
    fused = _fused_ops(facts, settings, profile)
    return Policy(
        facts=facts,
        attention=_attention(facts, settings, profile),
        rotary=_rotary(facts, settings, profile),
        fused_ops=fused,
        gelu_epilogue=_gelu_epilogue(facts, fused.value),
        side_stream=_side_stream(facts),
        graph_cost=_graph_cost(profile),
        gluon_consumers=_gluon_consumers(profile),
        profile=Choice(profile, profile_status or ("none" if profile is None else profile.path)),
    )


def runner_options(
    policy: Policy | None,
    settings: Settings,
    blocks: int,
    *,
    takes_device_offsets: bool,
    padded: bool | None = None,
    by_benefit: bool = True,
) -> RunnerOptions:
    """The graph runner's options for a tower of ``blocks`` blocks: the one builder, for
    ``VisionTower.enable_graphs`` and the SGLang adapter alike, and the one place their precedence is
    resolved.

    Limits from ``settings`` (``SGLANG_VIT_CUDA_GRAPH_*``; ``max_tokens`` unset: ``DEFAULT_MAX_TOKENS``)
    and cost model from ``policy`` (``None``: the defaults, for a server whose policy did not
    resolve). ``by_benefit=False``: no cost model, every layout within the limits (``bench``,
    ``verify``). Padding where the attention backend takes its offsets on the device alone (a
    padded layout's change per call) and ``padded`` says (``None``: ``SGLANG_VIT_CUDA_GRAPH_PADDING``
    where admission is by benefit). Raises ``ValueError`` (``RunnerOptions``) for values out of range."""
    max_tokens = DEFAULT_MAX_TOKENS if settings.graph_max_tokens is None else settings.graph_max_tokens
    model = (CostModel() if policy is None else policy.graph_cost.value).for_blocks(blocks)
    pads = (settings.graph_padding and by_benefit) if padded is None else padded
    budget_mb = settings.graph_memory_budget_mb
    return RunnerOptions(
        capacity=settings.graph_cache_capacity,
        min_hits=settings.graph_min_hits,
        max_tokens=max_tokens,
        budget_bytes=None if budget_mb is None else budget_mb << 20,
        cost_model=model if by_benefit else None,
        padding_model=model if pads and takes_device_offsets else None,
    )


def check_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """The settings, after every check ``current_policy`` would make that needs no GPU.

    Raises ``ValueError`` naming the variable (bad value, unknown rotary, missing or invalid profile).
    """
    environ = os.environ if environ is None else environ
    settings = load_settings(environ)
    _check_rotary_name(settings.rotary)
    named = environ.get(PROFILE_ENV, "").strip()
    if named and named.lower() not in PROFILE_OFF:
        path = Path(named)
        if not path.exists():
            raise ValueError(f"{PROFILE_ENV} = {named!r} does not exist")
        read_profile(path)
    return settings


@functools.cache
def current_facts() -> Facts:
    """The facts of this process: ``platform_info`` and which modules can be imported (none is)."""
    info = platform_info()
    modules = frozenset(name for name in PROBED_MODULES if _module_available(name))
    return Facts(
        platform=info.name,
        arch=info.arch,
        device_name=info.device_name,
        emulated_on=info.emulated_on,
        modules=modules,
        triton_interpret=os.environ.get("TRITON_INTERPRET") == "1",
        gelu_epilogue_op=hasattr(torch, "_addmm_activation"),
        capability=_cuda_capability(info.arch) if info.name == "cuda" else None,
    )


@functools.cache
def current_policy() -> Policy:
    """This process's policy, resolved once; raises ``ValueError`` as ``check_settings`` does."""
    facts = current_facts()
    profile, status = load_profile(platform_info())
    policy = resolve_policy(facts, load_settings(), profile, status)
    logger.info(
        "policy: attention %s, rotary %s, fused ops %s; profile: %s",
        policy.attention.backend,
        policy.rotary.value,
        "on" if policy.fused_ops.value else "off",
        status,
    )
    return policy


def reset_policy() -> None:
    """Forget the resolved policy: the next ``current_policy()`` reads the environment again (tests)."""
    current_policy.cache_clear()
    current_facts.cache_clear()
    _active.clear()


@contextlib.contextmanager
def use_policy(policy: Policy) -> Iterator[Policy]:
    """Run the body under ``policy`` (tune, tests); not for serving: graphs replay the captured policy."""
    _active.append(policy)
    try:
        yield policy
    finally:
        _active.remove(policy)


def active_policy() -> Policy:
    """The policy in force now: the innermost ``use_policy``, else ``current_policy()``."""
    return _active[-1] if _active else current_policy()


_active: list[Policy] = []


def pick_cuda_backend(
    seq_lens: Sequence[int], varlen_name: str = "triton_attn", long_name: str | None = None
) -> tuple[str, str]:
    """The CUDA rule: ``(backend, why)`` for a layout's host-side segment lengths."""
    lengths = [operator.index(length) for length in seq_lens]
    if long_name is not None and max(lengths) >= CUDA_LONG_MIN_TOKENS[long_name]:
        return long_name, f"longest of {len(lengths)} segments has {max(lengths)} tokens: {long_name}"
    if min(lengths) < CUDA_SDPA_MIN_SEGMENT_TOKENS:
        return varlen_name, f"shortest of {len(lengths)} segments has {min(lengths)} tokens: one varlen launch"
    partial = [n for n in lengths if n % ALIGNMENT_TOKENS] if varlen_name == CUDA_PARTIAL_TILE_VARLEN else []
    if partial:
        return varlen_name, (
            f"{len(partial)} of {len(lengths)} segments ({partial[0]} tokens) end in a partial "
            f"{ALIGNMENT_TOKENS}-token tile, where {varlen_name} beats cuDNN"
        )
    if len(set(lengths)) == 1:
        return "sdpa", f"{len(lengths)} equal segments: one batched SDPA call"
    if len(lengths) <= CUDA_SDPA_MAX_SEGMENTS:
        return "sdpa", f"{len(lengths)} segments of >= {CUDA_SDPA_MIN_SEGMENT_TOKENS} tokens"
    return varlen_name, f"{len(lengths)} segments of >= {CUDA_SDPA_MIN_SEGMENT_TOKENS} tokens: one varlen launch"


def _attention(facts: Facts, settings: Settings, profile: TunedProfile | None) -> AttentionPolicy:
    if settings.attention_backend == "auto":  # named: the platform's own per-layout rule
        chosen = _attention(facts, replace(settings, attention_backend=None), profile)
        return replace(chosen, backend="auto", reason=f"set by {ENV_NAMES['attention_backend']}: {chosen.reason}")
    if facts.platform == "rocm":
        return _rocm_attention(facts, settings, profile)
    if settings.attention_backend:
        return _named_attention(settings.attention_backend)
    if facts.platform == "cuda":
        rule, reason = _cuda_rule(facts)
        if profile is None:
            return AttentionPolicy("auto", reason, rule)
        return _tuned_attention(profile, _runnable(facts, AUTO_CANDIDATES["cuda"]), rule, reason)
    return AttentionPolicy("sdpa", f"{facts.platform}: per-sequence scaled_dot_product_attention", FixedRule("sdpa"))


def _rocm_attention(facts: Facts, settings: Settings, profile: TunedProfile | None) -> AttentionPolicy:
    """ROCm: the named backend, else aiter_attn (installed and SGLANG_USE_AITER=1), triton_attn, sdpa."""
    if settings.attention_backend:
        attention = _named_attention(settings.attention_backend)
    else:
        aiter_missing = backend_unavailable_reason("aiter_attn", facts)
        if aiter_missing is None and settings.use_aiter:
            base, reason = FixedRule("aiter_attn"), "ROCm with aiter installed and SGLANG_USE_AITER=1"
        else:
            why = "aiter is not installed (pip install rocm-vit[aiter])" if aiter_missing else "SGLANG_USE_AITER is off"
            if backend_unavailable_reason("triton_attn", facts) is None:
                base, reason = FixedRule("triton_attn"), f"ROCm and {why}: rocm-vit's Triton varlen kernel"
            else:
                base, reason = FixedRule("sdpa"), f"ROCm, {why} and triton is missing"
        if profile is None:
            attention = AttentionPolicy(base.backend, reason, base)
        else:
            allowed = tuple(
                name
                for name in _runnable(facts, AUTO_CANDIDATES["rocm"])
                if settings.use_aiter or "aiter" not in REQUIREMENTS[name].modules
            )
            attention = _tuned_attention(profile, allowed, base, reason)
    if attention.backend == "auto":
        for_aiter = Choice("auto", "the policy picks the kernel per layout here")
        return replace(attention, for_aiter=for_aiter)
    return attention


def _named_attention(name: str) -> AttentionPolicy:
    return AttentionPolicy(name, f"set by {ENV_NAMES['attention_backend']}", FixedRule(name))


def _cuda_rule(facts: Facts) -> tuple[CudaRule, str]:
    varlen = next((name for name in CUDA_VARLEN_PREFERENCE if backend_unavailable_reason(name, facts) is None), "sdpa")
    missing = {name: backend_unavailable_reason(name, facts) for name in CUDA_LONG_KERNELS}
    long = next((name for name in CUDA_LONG_KERNELS if missing[name] is None), None)
    long_rule = (
        f"{long} when the longest segment has >= {CUDA_LONG_MIN_TOKENS[long]} tokens, else "
        if long is not None
        else f"(no long-sequence kernel: {'; '.join(missing.values())}) "
    )
    reason = (
        f"CUDA: per layout, {long_rule}SDPA when every segment has >= {CUDA_SDPA_MIN_SEGMENT_TOKENS} tokens "
        f"and they are equal or <= {CUDA_SDPA_MAX_SEGMENTS}"
        + (f" and whole {ALIGNMENT_TOKENS}-token tiles" if varlen == CUDA_PARTIAL_TILE_VARLEN else "")
        + f", else {varlen}"
    )
    return CudaRule(varlen, long), reason


def _tuned_attention(
    profile: TunedProfile, allowed: tuple[str, ...], fallback: AttentionRule, fallback_reason: str
) -> AttentionPolicy:
    head_dims = ", ".join(str(head_dim) for head_dim in profile.head_dims)
    reason = (
        f"tuned: per layout the fastest of {', '.join(allowed)} at the nearest of {len(profile.attention)} layouts "
        f"measured at head dim {head_dims}; other head dims: {fallback_reason}"
    )
    return AttentionPolicy("auto", reason, TunedRule(profile.attention, allowed, fallback))


def _runnable(facts: Facts, names: Sequence[str]) -> tuple[str, ...]:
    return tuple(name for name in names if backend_unavailable_reason(name, facts) is None)


def _rotary(facts: Facts, settings: Settings, profile: TunedProfile | None) -> Choice:
    available = [name for name in ROTARY_IMPLS if rotary_unavailable_reason(name, facts) is None]
    if facts.platform == "cpu":
        available = [name for name in available if name != "triton" or facts.triton_interpret]
    if settings.rotary is not None:
        _check_rotary_name(settings.rotary)
        choice = Choice(settings.rotary, f"{ENV_NAMES['rotary']}={settings.rotary}")
    elif profile is not None and (timed := {n: ms for n, ms in profile.rotary_ms.items() if n in available}):
        fastest = min(timed, key=timed.__getitem__)
        choice = Choice(fastest, f"tuned: {_timings(timed)}")
    else:
        name = _DEFAULT_ROTARY[facts.platform]
        choice = Choice(name, f"default on {facts.platform}: {_ROTARY_WHY[name]}")
    if missing := rotary_unavailable_reason(choice.value, facts):
        return Choice("native", f"{choice.reason}, but {missing}: the native helper")
    return choice


def rotary_unavailable_reason(name: str, facts: Facts) -> str | None:
    """Why the rotary ``name`` cannot run here, or None. Without Triton there is no ``compiled`` on a GPU
    either: Inductor generates Triton kernels for GPU tensors (it raises ``TritonMissing``)."""
    if "triton" in facts.modules or name == "native":
        return None
    if name == "triton":
        return "Triton is not importable"
    if facts.platform != "cpu":  # on a CPU Inductor generates C++
        return "Triton is not importable (torch.compile needs it on a GPU)"
    return None


def _check_rotary_name(name: str | None) -> None:
    if name is not None and name not in ROTARY_IMPLS:
        raise ValueError(f"{ENV_NAMES['rotary']} = {name!r} is not one of {', '.join(ROTARY_IMPLS)}")


def _fused_ops(facts: Facts, settings: Settings, profile: TunedProfile | None) -> Choice:
    if facts.platform == "cpu":
        return Choice(False, "no GPU: plain torch ops")
    if not settings.fused_ops:
        return Choice(False, f"{ENV_NAMES['fused_ops']}=0")
    if "triton" not in facts.modules:
        return Choice(False, "Triton is not importable")
    timed = profile.fused_ops_ms if profile is not None else {}
    if "fused" in timed and "plain" in timed:
        return Choice(timed["fused"] <= timed["plain"], f"tuned with {profile.preset}: {_timings(timed)}")
    return Choice(True, f"default on {facts.platform}")


def _gelu_epilogue(facts: Facts, fused: bool) -> Choice:
    if facts.platform != "cuda":
        why = "emulated ROCm" if facts.emulated_on else facts.platform
        return Choice(False, f"{why}: cuBLASLt's GELU epilogue is NVIDIA's; hipBLASLt's has not been run")
    if not fused:
        return Choice(False, "fused ops are off")
    if not facts.gelu_epilogue_op:
        return Choice(False, "this torch has no torch._addmm_activation")
    return Choice(True, "CUDA: fc1 and its tanh-GELU in one cuBLASLt GEMM")


def _side_stream(facts: Facts) -> Choice:
    if facts.platform == "cuda":
        return Choice(True, "CUDA: deepstack mergers overlap the blocks on a second stream (measured on an H200)")
    return Choice(False, f"{facts.platform}: deepstack mergers run inline (the overlap was measured only on CUDA)")


def _graph_cost(profile: TunedProfile | None) -> Choice:
    """What a replay saves on a call, per layout, for a tower of the profile's preset's depth."""
    if profile is not None and profile.graphs:
        blocks = preset(profile.preset).depth
        fitted = fit_cost_model([(t.patches, t.eager_ms, t.graph_ms) for t in profile.graphs], blocks)
        if fitted is not None:
            reason = f"tuned: fitted to {profile.preset}'s eager and graph timings; launch time measured while serving"
            return Choice(fitted, reason)
    return Choice(CostModel(), "default: Qwen3-VL-8B replays on an H200; launch time measured while serving")


def _cost_report(model: CostModel) -> dict[str, float]:
    """The model's terms (``CostModel(**terms)`` rebuilds it) and two replays to read at a glance."""
    return {
        **dataclasses.asdict(model),
        "replay_ms_1x1024": round(model.replay_ms([1024]), 2),
        "replay_ms_6x880": round(model.replay_ms([880] * 6), 2),
        "payback_ms": round(PAYBACK_SHARE * model.capture_ms, 1),  # a layout's savings before its capture
    }


def _json_waves(waves: float | None) -> float | str | None:
    """``doctor --json`` stays strict JSON: a crossover never reached is "never", not Infinity."""
    return "never" if waves is not None and math.isinf(waves) else waves


def _gluon_consumers(profile: TunedProfile | None) -> Choice:
    if profile is not None and profile.three_consumer_waves is not None:
        waves = profile.three_consumer_waves
        where = "nowhere it was measured" if math.isinf(waves) else f"from {waves:g} waves of programs"
        return Choice(waves, f"tuned: gluon_attn's three consumer warpgroups won {where} ({profile.preset})")
    return Choice(None, "default: gluon_attn's own rule (THREE_CONSUMER_WAVES, measured on an H200)")


def _cuda_capability(arch: str) -> tuple[int, int] | None:
    """``"sm_90"`` -> ``(9, 0)``, ``"sm_100"`` -> ``(10, 0)``: the arch string platform_info read off the GPU."""
    digits = arch.removeprefix("sm_")
    if len(digits) < 2 or not digits.isdigit():
        return None
    return int(digits[:-1]), int(digits[-1])


def _layout_features(seq_lens: Sequence[int]) -> tuple[float, float, float, float]:
    lengths = [max(1, operator.index(n)) for n in seq_lens] or [1]
    aligned = float(max(lengths) % ALIGNMENT_TOKENS == 0)
    return math.log2(max(lengths)), math.log2(min(lengths)), math.log2(len(lengths)), aligned


def _distance(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    return sum(abs(x - y) for x, y in zip(a, b, strict=True))


def _timings(ms: Mapping[str, float]) -> str:
    return ", ".join(f"{name} {value:.4g} ms" for name, value in sorted(ms.items(), key=lambda item: item[1]))


def _module_available(name: str) -> bool:
    """Whether ``name`` can be imported, found without importing it (aiter's import is heavy)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        # A parent package that fails to import, or a module put in sys.modules without a spec.
        return sys.modules.get(name) is not None
