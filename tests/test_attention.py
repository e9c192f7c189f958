"""Attention backends on a CPU: numerics against float64, per-layer arguments, selection, the Triton kernel
through the interpreter, and aiter against a stand-in that enforces aiter's real signature."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.abc
import importlib.util
import itertools
import sys
import types

import numpy as np
import pytest
import torch
from triton_interpreter import run_interpreted

import rocm_vit.attention as attention
import rocm_vit.policy as policy
from rocm_vit.attention import (
    AiterAttention,
    AiterPaddedAttention,
    AutoAttention,
    Fa4Attention,
    GluonAttention,
    PickedArgs,
    SdpaAttention,
    SegmentLengths,
    TorchVarlenAttention,
    TritonAttention,
    VarlenArgs,
    get_backend,
    resolve_backend_name,
)
from rocm_vit.cli import bench_attention
from rocm_vit.emulation import aiter_standin
from rocm_vit.layout import VisionLayout
from rocm_vit.policy import pick_cuda_backend

# Ragged, with a single-token segment (grid (1, 1, 1) has one patch only with merge size 1).
RAGGED_GRID = [(1, 2, 3), (1, 1, 1), (2, 2, 2), (1, 3, 5)]
UNIFORM_GRID = [(1, 2, 2), (1, 2, 2), (1, 2, 2)]


def _layout(grid: list[tuple[int, int, int]]) -> VisionLayout:
    return VisionLayout.from_grid_thw(grid, spatial_merge_size=1)


def _qkv(
    generator: torch.Generator, tokens: int, heads: int, kv_heads: int, head_dim: int, dtype=torch.float32
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    def randn(h: int) -> torch.Tensor:
        return torch.randn(tokens, h, head_dim, generator=generator).to(dtype)

    return randn(heads), randn(kv_heads), randn(kv_heads)


def _reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: list[int] | tuple[int, ...], scale: float
) -> torch.Tensor:
    """Float64 attention within each segment; k/v heads repeated for grouped-query attention."""
    groups = q.shape[1] // k.shape[1]
    q, k, v = q.double(), k.double().repeat_interleave(groups, 1), v.double().repeat_interleave(groups, 1)
    outputs = []
    for qs, ks, vs in zip(q.split(list(seq_lens)), k.split(list(seq_lens)), v.split(list(seq_lens)), strict=True):
        weights = torch.softmax(torch.einsum("qhd,khd->hqk", qs, ks) * scale, dim=-1)
        outputs.append(torch.einsum("hqk,khd->qhd", weights, vs))
    return torch.cat(outputs)


# ---------------------------------------------------------------------------------------------
# sdpa


@pytest.mark.parametrize("grid", [RAGGED_GRID, UNIFORM_GRID], ids=["ragged", "uniform"])
@pytest.mark.parametrize("kv_heads", [4, 2], ids=["mha", "gqa"])
def test_sdpa_matches_float64_reference(generator, grid, kv_heads):
    layout = _layout(grid)
    q, k, v = _qkv(generator, layout.num_patches, 4, kv_heads, 72)
    backend = get_backend("sdpa")
    out = backend(q, k, v, backend.runner_args(layout, layout.cu_seqlens_tensor("cpu")), 72**-0.5)
    torch.testing.assert_close(out.double(), _reference(q, k, v, layout.seq_lens, 72**-0.5), atol=1e-5, rtol=0)


def test_sdpa_output_dtype_follows_v_when_q_is_fp16_beside_bf16_kv(generator):
    layout = _layout(RAGGED_GRID)
    q, k, v = _qkv(generator, layout.num_patches, 2, 2, 64)
    backend = SdpaAttention()
    out = backend(q.half(), k.bfloat16(), v.bfloat16(), backend.runner_args(layout, None), 0.125)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), _reference(q, k, v, layout.seq_lens, 0.125), atol=3e-2, rtol=0)


def test_sdpa_from_a_host_cu_seqlens_tensor(generator):
    layout = _layout(RAGGED_GRID)
    q, k, v = _qkv(generator, layout.num_patches, 2, 2, 64)
    backend = SdpaAttention()
    layer_args = backend.layer_args_from_tensor(torch.tensor(layout.cu_seqlens))
    assert layer_args == SegmentLengths(layout.seq_lens)
    torch.testing.assert_close(
        backend(q, k, v, layer_args, 0.125).double(), _reference(q, k, v, layout.seq_lens, 0.125), atol=1e-5, rtol=0
    )


# ---------------------------------------------------------------------------------------------
# aiter, against a stand-in module with the real signature


def _recording_aiter() -> types.ModuleType:
    """The emulation's aiter stand-in (aiter's signature, refusals and module table: rocm_vit/emulation,
    tested in test_aiter_standin.py), recording each call. The offsets reach it as a plain tensor, as
    a kernel reads them on the device, so a caller's host reads stay visible."""
    module = types.ModuleType("aiter")
    module.calls = []

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **kwargs):
        call = {"cu_seqlens_q": cu_seqlens_q, "max_seqlen_q": max_seqlen_q, "head_dim": q.shape[-1]}
        module.calls.append({**call, **kwargs})
        offsets_q, offsets_k = (offsets.as_subclass(torch.Tensor) for offsets in (cu_seqlens_q, cu_seqlens_k))
        return aiter_standin.flash_attn_varlen_func(q, k, v, offsets_q, offsets_k, max_seqlen_q, max_seqlen_k, **kwargs)

    module.flash_attn_varlen_func = flash_attn_varlen_func
    return module


