"""triton_attn rotating q and k inside its own launch equals triton_rope in place then triton_attn, bit for bit.

The contract (docs/design.md, "Rotary"): a backend's ``attend_rotated`` that rotates inside its launch
gives what ``apply_rotary`` + its kernel give. Kernels run in one interpreted child process
(tests/triton_interpreter.py says why), in fp32 and fp16: the interpreter truncates bf16 casts and its
bf16 matmul is unreliable (tests/gpu/test_fused_rotary_gpu.py checks bf16 on a GPU).
"""

from __future__ import annotations

import itertools
import re
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch
from triton_interpreter import run_interpreted

from rocm_vit.attention import AttentionBackend, AutoAttention, GluonAttention, PickedArgs, TritonAttention, VarlenArgs

_KERNEL_SCRIPT = """
import sys
import torch
from rocm_vit.backends import triton_attn
from rocm_vit.backends.triton_attn import TritonAttnConfig, fuses_rotary, triton_varlen_attention
from rocm_vit.backends.triton_rope import triton_rotary_
cases = torch.load(sys.argv[1])
outputs = {}
for name, case in cases.items():
    config = TritonAttnConfig(*case["config"]) if case["config"] else None
    views = case["views"]

    def attend(qkv, **rotary):
        q, k, v = qkv.split(views, dim=1)
        return triton_varlen_attention(
            q, k, v, case["cu_seqlens"], case["max_seqlen"], case["scale"], config=config, **rotary
        )

    unfused_qkv = case["qkv"].clone()
    q, k, _ = unfused_qkv.split(views, dim=1)
    triton_rotary_(q, k, case["cos"], case["sin"])
    fused_qkv = case["qkv"].clone()
    q, k, _ = fused_qkv.split(views, dim=1)
    outputs[name] = {
        "fuses": fuses_rotary(q, k, case["cos"], case["sin"], case["max_seqlen"]),
        "unfused": attend(unfused_qkv),
        "fused": attend(fused_qkv, cos=case["cos"], sin=case["sin"]),
        "fused_qkv_after": fused_qkv,
    }
torch.save(outputs, sys.argv[2])
"""

SMALL_TILES = (16, 16, 4, 1)  # several query and key tiles per segment, partial last tiles


