"""The policy as tables over ``resolve_policy``, tuned profiles on disk, and ``rocm-vit tune`` on a CPU."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from pathlib import Path

import pytest
import torch

import rocm_vit.policy as policy
from rocm_vit.attention import BACKENDS, AutoAttention, SdpaAttention, TritonAttention, get_backend
from rocm_vit.backend_requirements import ANY_PLATFORM, REQUIREMENTS
from rocm_vit.cli.main import main
from rocm_vit.layout import VisionLayout
from rocm_vit.platform import Facts, PlatformInfo
from rocm_vit.policy import resolve_policy
from rocm_vit.profile import (
    AttentionTiming,
    ConsumerTiming,
    GraphTiming,
    TunedProfile,
    default_profile_path,
    load_profile,
    profile_key,
    read_profile,
    write_profile,
)
from rocm_vit.settings import Settings

GPU_MODULES = frozenset({"triton", "torch.nn.attention.varlen"})
CUDA = Facts("cuda", "sm_90", "NVIDIA H200", modules=GPU_MODULES)
ROCM = Facts("rocm", "gfx950", "AMD Instinct MI355X", modules=frozenset({"triton", "aiter"}))
EMULATED = dataclasses.replace(ROCM, device_name="NVIDIA H200", emulated_on="sm_90")
CPU = Facts("cpu")
AITER_ON = Settings(use_aiter=True)


@pytest.mark.parametrize(
    ("facts", "settings", "expected"),
    [
        (CPU, Settings(), ("sdpa", "native", False, False, False)),
        (CUDA, Settings(), ("auto", "triton", True, True, True)),
        (dataclasses.replace(CUDA, modules=frozenset()), Settings(), ("auto", "native", False, False, True)),
        (ROCM, AITER_ON, ("aiter_attn", "triton", True, False, False)),
        (ROCM, Settings(), ("triton_attn", "triton", True, False, False)),
        (dataclasses.replace(ROCM, modules=frozenset()), AITER_ON, ("sdpa", "native", False, False, False)),
        (EMULATED, AITER_ON, ("aiter_attn", "triton", True, False, False)),
        (CUDA, Settings(rotary="native", fused_ops=False), ("auto", "native", False, False, True)),
        (
            ROCM,
            Settings(attention_backend="sdpa"),
            ("sdpa", "triton", True, False, False),
        ),
    ],
    ids=[
        "cpu",
        "cuda",
        "cuda-no-triton",
        "rocm-aiter",
        "rocm-aiter-off",
        "rocm-bare",
        "emulated",
        "cuda-env",
        "rocm-env",
    ],
)
def test_defaults_per_platform_and_settings(facts, settings, expected):
    resolved = resolve_policy(facts, settings)
    assert (
        resolved.attention.backend,
        resolved.rotary.value,
        resolved.fused_ops.value,
        resolved.gelu_epilogue.value,
        resolved.side_stream.value,
    ) == expected
    for choice in (resolved.rotary, resolved.fused_ops, resolved.gelu_epilogue, resolved.side_stream):
        assert choice.reason  # every choice says why


# The attention decisions over a table of machines, settings, profiles and head dims: the backend the
# policy names, the kernel each layout gets (one 224² image, four 1024-token segments, a 1080p
# screenshot, a 1600x2048 photo) and what serves a caller that names aiter (SGLang's aiter_attn slot).
LAYOUTS = ((196,), (1024,) * 4, (8160,), (12800,))
HOPPER = frozenset({*GPU_MODULES, "triton.experimental.gluon"})
H200_FA4 = Facts("cuda", "sm_90", "NVIDIA H200", modules=HOPPER | {"flash_attn.cute"}, capability=(9, 0))
H200_GLUON = Facts("cuda", "sm_90", "NVIDIA H200", modules=HOPPER, capability=(9, 0))
H200_NO_TRITON = dataclasses.replace(H200_GLUON, modules=frozenset({"torch.nn.attention.varlen"}))
B200_FA4 = Facts("cuda", "sm_100", "NVIDIA B200", modules=HOPPER | {"flash_attn.cute"}, capability=(10, 0))
B200_GLUON = Facts("cuda", "sm_100", "NVIDIA B200", modules=HOPPER, capability=(10, 0))
A100 = Facts("cuda", "sm_80", "NVIDIA A100", modules=HOPPER | {"flash_attn.cute"}, capability=(8, 0))
MI300X = Facts("rocm", "gfx942", "AMD Instinct MI300X", modules=frozenset({"triton", "aiter"}))
MI355X_NO_AITER = dataclasses.replace(ROCM, modules=frozenset({"triton"}))
MI355X_BARE = dataclasses.replace(ROCM, modules=frozenset())
MI355X_VARLEN = dataclasses.replace(ROCM, modules=GPU_MODULES)
NAMED_SDPA = Settings(attention_backend="sdpa", use_aiter=True)
T, AITER, PAD, SDPA, GLUON, FA4 = "triton_attn", "aiter_attn", "aiter_attn_pad128", "sdpa", "gluon_attn", "fa4"


def _cuda_tuned() -> TunedProfile:
    return _profile(
        attention=(
            AttentionTiming("1x196", (196,), {"sdpa": 0.006, "triton_attn": 0.008, "gluon_attn": 0.005}, 72),
            AttentionTiming("4x1024", (1024,) * 4, {"sdpa": 0.0647, "triton_attn": 0.0659}, 72),
            AttentionTiming("1x8160", (8160,), {"sdpa": 0.96, "triton_attn": 0.91, "gluon_attn": 0.7}, 72),
            AttentionTiming("1x4096", (4096,), {"sdpa": 0.20, "triton_attn": 0.19}, 128),
        )
    )


def _rocm_tuned() -> TunedProfile:
    return _profile(
        attention=(
            AttentionTiming("1x196", (196,), {"sdpa": 0.01, "triton_attn": 0.008, "aiter_attn": 0.009}, 72),
            AttentionTiming("4x1024", (1024,) * 4, {"sdpa": 0.2, "triton_attn": 0.1, "aiter_attn": 0.05}, 72),
            AttentionTiming("1x8160", (8160,), {"triton_attn": 1.2, "aiter_attn": 0.8, "aiter_attn_pad128": 0.7}, 72),
        )
    )


DECISIONS = {
    # id: (facts, settings, profile, head dim) -> (policy backend, kernel per layout of LAYOUTS, for_aiter)
    "h200-fa4": ((H200_FA4, Settings(), None, 72), ("auto", (T, SDPA, FA4, FA4), AITER)),
    "h200-gluon-d64": ((H200_GLUON, Settings(), None, 64), ("auto", (T, SDPA, GLUON, GLUON), AITER)),
    "h200-gluon-d72": ((H200_GLUON, Settings(), None, 72), ("auto", (T, SDPA, GLUON, GLUON), AITER)),
    "h200-gluon-d80": ((H200_GLUON, Settings(), None, 80), ("auto", (T, SDPA, GLUON, GLUON), AITER)),
    "h200-gluon-d128": ((H200_GLUON, Settings(), None, 128), ("auto", (T, SDPA, T, SDPA), AITER)),
    "h200-gluon-tuned-d72": ((H200_GLUON, Settings(), "cuda", 72), ("auto", (GLUON, SDPA, GLUON, GLUON), AITER)),
    "h200-gluon-tuned-d80": ((H200_GLUON, Settings(), "cuda", 80), ("auto", (T, SDPA, GLUON, GLUON), AITER)),
    "h200-gluon-tuned-d128": ((H200_GLUON, Settings(), "cuda", 128), ("auto", (T, T, T, T), AITER)),
    "h200-no-triton": ((H200_NO_TRITON, Settings(), None, 72), ("auto", ("torch_varlen", SDPA, SDPA, SDPA), AITER)),
    "b200-fa4": ((B200_FA4, Settings(), None, 72), ("auto", (T, SDPA, FA4, FA4), AITER)),
    "b200-gluon": ((B200_GLUON, Settings(), None, 72), ("auto", (T, SDPA, T, SDPA), AITER)),
    "a100": ((A100, Settings(), None, 72), ("auto", (T, SDPA, T, SDPA), AITER)),
    "mi355x-aiter-d72": ((ROCM, AITER_ON, None, 72), (AITER, (AITER,) * 4, AITER)),
    "mi355x-aiter-d128": ((ROCM, AITER_ON, None, 128), (AITER, (AITER,) * 4, AITER)),
    "mi355x-aiter-off": ((ROCM, Settings(), None, 72), (T, (T,) * 4, AITER)),
    "mi355x-no-aiter": ((MI355X_NO_AITER, AITER_ON, None, 72), (T, (T,) * 4, AITER)),
    "mi355x-bare": ((MI355X_BARE, AITER_ON, None, 72), (SDPA, (SDPA,) * 4, AITER)),
    "mi300x-aiter": ((MI300X, AITER_ON, None, 80), (AITER, (AITER,) * 4, AITER)),
    "mi355x-aiter-tuned-d72": ((ROCM, AITER_ON, "rocm", 72), ("auto", (T, AITER, PAD, PAD), "auto")),
    "mi355x-aiter-tuned-d64": ((ROCM, AITER_ON, "rocm", 64), ("auto", (AITER,) * 4, "auto")),
    "mi355x-aiter-off-tuned": ((ROCM, Settings(), "rocm", 72), ("auto", (T,) * 4, "auto")),
    "mi355x-no-aiter-tuned": ((MI355X_NO_AITER, AITER_ON, "rocm", 72), ("auto", (T,) * 4, "auto")),
    "emulated-aiter": ((EMULATED, AITER_ON, None, 72), (AITER, (AITER,) * 4, AITER)),
    "emulated-aiter-tuned": ((EMULATED, AITER_ON, "rocm", 72), ("auto", (T, AITER, PAD, PAD), "auto")),
    "mi355x-named-sdpa": ((ROCM, NAMED_SDPA, "rocm", 72), (SDPA, (SDPA,) * 4, AITER)),
    "cpu": ((CPU, AITER_ON, None, 72), (SDPA, (SDPA,) * 4, AITER)),
    "cpu-tuned": ((CPU, AITER_ON, "rocm", 72), (SDPA, (SDPA,) * 4, AITER)),
}


@pytest.mark.parametrize(("inputs", "expected"), DECISIONS.values(), ids=DECISIONS.keys())
def test_attention_decisions_over_machines_settings_profiles_and_head_dims(inputs, expected):
    facts, settings, profile, head_dim = inputs
    profile = {"cuda": _cuda_tuned, "rocm": _rocm_tuned, None: lambda: None}[profile]()
    attention = resolve_policy(facts, settings, profile).attention
    picks = tuple(attention.pick(seq_lens, head_dim)[0] for seq_lens in LAYOUTS)
    assert (attention.backend, picks, attention.for_aiter.value) == expected


def test_every_attention_backend_declares_what_it_needs():
    assert set(BACKENDS) == set(REQUIREMENTS)
    declared = {module for needs in REQUIREMENTS.values() for module in needs.modules}
    assert set(policy.PROBED_MODULES) == declared | {"triton"}  # Triton also decides rotary and fused ops


def test_gluon_attn_declares_the_head_dims_its_kernel_takes():
    pytest.importorskip("triton.experimental.gluon", reason="Triton without Gluon")
    from rocm_vit.backends import gluon_attn

    assert REQUIREMENTS["gluon_attn"].head_dims == gluon_attn.GLUON_HEAD_DIMS
    why = policy.backend_unavailable_reason("gluon_attn", H200_GLUON, head_dim=128)
    assert why == "gluon_attn takes head dims 64, 72, 80, not 128"
    assert policy.backend_unavailable_reason("gluon_attn", H200_GLUON, head_dim=72) is None


@pytest.mark.parametrize(
    ("name", "facts", "undeclared", "refusal"),
    [
        ("gluon_attn", A100, {"min_capability": None}, "Hopper's (wgmma and TMA, sm_90); this GPU is sm_80"),
        ("gluon_attn", B200_GLUON, {"max_capability": None}, "Hopper's (wgmma and TMA, sm_90); this GPU is sm_100"),
        ("fa4", A100, {"min_capability": None}, "fa4 is used from sm_90 (Hopper) on; this GPU is sm_80"),
        ("aiter_attn", MI355X_NO_AITER, {"modules": {}}, "pip install rocm-vit[aiter]"),
        ("torch_varlen", MI355X_VARLEN, {"platforms": ANY_PLATFORM}, "an NVIDIA GPU (CUDA); this machine is rocm"),
        ("triton_attn", Facts("cpu", modules=GPU_MODULES), {"cpu_needs_interpreter": False}, "a CUDA or ROCm"),
    ],
)
def test_a_backends_declaration_is_what_refuses_it(monkeypatch, name, facts, undeclared, refusal):
    assert refusal in policy.backend_unavailable_reason(name, facts)
    monkeypatch.setitem(REQUIREMENTS, name, dataclasses.replace(REQUIREMENTS[name], **undeclared))
    assert policy.backend_unavailable_reason(name, facts) is None


def test_the_policy_chooses_among_what_the_declarations_let_run(monkeypatch):
    long = (12800,)
    assert resolve_policy(A100, Settings()).attention.pick(long, 128)[0] == "sdpa"
    assert resolve_policy(MI355X_NO_AITER, AITER_ON).attention.backend == "triton_attn"
    # Declared runnable anywhere: the CUDA rule's long kernel on an A100 at head dim 128, aiter without aiter.
    gluon, aiter = REQUIREMENTS["gluon_attn"], REQUIREMENTS["aiter_attn"]
    monkeypatch.setitem(REQUIREMENTS, "gluon_attn", dataclasses.replace(gluon, min_capability=None, head_dims=None))
    monkeypatch.setitem(REQUIREMENTS, "aiter_attn", dataclasses.replace(aiter, modules={}))
    assert resolve_policy(A100, Settings()).attention.pick(long, 128)[0] == "gluon_attn"
    assert resolve_policy(MI355X_NO_AITER, AITER_ON).attention.backend == "aiter_attn"


def test_reasons_name_what_decided():
    assert resolve_policy(ROCM, Settings()).attention.reason.startswith("ROCm and SGLANG_USE_AITER is off")
    assert "emulated ROCm" in resolve_policy(EMULATED, AITER_ON).gelu_epilogue.reason
    bare = resolve_policy(dataclasses.replace(CUDA, modules=frozenset()), Settings())
    assert "Triton is not importable" in bare.rotary.reason and "torch_varlen" not in bare.attention.reason
    # The CUDA rule's reason says when cuDNN is kept: whole tiles only matter against triton_attn.
    assert "whole 128-token tiles, else triton_attn" in resolve_policy(CUDA, Settings()).attention.reason
    assert "tiles" not in bare.attention.reason


@pytest.mark.parametrize("facts", [ROCM, CUDA], ids=["on-rocm", "on-cuda"])
@pytest.mark.parametrize("setting", [None, "triton", "compiled"])
def test_without_triton_a_gpu_rotary_is_the_native_helper_and_says_why(facts, setting):
    """torch.compile's Inductor generates Triton kernels for GPU tensors (TritonMissing without it): a
    compiled rotary there would trace, fail and serve the native helper at every new call pattern."""
    bare = resolve_policy(dataclasses.replace(facts, modules=frozenset()), Settings(rotary=setting))
    assert bare.rotary.value == "native"
    assert "Triton is not importable" in bare.rotary.reason
    timed = _profile(rotary_ms={"compiled": 0.01, "native": 0.05})
    assert resolve_policy(dataclasses.replace(facts, modules=frozenset()), Settings(), timed).rotary.value == "native"


def test_on_a_cpu_the_compiled_rotary_needs_no_triton():
    """Inductor generates C++ for CPU tensors (the CPU tests of the compiled helper run so)."""
    assert resolve_policy(CPU, Settings(rotary="compiled")).rotary.value == "compiled"


@pytest.mark.parametrize(
    ("facts", "settings", "implementation", "why", "bit_for_bit"),
    [
        (ROCM, Settings(), "triton", "default on rocm: the Triton kernel, one launch", True),
        (ROCM, Settings(rotary="compiled"), "compiled", "ROCM_VIT_ROTARY=compiled", False),
        (dataclasses.replace(ROCM, modules=frozenset()), Settings(), "native", "default on rocm: the Triton", True),
        (CPU, Settings(), "native", "default on cpu: the native helper", True),
    ],
    ids=["rocm-default", "rocm-compiled", "rocm-without-triton", "cpu-default"],
)
def test_doctor_says_which_rotary_runs_why_and_how_it_rounds(facts, settings, implementation, why, bit_for_bit):
    rotary = resolve_policy(facts, settings).report()["rotary"]
    assert rotary["implementation"] == implementation and rotary["why"].startswith(why)
    assert rotary["rounding"].startswith("as transformers, bit for bit") == bit_for_bit


def test_unknown_rotary_setting_names_the_variable():
    with pytest.raises(ValueError, match=r"ROCM_VIT_ROTARY = 'fast' is not one of triton, compiled, native"):
        resolve_policy(CUDA, Settings(rotary="fast"))


# ---------------------------------------------------------------------------------------------
# Tuned profiles


def _profile(**overrides) -> TunedProfile:
    values = {
        "key": {"device": "NVIDIA H200"},
        "preset": "qwen3-vl-8b",
        "created": "2026-11-30T00:00:00Z",
        "attention": (
            AttentionTiming("1x196", (196,), {"sdpa": 0.006, "triton_attn": 0.008, "fa4": 0.004}, 72),
            AttentionTiming("1x4096", (4096,), {"sdpa": 0.20, "triton_attn": 0.25, "torch_varlen": 0.30}, 72),
            AttentionTiming("4x1024", (1024,) * 4, {"sdpa": 0.0647, "triton_attn": 0.0659}, 72),
            AttentionTiming("1x8160", (8160,), {"sdpa": 0.96, "triton_attn": 0.91}, 72),
            AttentionTiming("1x8192", (8192,), {"sdpa": 0.89, "triton_attn": 0.95}, 72),
            AttentionTiming("16x256", (256,) * 16, {"sdpa": 1.0, "triton_attn": 0.2, "torch_varlen": 0.1}, 72),
        ),
        "rotary_ms": {"triton": 0.02, "compiled": 0.01, "native": 0.05},
        "fused_ops_ms": {"fused": 10.0, "plain": 9.0},
        "graphs": (GraphTiming(196, 10.0, 1.5), GraphTiming(2048, 12.0, 9.0), GraphTiming(4096, 15.0, 14.9)),
        "gluon_consumers": (
            ConsumerTiming("1x2048", 1.333, 0.0577, 0.061),
            ConsumerTiming("1x2560", 1.697, 0.0923, 0.0848),
        ),
        "three_consumer_waves": 1.515,
    }
    return TunedProfile(**{**values, **overrides})


@pytest.mark.parametrize(
    ("seq_lens", "expected", "why"),
    [
        ((196,), "sdpa", "nearest measured layout 1x196"),  # fa4 was fastest, but it is not installed
        ((256,), "sdpa", "nearest measured layout 1x196"),
        ((4096,), "sdpa", "the default sdpa is within 3%"),
        ((8000,), "triton_attn", "the default triton_attn is within 3%"),  # a partial tile: so does the rule
        ((8192,), "sdpa", "the default sdpa is within 3%"),
        ((256,) * 12, "torch_varlen", "nearest measured layout 16x256"),
        ((784,) * 4, "triton_attn", "at 4x1024 the default triton_attn is within 3%"),  # 2 % is noise
    ],
)
def test_tuned_attention_picks_the_fastest_available_at_the_nearest_measured_layout(seq_lens, expected, why):
    resolved = resolve_policy(CUDA, Settings(), _profile())
    assert resolved.attention.backend == "auto"
    name, reason = resolved.attention.pick(seq_lens, head_dim=72)
    assert (name, why in reason, reason.startswith("tuned: ")) == (expected, True, True)


@pytest.mark.parametrize(("default_slower_by", "expected"), [(0.025, "sdpa"), (0.035, "triton_attn")])
def test_a_tuned_pick_replaces_the_default_only_when_the_default_is_over_3_percent_slower(default_slower_by, expected):
    """The margin is what separates noise between runs from a measured win: 2.5 % keeps the rule's
    sdpa at 1x4096, 3.5 % hands it to the faster triton_attn."""
    timing = AttentionTiming("1x4096", (4096,), {"sdpa": 0.2 * (1 + default_slower_by), "triton_attn": 0.2}, 72)
    resolved = resolve_policy(CUDA, Settings(), _profile(attention=(timing,)))
    assert resolved.attention.pick((4096,), head_dim=72)[0] == expected


def test_tuned_attention_falls_back_to_the_rule_for_other_head_dims():
    resolved = resolve_policy(CUDA, Settings(), _profile())
    name, why = resolved.attention.pick((256,) * 16, head_dim=80)
    assert name == "triton_attn" and "head dim 80 not tuned" in why  # the CUDA rule's varlen choice


def test_each_head_dim_is_picked_from_its_own_timings():
    timings = (
        AttentionTiming("1x4096", (4096,), {"sdpa": 0.20, "triton_attn": 0.25}, 72),
        AttentionTiming("1x4096", (4096,), {"sdpa": 0.30, "triton_attn": 0.25}, 80),
    )
    resolved = resolve_policy(CUDA, Settings(), _profile(attention=timings))
    assert [resolved.attention.pick((4096,), d)[0] for d in (72, 80)] == ["sdpa", "triton_attn"]
    name, why = resolved.attention.pick((4096,), 64)
    assert name == "sdpa" and "head dim 64 not tuned (the profile measured 72, 80)" in why


def test_tuned_aiter_needs_sglang_use_aiter():
    timings = (
        AttentionTiming("1x4096", (4096,), {"aiter_attn_pad128": 0.1, "aiter_attn": 0.2, "triton_attn": 0.3}, 72),
    )
    profile = _profile(attention=timings)
    assert resolve_policy(ROCM, AITER_ON, profile).attention.pick((4096,), 72)[0] == "aiter_attn_pad128"
    assert resolve_policy(ROCM, Settings(), profile).attention.pick((4096,), 72)[0] == "triton_attn"


def test_tuned_rotary_fused_ops_and_cost_model_and_settings_still_win():
    tuned = resolve_policy(CUDA, Settings(), _profile())
    assert (tuned.rotary.value, tuned.fused_ops.value) == ("compiled", False)
    assert tuned.graph_cost.reason.startswith("tuned")
    # The smallest call's 10.0 ms eager, less the soft maximum's share of its 1.4 ms on the device.
    assert tuned.graph_cost.value.launch_ms == pytest.approx((10.0**3 - 1.4**3) ** (1 / 3))
    # Replays of 1.5, 9.0 and 14.9 ms bend down: the attention term would be negative, so it is 0.
    model = tuned.graph_cost.value
    assert model.device_ms_per_square == 0 and model.device_ms_per_token > 0
    assert [round(model.replay_ms([patches])) for patches in (196, 2048, 4096)] == [2, 8, 15]
    assert not tuned.gelu_epilogue.value  # follows the fused ops
    assert "tuned" in tuned.rotary.reason and "plain 9 ms" in tuned.fused_ops.reason
    pinned = resolve_policy(CUDA, Settings(rotary="triton", attention_backend="sdpa"), _profile())
    assert (pinned.attention.backend, pinned.rotary.value) == ("sdpa", "triton")


def test_auto_attention_follows_the_tuned_policy(fake_platform):
    fake_platform("cuda", "NVIDIA H200", "sm_90")
    with policy.use_policy(resolve_policy(CUDA, Settings(), _profile())):
        backend = get_backend(head_dim=72)
        assert isinstance(backend, AutoAttention)
        picks = {
            name: type(backend.runner_args(VisionLayout.from_grid_thw(grid, 1), torch.zeros(len(grid) + 1)).backend)
            for name, grid in {"one": [(1, 64, 64)], "many": [(1, 16, 16)] * 16}.items()
        }
    assert picks["one"] is SdpaAttention and picks["many"].name == "torch_varlen"  # 1x4096, 16x256
    assert type(get_backend("triton_attn")) is TritonAttention  # an explicit name still wins


def test_profile_round_trip(tmp_path):
    for profile in (
        _profile(),
        _profile(three_consumer_waves=math.inf),
        _profile(gluon_consumers=(), three_consumer_waves=None),
    ):
        path = tmp_path / "profile.yaml"
        write_profile(profile, path)
        assert read_profile(path) == dataclasses.replace(profile, path=str(path))
    # A profile written before the cost model carries a tuned ceiling: still read, the ceiling ignored.
    path.write_text(path.read_text() + "graph_max_tokens: 2048\n")
    assert read_profile(path) == dataclasses.replace(profile, path=str(path))


def test_gluon_consumers_follow_the_tuned_crossover_else_the_kernels_rule():
    tuned = resolve_policy(CUDA, Settings(), _profile()).gluon_consumers
    assert tuned.value == 1.515 and "tuned" in tuned.reason and "from 1.515 waves" in tuned.reason
    never = resolve_policy(CUDA, Settings(), _profile(three_consumer_waves=math.inf)).gluon_consumers
    assert never.value == math.inf and "nowhere" in never.reason
    report = resolve_policy(CUDA, Settings(), _profile(three_consumer_waves=math.inf)).report()
    assert json.loads(json.dumps(report["gluon_consumers"], allow_nan=False))["three_from_waves"] == "never"
    default = resolve_policy(CUDA, Settings(), _profile(three_consumer_waves=None)).gluon_consumers
    assert default.value is None and default.reason.startswith("default")
    assert resolve_policy(CUDA, Settings()).gluon_consumers.value is None


def test_gluon_attention_runs_with_the_policys_crossover(monkeypatch):
    from rocm_vit.backends import gluon_attn

    from rocm_vit.attention import GluonAttention

    calls = []
    monkeypatch.setattr(gluon_attn, "gluon_varlen_attention", lambda *args, **kwargs: calls.append(kwargs))
    layout = VisionLayout.from_grid_thw([(1, 4, 4)], 1)
    q = k = v = torch.zeros(16, 2, 64)
    for profile, expected in ((_profile(), 1.515), (None, None)):
        with policy.use_policy(resolve_policy(CUDA, Settings(), profile)):
            backend = GluonAttention()
        backend(q, k, v, backend.runner_args(layout, layout.cu_seqlens_tensor("cpu")), 0.125)
        assert calls.pop() == {"three_consumer_waves": expected}


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        # The H200's d72 crossover (docs/benchmarks.md, "`rocm-vit tune`"): three lose at 1.33 waves, win from 1.70.
        ([(0.727, 19.5, 23.2), (1.09, 49.2, 48.6), (1.333, 57.6, 61.0), (1.697, 92.3, 84.8), (5.21, 761, 684)], 1.515),
        ([(5.0, 761, 684), (1.0, 19.5, 23.2)], 3.0),  # unsorted in, sorted by waves
        ([(1.0, 10.0, 9.0), (2.0, 10.0, 9.0)], 1.0),  # won everywhere: from the smallest measured
        ([(1.0, 10.0, 9.0), (2.0, 10.0, 11.0)], math.inf),  # lost at the largest
        ([(1.0, 10.0, 9.0), (2.0, 10.0, 10.1)], 1.0),  # a 1 % loss at the largest is a tie
        ([(1.0, 10.0, 10.1), (2.0, 10.0, 9.0)], 1.5),  # the run starts where three won, not at a tie
        ([], None),
    ],
)
def test_tune_puts_the_three_consumer_crossover_halfway_after_the_last_loss(rows, expected):
    from rocm_vit.cli.tune import three_consumer_waves

    timings = [ConsumerTiming(f"row{i}", waves, two, three) for i, (waves, two, three) in enumerate(rows)]
    assert three_consumer_waves(timings) == expected


@pytest.fixture
def h200(fake_platform) -> PlatformInfo:
    return fake_platform("cuda", "NVIDIA H200", "sm_90")


def test_a_matching_profile_is_in_force_and_doctor_shows_it(h200, tmp_path, monkeypatch, capsys):
    path = tmp_path / "h200.yaml"
    write_profile(_profile(key=profile_key(h200)), path)
    monkeypatch.setenv("ROCM_VIT_PROFILE", str(path))
    resolved = policy.current_policy()
    assert resolved.profile.value is not None and resolved.graph_cost.reason.startswith("tuned")
    assert main(["doctor", "--json"]) in (0, 1)
    assert str(path) in capsys.readouterr().out


def test_doctor_says_which_kernel_a_1080p_image_gets_on_an_mi355x_with_aiter_and_why():
    from rocm_vit.cli.doctor import collect

    with policy.use_policy(resolve_policy(ROCM, AITER_ON)):
        report = collect()
    attention = report["policy"]["attention"]
    assert attention["per_layout"]["1x8160 (a 1080p screenshot)"] == "aiter_attn: aiter_attn for every layout"
    assert attention["backend"] == "aiter_attn"
    assert attention["why"] == "ROCm with aiter installed and SGLANG_USE_AITER=1"
    assert attention["for_aiter"]["backend"] == "aiter_attn"  # SGLang's aiter_attn slot runs the same
    assert attention["can_run"]["aiter_attn"] == "yes" and attention["can_run"]["triton_attn"] == "yes"
    assert attention["can_run"]["gluon_attn"].startswith("no: gluon_attn needs an NVIDIA Hopper GPU")
    assert not any(problem.startswith("policy") for problem in report["problems"])


def test_a_profile_from_other_versions_is_ignored_with_one_warning(h200, tmp_path, caplog):
    path = tmp_path / "old.yaml"
    write_profile(_profile(key={**profile_key(h200), "torch": "2.0.0"}), path)
    with caplog.at_level(logging.WARNING, logger="rocm_vit.profile"):
        for _ in range(3):
            profile, status = load_profile(h200, {"ROCM_VIT_PROFILE": str(path)})
            assert profile is None and "measured with torch '2.0.0'" in status
    assert sum("is ignored" in record.getMessage() for record in caplog.records) == 1


def test_profile_location_rules(h200, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert default_profile_path(h200) == tmp_path / "rocm-vit" / "profiles" / "nvidia-h200-sm-90.yaml"
    emulated = dataclasses.replace(h200, name="rocm", arch="gfx950", emulated_on="sm_90")
    assert default_profile_path(emulated).name == "nvidia-h200-gfx950-on-sm-90.yaml"
    assert load_profile(h200, {})[0] is None  # never tuned: the defaults, no error
    assert "ROCM_VIT_PROFILE=off" in load_profile(h200, {"ROCM_VIT_PROFILE": "off"})[1]
    with pytest.raises(ValueError, match="does not exist"):
        load_profile(h200, {"ROCM_VIT_PROFILE": str(tmp_path / "missing.yaml")})
    (tmp_path / "bad.yaml").write_text("format: 1\nkey: [1, 2]\n")
    with pytest.raises(ValueError, match="not a usable rocm-vit profile"):
        load_profile(h200, {"ROCM_VIT_PROFILE": str(tmp_path / "bad.yaml")})


def test_tune_on_a_cpu_writes_a_profile_the_policy_reads(tmp_path: Path, capsys):
    out = tmp_path / "tuned.yaml"
    assert main(["tune", "--preset", "tiny", "--out", str(out), "--repeats", "1", "--head-dims", "64,32"]) == 0
    report = capsys.readouterr().out
    assert f"profile written to {out}" in report
    profile = read_profile(out)
    assert profile.preset == "tiny" and profile.head_dims == (32, 64)
    names = [(timing.head_dim, timing.name) for timing in profile.attention]
    assert names == [(64, "1x196"), (64, "4x196"), (64, "1x576"), (32, "1x196"), (32, "4x196"), (32, "1x576")]
    assert all(set(timing.ms) == {"sdpa"} and timing.ms["sdpa"] > 0 for timing in profile.attention)
    assert profile.rotary_ms == {} and profile.graphs == ()  # one rotary on a CPU: nothing to pick
    assert profile.gluon_consumers == () and profile.three_consumer_waves is None  # no Hopper GPU
    tuned = resolve_policy(dataclasses.replace(CUDA, modules=frozenset()), Settings(), profile)
    assert tuned.attention.pick((196,), 64)[0] == "sdpa"


def test_tune_times_each_rotary_inside_the_tower_and_the_policy_takes_the_faster(monkeypatch):
    """The kernels' own time is not what separates the rotaries: the compiled one's host work and four
    launches a block are. Each is timed as the tower's eager calls and graph replays under a policy
    that names it, where both can run."""
    from rocm_vit.cli import tune

    timed = []

    def eager_and_graph(preset_name, layouts, dtype, device, repeats, eager):
        name = policy.active_policy().rotary.value
        timed.append((name, layouts, eager))
        ms = {"triton": 3.0, "compiled": 1.0}[name]
        return (GraphTiming(196, ms, ms / 2), GraphTiming(16384, 10 * ms, 10 * ms))

    monkeypatch.setattr(tune, "_eager_and_graph", eager_and_graph)
    cuda = torch.device("cuda")
    rotary_ms = tune._tune_rotary(ROCM, Settings(), _profile(), "qwen3-vl-8b", torch.bfloat16, cuda, 1)
    assert timed == [("triton", tune.ROTARY_LAYOUTS, True), ("compiled", tune.ROTARY_LAYOUTS, True)]
    assert rotary_ms == {"triton": 64.5, "compiled": 21.5}
    tuned = resolve_policy(ROCM, Settings(), _profile(rotary_ms=rotary_ms))
    assert tuned.rotary.value == "compiled" and tuned.rotary.reason.startswith("tuned")
    bare = dataclasses.replace(ROCM, modules=frozenset())  # native alone: nothing to time
    assert tune._tune_rotary(bare, Settings(), _profile(), "qwen3-vl-8b", torch.bfloat16, cuda, 1) == {}


def test_check_settings_finds_without_a_gpu_what_would_fail_the_policy(tmp_path):
    assert policy.check_settings({"ROCM_VIT_PROFILE": "off"}).rotary is None
    with pytest.raises(ValueError, match="ROCM_VIT_ROTARY = 'fast'"):
        policy.check_settings({"ROCM_VIT_ROTARY": "fast"})
    (tmp_path / "notes.yaml").write_text("just: notes\n")
    with pytest.raises(ValueError, match="not a usable rocm-vit profile"):
        policy.check_settings({"ROCM_VIT_PROFILE": str(tmp_path / "notes.yaml")})
    write_profile(_profile(), tmp_path / "good.yaml")
    policy.check_settings({"ROCM_VIT_PROFILE": str(tmp_path / "good.yaml")})  # another device's key: fine here


def test_a_named_auto_is_the_platforms_own_per_layout_rule(fake_platform):
    """ROCM_VIT_ATTENTION_BACKEND=auto once gave auto a rule naming auto: get_backend() recursed."""
    fake_platform("cuda", "NVIDIA H200", "sm_90")
    named = resolve_policy(CUDA, Settings(attention_backend="auto"))
    assert named.attention.backend == "auto" and "auto" not in named.attention.rule.candidates
    assert named.attention.rule == resolve_policy(CUDA, Settings()).attention.rule
    with policy.use_policy(named):
        backend = get_backend(head_dim=72)
        assert isinstance(backend, AutoAttention)
        picked = backend.runner_args(VisionLayout.from_grid_thw([(1, 64, 64)], 1), torch.zeros(2)).backend
    assert picked.name == "sdpa"
    on_rocm = resolve_policy(ROCM, Settings(attention_backend="auto", use_aiter=True)).attention
    assert (on_rocm.backend, on_rocm.rule.candidates) == ("auto", ("aiter_attn",))


def test_runner_options_take_limits_from_settings_and_the_cost_model_from_the_policy() -> None:
    """One builder for towers and the SGLang adapter: the settings' limits, the policy's cost model
    (scaled to the tower's blocks), padding where the backend takes device offsets."""
    settings = Settings(graph_cache_capacity=7, graph_min_hits=3, graph_memory_budget_mb=100, graph_max_tokens=4096)
    resolved = resolve_policy(CUDA, settings)
    options = policy.runner_options(resolved, settings, 12, takes_device_offsets=True)
    assert (options.capacity, options.min_hits, options.max_tokens, options.budget_bytes) == (7, 3, 4096, 100 << 20)
    assert options.cost_model == resolved.graph_cost.value.for_blocks(12)
    assert options.padding is not None and options.padding.buckets[-1] < 4096
    capped = options.with_max_tokens(1024)
    assert capped.max_tokens == 1024 and capped.padding.buckets[-1] < 1024 and capped.capacity == 7


@pytest.mark.parametrize(
    ("takes_device_offsets", "padded", "by_benefit", "graph_padding", "pads", "has_model"),
    [
        (True, None, True, True, True, True),  # the serving default
        (False, None, True, True, False, True),  # a backend that reads host lengths: exact layouts
        (True, None, True, False, False, True),  # SGLANG_VIT_CUDA_GRAPH_PADDING=0
        (True, None, False, True, False, False),  # bench and verify: every layout, exact
        (True, True, False, True, True, False),  # verify --padded
        (True, False, True, True, False, True),
    ],
)
def test_runner_options_pad_where_asked_and_the_backend_takes_device_offsets(
    takes_device_offsets: bool, padded: bool | None, by_benefit: bool, graph_padding: bool, pads: bool, has_model: bool
) -> None:
    settings = Settings(graph_padding=graph_padding)
    options = policy.runner_options(
        resolve_policy(CUDA, settings),
        settings,
        27,
        takes_device_offsets=takes_device_offsets,
        padded=padded,
        by_benefit=by_benefit,
    )
    assert (options.padding is not None, options.cost_model is not None) == (pads, has_model)


def test_runner_options_without_a_policy_are_the_defaults() -> None:
    """A server whose policy does not resolve (a bad setting, logged) still serves, on the defaults."""
    from rocm_vit.graphs.cost import CostModel

    options = policy.runner_options(None, Settings(), 27, takes_device_offsets=True)
    assert options.max_tokens == 8192 and options.cost_model == CostModel().for_blocks(27)


def test_max_tokens_zero_captures_nothing_and_pads_nothing() -> None:
    """``SGLANG_VIT_CUDA_GRAPH_MAX_TOKENS=0`` is a value the settings take: no call is captured (every
    one is over the guard), no bucket is padded to, and the options still build (doctor prints them)."""
    settings = Settings(graph_max_tokens=0)
    options = policy.runner_options(resolve_policy(CUDA, settings), settings, 27, takes_device_offsets=True)
    assert options.max_tokens == 0 and options.padding is not None and options.padding.buckets == ()
    assert options.report()["max_tokens"] == 0