@pytest.fixture
def stand_in_aiter(monkeypatch) -> types.ModuleType:
    module = _recording_aiter()
    monkeypatch.setitem(sys.modules, "aiter", module)
    return module


# aiter computes in bf16 or fp16 only: outputs against the float64 reference within bf16's rounding.
BF16_TOLERANCE = {"atol": 2e-2, "rtol": 0}


@pytest.mark.parametrize("kv_heads", [4, 2], ids=["mha", "gqa"])
def test_aiter_attn_runner_args_match_float64_reference(generator, stand_in_aiter, kv_heads):
    layout = _layout(RAGGED_GRID)
    q, k, v = _qkv(generator, layout.num_patches, 4, kv_heads, 80, torch.bfloat16)
    cu_seqlens = layout.cu_seqlens_tensor("cpu")
    backend = AiterAttention()
    layer_args = backend.runner_args(layout, cu_seqlens)
    assert layer_args.cu_seqlens is cu_seqlens and layer_args.max_seqlen == layout.max_seqlen
    out = backend(q, k, v, layer_args, 0.1)
    torch.testing.assert_close(out.double(), _reference(q, k, v, layout.seq_lens, 0.1), **BF16_TOLERANCE)
    (call,) = stand_in_aiter.calls
    assert call["cu_seqlens_q"] is cu_seqlens, "the runner's static cu_seqlens buffer must reach aiter as is"
    assert (call["softmax_scale"], call["causal"], call["return_lse"]) == (0.1, False, True)


@pytest.mark.parametrize("head_dim", [72, 80])
def test_aiter_attn_padded_to_128_matches_float64_reference(generator, stand_in_aiter, head_dim):
    """Zero columns change no score and padded v columns are cut: the result is the unpadded one,
    computed by aiter at head dim 128 with the model's scale."""
    layout = _layout(RAGGED_GRID)
    q, k, v = _qkv(generator, layout.num_patches, 4, 2, head_dim, torch.bfloat16)
    backend = AiterPaddedAttention()
    out = backend(q, k, v, backend.runner_args(layout, layout.cu_seqlens_tensor("cpu")), head_dim**-0.5)
    assert out.shape == q.shape and out.is_contiguous()
    reference = _reference(q, k, v, layout.seq_lens, head_dim**-0.5)
    torch.testing.assert_close(out.double(), reference, **BF16_TOLERANCE)
    (call,) = stand_in_aiter.calls
    assert (call["head_dim"], call["softmax_scale"]) == (128, head_dim**-0.5)


def test_aiter_attn_output_dtype_follows_v(generator, stand_in_aiter):
    layout = _layout(RAGGED_GRID)
    q, k, v = _qkv(generator, layout.num_patches, 2, 2, 64)
    backend = AiterAttention()
    layer_args = backend.runner_args(layout, layout.cu_seqlens_tensor("cpu"))
    out = backend(q.half(), k.bfloat16(), v.bfloat16(), layer_args, 0.125)
    assert out.dtype == torch.bfloat16


def test_aiter_attn_tensor_caller_path_converts_offsets(generator, stand_in_aiter):
    layout = _layout(RAGGED_GRID)
    q, k, v = _qkv(generator, layout.num_patches, 2, 2, 64, torch.bfloat16)
    backend = AiterAttention()
    # An eager caller's int64, non-contiguous offsets: converted on the way in, lengths from the host.
    spaced = torch.tensor([x for offset in layout.cu_seqlens for x in (offset, -1)])[::2]
    layer_args = backend.layer_args_from_tensor(spaced)
    assert layer_args.max_seqlen == layout.max_seqlen and type(layer_args.max_seqlen) is int
    out = backend(q, k, v, layer_args, 0.125)
    torch.testing.assert_close(out.double(), _reference(q, k, v, layout.seq_lens, 0.125), **BF16_TOLERANCE)
    backend(q, k, v, backend.layer_args_from_tensor(spaced, max_seqlen=np.int64(layout.max_seqlen)), 0.125)
    assert stand_in_aiter.calls[-1]["max_seqlen_q"] == layout.max_seqlen