def _kernel_cases() -> dict[str, dict]:
    generator = torch.Generator().manual_seed(56)
    seq_lens = (37, 1, 16, 20)  # 37 and 20 end in partial tiles, 1 is a single key
    cu_seqlens = torch.tensor([0, *itertools.accumulate(seq_lens)], dtype=torch.int32)
    tokens = sum(seq_lens)

    def case(head_dim: int, dtype: torch.dtype, heads: int = 2, kv_heads: int = 2, config=SMALL_TILES) -> dict:
        # q, k, v as views of one [N, H + 2 KH, D] projection, as the towers pass them.
        qkv = torch.randn(tokens, heads + 2 * kv_heads, head_dim, generator=generator).to(dtype)
        angles = torch.rand(tokens, head_dim // 2, generator=generator) * 40
        angles = torch.cat([angles, angles], dim=-1)
        return {
            "qkv": qkv, "views": (heads, kv_heads, kv_heads), "cos": angles.cos(), "sin": angles.sin(),
            "cu_seqlens": cu_seqlens, "max_seqlen": max(seq_lens), "scale": head_dim**-0.5, "config": config,
        }  # fmt: skip

    return {
        # Qwen-VL's head dim: 64 columns plus a 16-wide tail with 8 masked; a column's partner
        # (c +/- 36) lies across the split.
        "d72_fp16": case(72, torch.float16),
        "d72_fp32_gqa": case(72, torch.float32, heads=4, kv_heads=2),
        "d80_fp16_default_tiles": case(80, torch.float16, config=None),
        "d64_fp32_default_tiles": case(64, torch.float32, config=None),
        "d40_fp16_gqa": case(40, torch.float16, heads=2, kv_heads=1),
    }


@pytest.fixture(scope="module")
def interpreted_kernel(tmp_path_factory) -> dict[str, tuple[dict, dict]]:
    pytest.importorskip("triton")
    cases = _kernel_cases()
    outputs = run_interpreted(_KERNEL_SCRIPT, cases, tmp_path_factory.mktemp("fused_rotary"), {})
    return {name: (cases[name], outputs[name]) for name in cases}


@pytest.mark.parametrize("name", list(_kernel_cases()))
def test_fused_rotary_equals_triton_rope_then_the_kernel_bitwise(interpreted_kernel, name):
    output = interpreted_kernel[name][1]
    assert output["fuses"], "the case must be one the backend would fuse"
    assert output["fused"].dtype == output["unfused"].dtype
    assert torch.equal(output["fused"], output["unfused"]), (
        f"max difference {(output['fused'].double() - output['unfused'].double()).abs().max().item()}"
    )


@pytest.mark.parametrize("name", list(_kernel_cases()))
def test_fused_rotary_leaves_the_qkv_projection_untouched(interpreted_kernel, name):
    case, output = interpreted_kernel[name]
    assert torch.equal(output["fused_qkv_after"], case["qkv"])


# ---------------------------------------------------------------------------------------------
# Which calls fuse: decided on the host, from the policy's rotary, max_seqlen and triton_rope's coverage


@pytest.fixture
def triton_attn():
    return pytest.importorskip("rocm_vit.backends.triton_attn")


@pytest.fixture
def recorded(monkeypatch, triton_attn):
    """A TritonAttention whose kernel wrapper and rotary record their calls; every shape covered."""
    calls = []
    backend = TritonAttention.__new__(TritonAttention)
    backend._arch = None
    backend._attend = lambda q, k, v, offsets, max_seqlen, scale, **rotary: calls.append(("kernel", rotary)) or q
    monkeypatch.setattr("rocm_vit.attention.apply_rotary", lambda *args: calls.append(("apply_rotary", {})))
    monkeypatch.setattr(triton_attn, "triton_rotary_supports", lambda *tensors: True)
    monkeypatch.setenv("ROCM_VIT_ROTARY", "triton")
    _fresh_policy()
    return backend, calls


def _fresh_policy() -> None:
    from rocm_vit.policy import reset_policy

    reset_policy()


def _attend_rotated(backend: AttentionBackend, layer_args) -> None:
    q, k, v = torch.zeros(3, 8, 2, 64).unbind(0)
    cos = sin = torch.zeros(8, 64)
    backend.attend_rotated(q, k, v, layer_args, 0.125, cos, sin)


def _offsets() -> torch.Tensor:
    return torch.tensor([0, 8], dtype=torch.int32)


def test_segments_up_to_the_bound_fuse_into_one_launch(recorded, triton_attn):
    backend, calls = recorded
    _attend_rotated(backend, VarlenArgs(_offsets(), triton_attn.FUSED_ROTARY_MAX_SEQLEN))
    assert [name for name, _ in calls] == ["kernel"]
    assert set(calls[0][1]) == {"cos", "sin"}


@pytest.mark.parametrize("max_seqlen", ["over", None])
def test_longer_or_unknown_segments_take_the_default_two_launches(recorded, triton_attn, max_seqlen):
    backend, calls = recorded
    bound = triton_attn.FUSED_ROTARY_MAX_SEQLEN + 1 if max_seqlen == "over" else None
    _attend_rotated(backend, VarlenArgs(_offsets(), bound))
    assert calls == [("apply_rotary", {}), ("kernel", {})]


def test_shapes_triton_rope_refuses_take_the_default(recorded, triton_attn, monkeypatch):
    backend, calls = recorded
    monkeypatch.setattr(triton_attn, "triton_rotary_supports", lambda *tensors: False)
    _attend_rotated(backend, VarlenArgs(_offsets(), 8))
    assert calls == [("apply_rotary", {}), ("kernel", {})]


@pytest.mark.parametrize("rotary", ["compiled", "native"])
def test_a_rotary_other_than_triton_takes_the_default(recorded, monkeypatch, rotary):
    # The compiled rotary (ROCm's default) may differ from triton_rope in the last bit.
    backend, calls = recorded
    monkeypatch.setenv("ROCM_VIT_ROTARY", rotary)
    _fresh_policy()
    _attend_rotated(backend, VarlenArgs(_offsets(), 8))
    assert calls == [("apply_rotary", {}), ("kernel", {})]


def test_gluon_attn_keeps_the_default(recorded):
    _, calls = recorded
    backend = GluonAttention.__new__(GluonAttention)
    backend._attend = lambda q, k, v, offsets, max_seqlen, scale: calls.append(("kernel", {})) or q
    _attend_rotated(backend, VarlenArgs(_offsets(), 8))
    assert calls == [("apply_rotary", {}), ("kernel", {})]


def test_auto_hands_the_rotary_to_its_pick(recorded):
    backend, calls = recorded
    auto = AutoAttention.__new__(AutoAttention)
    _attend_rotated(auto, PickedArgs(backend, VarlenArgs(_offsets(), 8)))
    assert [name for name, _ in calls] == ["kernel"]


def test_prepare_compiles_the_fused_variants_only_where_they_can_run(recorded, triton_attn, monkeypatch):
    backend = recorded[0]
    backend._arch = "sm_90"
    compiled = []
    monkeypatch.setattr(backend, "_compile_variants", lambda layouts, *args, **kw: compiled.append((layouts, kw)))
    backend.prepare(72, 16, 16, torch.bfloat16, torch.device("cuda"))
    fused = triton_attn.variant_layouts(16, 72, torch.bfloat16, torch.device("cuda"), arch="sm_90", rotary=True)
    assert compiled[-1] == (fused, {"rotated": True})
    assert all(tokens <= triton_attn.FUSED_ROTARY_MAX_SEQLEN for _, tokens in fused)
    monkeypatch.setenv("ROCM_VIT_ROTARY", "compiled")
    _fresh_policy()
    compiled.clear()
    backend.prepare(72, 16, 16, torch.bfloat16, torch.device("cuda"))
    assert [kw for _, kw in compiled] == [{}]


# ---------------------------------------------------------------------------------------------
# A whole tower: Qwen3-VL's tiny preset on triton_attn, fused against the default two launches

_TOWER_SCRIPT = """
import sys
import torch
import rocm_vit.attention as attention
from rocm_vit.models import preset, tower_class
cases = torch.load(sys.argv[1])
rotary_calls = []
apply_rotary = attention.apply_rotary
attention.apply_rotary = lambda *args: rotary_calls.append(1) or apply_rotary(*args)
outputs = {}
for name, case in cases.items():
    torch.manual_seed(0)
    config = preset(name)
    tower = tower_class(config)(config, attention_backend="triton_attn").eval()
    with torch.inference_mode():
        for fused in (True, False):
            tower.attention._fuses_rotary = fused
            rotary_calls.clear()
            outputs[name, fused] = {
                "out": tower(case["pixel_values"], case["grid_thw"]),
                "apply_rotary_calls": len(rotary_calls),
            }
torch.save(outputs, sys.argv[2])
"""

# Two images each: Qwen3-VL's segments of 24 and 4 patches; Qwen2.5-VL's windows and full blocks.
TOWER_GRIDS = {"tiny": [(1, 4, 6), (1, 2, 2)], "qwen2.5-vl-tiny": [(1, 8, 12), (1, 4, 4)]}


@pytest.fixture(scope="module")
def interpreted_towers(tmp_path_factory) -> dict[tuple[str, bool], dict]:
    pytest.importorskip("triton")
    from rocm_vit.models import preset

    generator = torch.Generator().manual_seed(3)
    cases = {}
    for name, grid_thw in TOWER_GRIDS.items():
        config = preset(name)
        patches = sum(t * h * w for t, h, w in grid_thw)
        width = config.in_channels * config.temporal_patch_size * config.patch_size**2
        cases[name] = {"pixel_values": torch.randn(patches, width, generator=generator), "grid_thw": grid_thw}
    env = {"ROCM_VIT_ROTARY": "triton", "ROCM_VIT_ATTENTION_BACKEND": "triton_attn"}
    return run_interpreted(_TOWER_SCRIPT, cases, tmp_path_factory.mktemp("fused_rotary_tower"), env)


@pytest.mark.parametrize("name", list(TOWER_GRIDS))
def test_tower_on_triton_attn_with_the_fused_rotary_equals_the_two_launches(interpreted_towers, name):
    from rocm_vit.models import preset

    fused, unfused = interpreted_towers[name, True], interpreted_towers[name, False]
    depth = preset(name).depth
    assert (fused["apply_rotary_calls"], unfused["apply_rotary_calls"]) == (0, depth)
    assert torch.equal(fused["out"], unfused["out"])


# ---------------------------------------------------------------------------------------------
# What the interpreter cannot show: compiled with fp fusion on (as on the GPUs), the rotary's
# products must stay plain multiplies (triton_rope's are, compiled without fp fusion)


def _compiled_asm(arch: str, rotary: bool) -> str:
    """The fused or unfused kernel for a Qwen3-VL shape, compiled on this CPU for ``arch``."""
    import triton
    from aot_rocm import WAVE_SIZE, _recording, _specialise
    from rocm_vit.backends import triton_attn
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", 90, 32) if arch == "sm_90a" else GPUTarget("hip", arch, WAVE_SIZE)
    tokens, heads, head_dim = 196, 16, 72
    q, k, v = torch.empty(tokens, 3, heads, head_dim, dtype=torch.bfloat16).unbind(1)
    trig = {"cos": torch.empty(tokens, head_dim), "sin": torch.empty(tokens, head_dim)} if rotary else {}
    offsets = torch.tensor([0, tokens], dtype=torch.int32)
    with _recording() as launches:
        triton_attn.triton_varlen_attention(q, k, v, offsets, tokens, 0.1, arch=arch.removesuffix("a"), **trig)
    fn, args, kwargs = launches[0]
    job = _specialise(fn, args, kwargs, arch, target)
    source = ASTSource(fn, job["signature"], job["constexprs"], job["attrs"])
    kernel = triton.compile(source, target=target, options=job["options"])
    if arch != "sm_90a":
        return kernel.asm["amdgcn"]
    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    cubin = Path(tempfile.mkdtemp()) / "kernel.cubin"
    cubin.write_bytes(kernel.asm["cubin"])
    return subprocess.run([str(nvdisasm), str(cubin)], capture_output=True, text=True, check=True).stdout


def _count(pattern: str, asm: str) -> int:
    return len(re.findall(pattern, asm))


def test_on_sm90_the_rotary_adds_plain_multiplies_and_adds_and_no_fma(monkeypatch):
    pytest.importorskip("triton.backends.nvidia.compiler", reason="Triton without its NVIDIA backend")
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")  # the attention kernel's default on the GPUs
    unfused, fused = (_compiled_asm("sm_90a", rotary) for rotary in (False, True))
    assert _count(r"\bFFMA\b", fused) == _count(r"\bFFMA\b", unfused)
    assert "FTZ" not in fused, "triton_rope keeps fp32 denormals"
    added_multiplies = _count(r"\bFMUL\b", fused) - _count(r"\bFMUL\b", unfused)
    added_sums = _count(r"\bFADD\b", fused) - _count(r"\bFADD\b", unfused)
    assert added_sums > 0 and added_multiplies == 2 * added_sums  # two products per rotated element


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_on_amd_the_rotary_adds_plain_multiplies_and_no_fma(monkeypatch, arch):
    pytest.importorskip("triton.backends.amd.compiler", reason="Triton without its AMD backend")
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")
    unfused, fused = (_compiled_asm(arch, rotary) for rotary in (False, True))
    for fma in (r"v_fma\w*_f32", r"v_pk_fma_f32", r"v_fmac\w*_f32", r"v_mad\w*_f32"):
        assert _count(fma, fused) == _count(fma, unfused), fma
    assert _count(r"v_mul_f32", fused) > _count(r"v_mul_f32", unfused)