def test_aiter_attn_refuses_a_tensor_max_seqlen(generator, stand_in_aiter):
    layout = _layout(RAGGED_GRID)
    q, k, v = _qkv(generator, layout.num_patches, 2, 2, 64)
    cu_seqlens = layout.cu_seqlens_tensor("cpu")
    with pytest.raises(TypeError, match="host int"):
        AiterAttention()(q, k, v, VarlenArgs(cu_seqlens, torch.tensor(layout.max_seqlen)), 0.125)
    with pytest.raises(TypeError, match="host int"):
        AiterAttention().layer_args_from_tensor(cu_seqlens, max_seqlen=torch.tensor(layout.max_seqlen))


class _ImportTrapLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module):
        raise AssertionError("aiter was imported")


class _AiterFinder(importlib.abc.MetaPathFinder):
    """Makes ``aiter`` findable, and its import fail loudly."""

    def find_spec(self, name, path, target=None):
        return importlib.util.spec_from_loader(name, _ImportTrapLoader()) if name == "aiter" else None


def test_aiter_is_found_without_being_imported_until_the_first_call(generator, monkeypatch, fake_platform):
    monkeypatch.delitem(sys.modules, "aiter", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_AiterFinder(), *sys.meta_path])
    fake_platform("rocm")
    monkeypatch.setenv("SGLANG_USE_AITER", "1")
    monkeypatch.delenv("ROCM_VIT_ATTENTION_BACKEND", raising=False)
    assert resolve_backend_name()[0] == "aiter_attn"
    backend = get_backend()
    assert isinstance(backend, AiterAttention) and "aiter" not in sys.modules
    layout = _layout(RAGGED_GRID)
    q, k, v = _qkv(generator, layout.num_patches, 2, 2, 64)
    with pytest.raises(AssertionError, match="aiter was imported"):
        backend(q, k, v, backend.runner_args(layout, layout.cu_seqlens_tensor("cpu")), 0.125)


def test_missing_aiter_says_how_to_install(generator, monkeypatch):
    monkeypatch.setitem(sys.modules, "aiter", None)  # makes `import aiter` fail
    layout = _layout(RAGGED_GRID)
    q, k, v = _qkv(generator, layout.num_patches, 2, 2, 64)
    backend = AiterAttention()
    with pytest.raises(RuntimeError, match=r"pip install rocm-vit\[aiter\]"):
        backend(q, k, v, backend.runner_args(layout, layout.cu_seqlens_tensor("cpu")), 0.125)


# ---------------------------------------------------------------------------------------------
# No device reads: the graph-runner list is built and used without touching cu_seqlens' values


class _NoHostReads(torch.Tensor):
    """A ``cu_seqlens`` that fails every read back to the host (as a sync would on a GPU)."""

    _READS = frozenset({"item", "tolist", "cpu", "numpy", "__int__", "__index__", "__float__", "__bool__"})

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in cls._READS:
            raise AssertionError(f"cu_seqlens was read back to the host through {name}")
        return super().__torch_function__(func, types, args, kwargs or {})


ALL_BACKENDS = [SdpaAttention, AiterAttention, TritonAttention, TorchVarlenAttention, AutoAttention]


@pytest.mark.parametrize("backend_cls", ALL_BACKENDS, ids=lambda cls: cls.name)
def test_runner_args_reference_the_buffer_and_hold_only_host_data(backend_cls):
    layout = _layout(RAGGED_GRID)
    cu_seqlens = layout.cu_seqlens_tensor("cpu").as_subclass(_NoHostReads)
    layer_args = backend_cls().runner_args(layout, cu_seqlens)
    if backend_cls is AutoAttention:
        assert isinstance(layer_args, PickedArgs)
        assert isinstance(layer_args.backend, (SdpaAttention, TorchVarlenAttention, TritonAttention))
        layer_args = layer_args.args
    items = [getattr(layer_args, field.name) for field in dataclasses.fields(layer_args)]
    tensors = [item for item in items if isinstance(item, torch.Tensor)]
    assert all(item is cu_seqlens for item in tensors)
    assert all(type(item) in (int, tuple, type(None)) for item in items if not isinstance(item, torch.Tensor))


def test_aiter_attn_runner_args_path_reads_nothing_back(generator, stand_in_aiter):
    layout = _layout(RAGGED_GRID)
    q, k, v = _qkv(generator, layout.num_patches, 2, 2, 64, torch.bfloat16)
    cu_seqlens = layout.cu_seqlens_tensor("cpu").as_subclass(_NoHostReads)
    backend = AiterAttention()
    out = backend(q, k, v, backend.runner_args(layout, cu_seqlens), 0.125)
    torch.testing.assert_close(out.double(), _reference(q, k, v, layout.seq_lens, 0.125), **BF16_TOLERANCE)


@pytest.mark.parametrize("backend_cls", ALL_BACKENDS, ids=lambda cls: cls.name)
def test_tensor_callers_with_host_lengths_read_nothing_back(backend_cls, machine):
    if backend_cls is AutoAttention:
        machine("cuda")  # auto picks among GPU kernels
    layout = _layout(RAGGED_GRID)
    # On "meta": a device tensor whose values cannot be read at all.
    cu_seqlens = torch.empty(len(layout.cu_seqlens), dtype=torch.int32, device="meta").as_subclass(_NoHostReads)
    backend = backend_cls()
    with_lengths = backend.layer_args_from_tensor(cu_seqlens, layout.max_seqlen, layout.seq_lens)
    if backend_cls is AutoAttention:
        with_lengths = with_lengths.args
    assert with_lengths in (SegmentLengths(layout.seq_lens), VarlenArgs(cu_seqlens, layout.max_seqlen))
    if backend_cls is not SdpaAttention:
        backend.layer_args_from_tensor(cu_seqlens, max_seqlen=layout.max_seqlen)


def test_triton_attn_tensor_caller_without_lengths_bounds_the_grid_instead_of_reading(machine):
    machine("cuda")
    cu_seqlens = torch.empty(4, dtype=torch.int32, device="meta").as_subclass(_NoHostReads)
    assert TritonAttention().layer_args_from_tensor(cu_seqlens) == VarlenArgs(cu_seqlens, None)
    picked = AutoAttention().layer_args_from_tensor(cu_seqlens, max_seqlen=9)
    assert picked.args == VarlenArgs(cu_seqlens, 9) and picked.backend is not None


# ---------------------------------------------------------------------------------------------
# Selection and errors


@pytest.fixture
def machine(monkeypatch, fake_platform):
    """Pretend to be another platform with a chosen set of importable modules."""
    real_find_spec = importlib.util.find_spec
    monkeypatch.delenv("ROCM_VIT_ATTENTION_BACKEND", raising=False)
    monkeypatch.delenv("SGLANG_USE_AITER", raising=False)
    monkeypatch.delenv("ROCM_VIT_CONFIG", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)

    def configure(
        platform: str, modules: set[str] = frozenset({"triton", "torch.nn.attention.varlen"}), arch: str = ""
    ):
        def find_spec(name, package=None):
            if name in policy.PROBED_MODULES:
                return real_find_spec("torch") if name in modules else None
            return real_find_spec(name, package)

        monkeypatch.setattr(importlib.util, "find_spec", find_spec)
        fake_platform(platform, "fake", arch)
        policy.reset_policy()

    return configure


def test_rocm_with_aiter_and_sglang_use_aiter_selects_aiter_attn(machine, monkeypatch):
    machine("rocm", {"aiter", "triton"})
    monkeypatch.setenv("SGLANG_USE_AITER", "1")
    name, why = resolve_backend_name()
    assert name == "aiter_attn" and "SGLANG_USE_AITER=1" in why
    assert isinstance(get_backend(), AiterAttention)


def test_rocm_with_aiter_but_sglang_use_aiter_off_selects_triton_attn(machine):
    machine("rocm", {"aiter", "triton"})
    name, why = resolve_backend_name()
    assert name == "triton_attn" and "SGLANG_USE_AITER is off" in why


def test_rocm_without_aiter_selects_triton_attn_and_says_how_to_get_aiter(machine, monkeypatch):
    machine("rocm", {"triton"})
    monkeypatch.setenv("SGLANG_USE_AITER", "1")
    name, why = resolve_backend_name()
    assert name == "triton_attn" and "pip install rocm-vit[aiter]" in why
    assert isinstance(get_backend(), TritonAttention)


def test_rocm_without_aiter_or_triton_falls_back_to_sdpa(machine):
    machine("rocm", set())
    assert resolve_backend_name()[0] == "sdpa"


def test_cpu_selects_sdpa(machine):
    machine("cpu")
    assert resolve_backend_name()[0] == "sdpa"
    assert isinstance(get_backend(), SdpaAttention)


def test_cuda_selects_auto_with_triton_attn_for_ragged_layouts(machine):
    machine("cuda")
    name, why = resolve_backend_name()
    assert name == "auto" and "triton_attn" in why
    backend = get_backend()
    assert isinstance(backend, AutoAttention)
    ragged = backend.runner_args(_layout(RAGGED_GRID), torch.zeros(6, dtype=torch.int32)).backend
    assert isinstance(ragged, TritonAttention)


def test_cuda_without_triton_uses_torch_varlen_for_ragged_layouts(machine):
    machine("cuda", {"torch.nn.attention.varlen"})
    assert "torch_varlen" in resolve_backend_name()[1]
    ragged = get_backend().runner_args(_layout(RAGGED_GRID), torch.zeros(6, dtype=torch.int32)).backend
    assert isinstance(ragged, TorchVarlenAttention)


def test_environment_override_and_explicit_name(machine, monkeypatch):
    machine("rocm", {"aiter", "triton"})
    monkeypatch.setenv("ROCM_VIT_ATTENTION_BACKEND", "sdpa")
    assert attention.resolve_backend_name() == ("sdpa", "set by ROCM_VIT_ATTENTION_BACKEND")
    assert isinstance(get_backend(), SdpaAttention)
    assert isinstance(get_backend("aiter_attn"), AiterAttention)


@pytest.mark.parametrize(
    ("platform", "modules", "name", "expected"),
    [
        ("cuda", {"triton"}, "aiter_attn", "needs ROCm"),
        ("rocm", {"triton"}, "aiter_attn", r"pip install rocm-vit\[aiter\]"),
        ("cpu", set(), "triton_attn", "triton is not installed"),
        ("cpu", {"triton"}, "triton_attn", "needs a CUDA or ROCm GPU"),
        ("rocm", {"triton"}, "torch_varlen", "needs an NVIDIA GPU"),
        ("cuda", {"triton"}, "torch_varlen", r"needs torch >= 2\.10"),
        ("cpu", set(), "auto", "name a backend"),
        ("rocm", {"triton"}, "fa4", "needs an NVIDIA GPU"),
        ("cuda", {"triton"}, "fa4", r"pip install rocm-vit\[fa4\]"),
        ("rocm", {"triton", "triton.experimental.gluon"}, "gluon_attn", "needs an NVIDIA Hopper GPU"),
        ("cuda", {"triton"}, "gluon_attn", r"has no Gluon \(triton\.experimental\.gluon\)"),
    ],
)
def test_unavailable_backend_fails_at_construction_naming_what_is_missing(
    machine, monkeypatch, platform, modules, name, expected
):
    machine(platform, modules)
    monkeypatch.setenv("ROCM_VIT_ATTENTION_BACKEND", name)
    with pytest.raises(RuntimeError, match=expected) as raised:
        get_backend()
    message = str(raised.value)
    assert repr(name) in message and f"cannot run on {platform}" in message
    assert "ROCM_VIT_ATTENTION_BACKEND" in message


def test_unknown_backend_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"known: .*'aiter_attn'.*'triton_attn'"):
        get_backend("flash_infinity")


@pytest.mark.parametrize(
    ("seq_lens", "expected"),
    [
        ((12800,), "sdpa"),
        ((1024,) * 8, "sdpa"),
        ((1024, 4096, 2048), "sdpa"),
        ((196,), "triton_attn"),
        ((256,) * 16, "triton_attn"),
        ((4096, 64), "triton_attn"),
        ((1024, 1088, 1152, 1216, 1280), "triton_attn"),
        ((64, 100, 256), "triton_attn"),
        # Photos: segments that end in a partial 128-token tile go to triton_attn.
        ((8160,), "triton_attn"),
        ((8160, 8160), "triton_attn"),
        ((14400,), "triton_attn"),
        ((47376,), "triton_attn"),
        ((8192, 8160), "triton_attn"),
        ((2304,), "sdpa"),
        ((8192, 8192), "sdpa"),
    ],
)
def test_cuda_rule_from_host_lengths(seq_lens, expected):
    assert pick_cuda_backend(seq_lens)[0] == expected


@pytest.mark.parametrize(("seq_lens", "expected"), [((8160,), "sdpa"), ((12800,), "sdpa"), ((196,), "torch_varlen")])
def test_cuda_rule_partial_tiles_only_against_triton_attn(seq_lens, expected):
    # torch's varlen kernel is slower than cuDNN at every long length: a partial tile keeps SDPA.
    assert pick_cuda_backend(seq_lens, "torch_varlen")[0] == expected


@pytest.mark.parametrize(
    ("seq_lens", "expected"),
    [
        ((12800,), "fa4"),
        ((8192, 8192), "fa4"),
        ((4096, 64), "fa4"),  # one long segment is enough: fa4 is one launch for any mix
        ((2048,), "fa4"),
        ((1920,), "sdpa"),
        ((2047,), "triton_attn"),  # below fa4's threshold and a partial tile
        ((1024,) * 8, "sdpa"),
        ((196,), "triton_attn"),
        ((256,) * 16, "triton_attn"),
    ],
)
def test_cuda_rule_with_fa4_installed(seq_lens, expected):
    assert pick_cuda_backend(seq_lens, "triton_attn", "fa4")[0] == expected


def _with_fa4(machine, capability: tuple[int, int]) -> None:
    machine("cuda", {"triton", "torch.nn.attention.varlen", "flash_attn.cute"}, "sm_{}{}".format(*capability))


def test_cuda_auto_sends_long_segments_to_fa4_where_installed(machine):
    _with_fa4(machine, (9, 0))
    name, why = resolve_backend_name()
    assert name == "auto" and "fa4 when the longest segment has >= 2048 tokens" in why
    backend = get_backend()
    picks = {
        grid_name: type(backend.runner_args(_layout(grid), torch.zeros(len(grid) + 1, dtype=torch.int32)).backend)
        for grid_name, grid in {"long": [(1, 80, 160)], "one_1024": [(1, 32, 32)], "ragged": RAGGED_GRID}.items()
    }
    assert picks == {"long": Fa4Attention, "one_1024": SdpaAttention, "ragged": TritonAttention}


def test_fa4_is_not_used_before_hopper(machine):
    _with_fa4(machine, (8, 0))
    assert "no long-sequence kernel: fa4 is used from sm_90 (Hopper) on; this GPU is sm_80" in resolve_backend_name()[1]
    with pytest.raises(RuntimeError, match="sm_80"):
        get_backend("fa4")
    long = _layout([(1, 80, 160)])
    assert isinstance(get_backend().runner_args(long, torch.zeros(2, dtype=torch.int32)).backend, SdpaAttention)


def _with_gluon(machine, capability: tuple[int, int], extra: frozenset[str] = frozenset()) -> None:
    modules = {"triton", "torch.nn.attention.varlen", "triton.experimental.gluon", *extra}
    machine("cuda", modules, "sm_{}{}".format(*capability))


def _picks(backend) -> dict[str, type]:
    grids = {"long": [(1, 80, 160)], "one_1024": [(1, 32, 32)], "ragged": RAGGED_GRID}
    return {
        name: type(backend.runner_args(_layout(grid), torch.zeros(len(grid) + 1, dtype=torch.int32)).backend)
        for name, grid in grids.items()
    }


def test_cuda_auto_sends_long_segments_to_gluon_attn_on_hopper(machine):
    _with_gluon(machine, (9, 0))
    name, why = resolve_backend_name()
    assert name == "auto" and "gluon_attn when the longest segment has >= 2048 tokens" in why
    assert _picks(get_backend(head_dim=72)) == {
        "long": GluonAttention,
        "one_1024": SdpaAttention,
        "ragged": TritonAttention,
    }


def test_auto_runs_a_padded_bucket_on_the_long_kernel_from_its_threshold(machine):
    """A padded graph has its offsets on the device and a bound on the longest segment only. From
    the long kernel's threshold that kernel takes it (on the H200 a 3,072-token bucket replayed in
    10.8 ms on triton_attn; one image of 3,036 tokens ran in 7.9 ms on gluon_attn); below it the
    one-launch kernel, never cuDNN, which needs the lengths on the host."""
    _with_gluon(machine, (9, 0))
    backend = get_backend(head_dim=72)
    offsets = torch.zeros(3, dtype=torch.int32)
    assert type(backend.per_call_args(offsets, 3072).backend) is GluonAttention
    assert type(backend.per_call_args(offsets, 2047).backend) is TritonAttention
    assert type(backend.per_call_args(offsets, 1024).backend) is TritonAttention  # the rule says cuDNN
    # A caller of SGLang's attention with a device cu_seqlens and a host bound: the same kernels.
    on_device = torch.empty(3, dtype=torch.int32, device="meta")
    assert type(backend.layer_args_from_tensor(on_device, 3072).backend) is GluonAttention
    assert type(backend.layer_args_from_tensor(on_device, 1024).backend) is TritonAttention
    assert type(backend.layer_args_from_tensor(on_device).backend) is TritonAttention  # no bound: one launch


def test_gluon_attn_is_not_picked_for_a_head_dim_it_does_not_take(machine):
    _with_gluon(machine, (9, 0))
    # 12800 tokens are whole 128-token tiles: without the long kernel the rule sends them to cuDNN.
    assert _picks(get_backend(head_dim=128))["long"] is SdpaAttention
    assert _picks(get_backend())["long"] is GluonAttention  # head dim unknown: the wrapper decides


def test_fa4_is_preferred_to_gluon_attn_where_both_run(machine):
    _with_gluon(machine, (9, 0), frozenset({"flash_attn.cute"}))
    assert "fa4 when the longest segment has >= 2048 tokens" in resolve_backend_name()[1]
    assert _picks(get_backend(head_dim=72))["long"] is Fa4Attention


def test_gluon_attn_is_not_used_off_hopper(machine):
    _with_gluon(machine, (10, 0))
    why = resolve_backend_name()[1]
    assert "no long-sequence kernel" in why and "Hopper's (wgmma and TMA, sm_90); this GPU is sm_100" in why
    with pytest.raises(RuntimeError, match="sm_100"):
        get_backend("gluon_attn")
    assert _picks(get_backend(head_dim=72))["long"] is SdpaAttention


def test_fa4_wrapper_names_the_package_when_it_is_missing_and_refuses_device_lengths():
    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash_attn is installed here")
    from rocm_vit.backends import fa4_attn

    q = torch.randn(4, 2, 8)
    with pytest.raises(TypeError, match="host int"):
        fa4_attn.fa4_varlen_attention(q, q, q, torch.tensor([0, 4], dtype=torch.int32), torch.tensor(4), 0.3)
    with pytest.raises(RuntimeError, match=r"pip install rocm-vit\[fa4\]"):
        fa4_attn.fa4_varlen_attention(q, q, q, torch.tensor([0, 4], dtype=torch.int32), 4, 0.3)


def test_auto_gives_one_layout_the_same_kernel_every_time():
    backend = AutoAttention()
    cu_seqlens = torch.zeros(6, dtype=torch.int32)
    picks = {id(backend.runner_args(_layout(RAGGED_GRID), cu_seqlens).backend) for _ in range(3)}
    assert len(picks) == 1


# ---------------------------------------------------------------------------------------------
# triton_attn through the Triton interpreter
#
# One child process runs every case under TRITON_INTERPRET=1 (tests/triton_interpreter.py says
# why a child) and saves the outputs; the tests compare them here. The interpreter's bf16 matmul is
# unreliable, so the cases use fp16 and fp32.

_INTERPRETER_SCRIPT = """
import sys
import torch
from rocm_vit.attention import get_backend
from rocm_vit.backends.triton_attn import TritonAttnConfig, triton_varlen_attention
from rocm_vit.layout import VisionLayout
cases = torch.load(sys.argv[1])
outputs = {}
for name, case in cases.items():
    q, k, v = case["q"], case["k"], case["v"]
    if case["via"] == "backend":
        layout = VisionLayout.from_grid_thw(case["grid"], spatial_merge_size=1)
        backend = get_backend("triton_attn")
        layer_args = backend.runner_args(layout, layout.cu_seqlens_tensor("cpu"))
        outputs[name] = backend(q, k, v, layer_args, case["scale"])
        continue
    config = TritonAttnConfig(*case["config"]) if case["config"] else None
    out = torch.full(q.shape, float("nan"), dtype=v.dtype) if case["out"] else None
    result = triton_varlen_attention(
        q, k, v, case["cu_seqlens"], case["max_seqlen"], case["scale"], out=out, config=config
    )
    assert out is None or result is out, "out= must be written in place and returned"
    outputs[name] = result
torch.save(outputs, sys.argv[2])
"""

SMALL_TILES = (16, 16, 4, 1)  # several query and key tiles per segment, and partial last tiles


def _interpreter_cases() -> dict[str, dict]:
    generator = torch.Generator().manual_seed(7)
    seq_lens = (37, 1, 16, 20)
    cu_seqlens = torch.tensor([0, *itertools.accumulate(seq_lens)], dtype=torch.int32)
    tokens = cu_seqlens[-1].item()

    def case(head_dim, dtype, heads=4, kv_heads=2, **changes) -> dict:
        q, k, v = _qkv(generator, tokens, heads, kv_heads, head_dim, dtype)
        return {
            "q": q, "k": k, "v": v, "cu_seqlens": cu_seqlens, "seq_lens": seq_lens, "max_seqlen": max(seq_lens),
            "scale": head_dim**-0.5, "config": SMALL_TILES, "out": False, "via": "function", **changes,
        }  # fmt: skip

    cases = {
        "d72_fp16_gqa": case(72, torch.float16),
        "d64_fp32_default_tiles": case(64, torch.float32, heads=2, kv_heads=2, config=None),
        "d80_fp16_grid_bounded_by_tokens": case(80, torch.float16, max_seqlen=None),
        "d128_fp16_out": case(128, torch.float16, heads=2, kv_heads=1, out=True),
        # Odd tails: 40 = 32 + a 16-wide tail half masked, 100 = 64 + a 64-wide tail with 28 masked.
        "d40_fp16_overlapping_tail": case(40, torch.float16, out=True),
        "d100_fp32_overlapping_tail": case(100, torch.float32, heads=2, kv_heads=1),
    }
    mixed = case(72, torch.float32, heads=2, kv_heads=2)
    mixed["q"] = mixed["q"].half()
    cases["fp16_q_fp32_kv"] = mixed
    # q, k, v as views of one packed [N, 3, H, D] projection: token stride 3 * H * D, head stride 72.
    packed = torch.randn(tokens, 3, 2, 72, generator=generator).half()
    cases["d72_strided_views"] = case(72, torch.float16) | {"q": packed[:, 0], "k": packed[:, 1], "v": packed[:, 2]}
    grid = [(1, 2, 3), (1, 1, 1), (2, 2, 2)]
    layout = _layout(grid)
    q, k, v = _qkv(generator, layout.num_patches, 2, 2, 72, torch.float16)
    cases["backend_runner_args"] = {
        "q": q, "k": k, "v": v, "grid": grid, "seq_lens": layout.seq_lens, "scale": 0.1, "via": "backend",
    }  # fmt: skip
    return cases


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict[str, tuple[dict, torch.Tensor]]:
    """case name -> (inputs, the interpreted kernel's output)."""
    pytest.importorskip("triton")
    cases = _interpreter_cases()
    workdir = tmp_path_factory.mktemp("attention_interpreter")
    outputs = run_interpreted(
        _INTERPRETER_SCRIPT, cases, workdir, {"TRITON_DEFAULT_FP_FUSION": "1", "ROCM_VIT_ATTENTION_BACKEND": None}
    )
    return {name: (cases[name], outputs[name]) for name in cases}


@pytest.mark.parametrize("name", list(_interpreter_cases()))
def test_triton_attn_interpreted_matches_float64_reference(interpreted, name):
    case, out = interpreted[name]
    expected = _reference(case["q"], case["k"], case["v"], case["seq_lens"], case["scale"])
    assert out.dtype == case["v"].dtype, "output dtype follows v"
    assert out.shape == case["q"].shape
    tolerance = 1e-5 if out.dtype == torch.float32 and case["q"].dtype == torch.float32 else 2e-3
    torch.testing.assert_close(out.double(), expected, atol=tolerance, rtol=0)


# ---------------------------------------------------------------------------------------------
# The benchmark command on a CPU


def test_bench_attn_parses_its_arguments_and_declines_without_a_gpu(monkeypatch, capsys):
    parser = argparse.ArgumentParser()
    bench_attention.add_arguments(parser)
    args = parser.parse_args(["--head-dims", "72,80", "--json", "-"])
    assert args.head_dims == [72, 80]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench_attention.run(args) == 2
    assert "needs a CUDA or ROCm GPU" in capsys.readouterr().err


def test_bench_attn_keeps_its_first_twelve_layouts_and_adds_real_photo_sizes():
    from rocm_vit.layout import VisionLayout

    first_twelve = ["1x1024", "1x3072", "1x4096", "1x8192", "1x12800", "1x16384", "2x8192", "4x1024", "8x1024"]
    first_twelve += ["16x256", "ragged4", "ragged16"]
    assert list(bench_attention.LAYOUTS)[:12] == first_twelve, "earlier results are keyed by these names"
    tokens = {name: VisionLayout.from_grid_thw(grid).seq_lens for name, grid in bench_attention.LAYOUTS.items()}
    # 1920x1080 and 4032x3024 after Qwen3-VL's resize (32-pixel merge blocks): docs/long-sequences.md.
    assert {name: tokens[name] for name in list(bench_attention.LAYOUTS)[12:]} == {
        "1x8160": (8160,), "2x8160": (8160, 8160), "1x14400": (14400,), "1x47376": (47376,),
    }  # fmt: skip


def test_triton_attn_refuses_key_tiles_past_the_largest_it_was_run_with():
    """A 256-key tile faulted on the GPU (illegal memory access, which poisons the CUDA context): a
    config override must fail as a ValueError before anything launches."""
    triton_attn = pytest.importorskip("rocm_vit.backends.triton_attn")
    q = torch.randn(8, 2, 16)
    cu_seqlens = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match="block_n = 256 is over 128"):
        triton_attn.triton_varlen_attention(
            q, q, q, cu_seqlens, 8, 0.25, config=triton_attn.TritonAttnConfig(64, 256, 4, 1)
        )
    assert max(config[1] for config in bench_attention.SWEEP_CONFIGS) <= triton_attn.MAX_BLOCK_N


def test_triton_config_uses_smaller_query_tiles_only_when_few_tiles_would_run():
    triton_attn = pytest.importorskip("rocm_vit.backends.triton_attn")
    config = functools.partial(triton_attn.default_config, arch="sm_90")
    one_small_image = config(72, torch.bfloat16, query_tiles=2 * 16)  # 196 tokens, 16 heads
    four_small_images = config(72, torch.bfloat16, query_tiles=4 * 2 * 16)
    assert one_small_image.block_m == 64
    assert four_small_images == config(72, torch.bfloat16) and four_small_images.block_m == 128
    assert config(72, torch.float32, query_tiles=1).block_m == 64
