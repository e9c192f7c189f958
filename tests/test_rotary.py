"""Rotary on a CPU: the native helper against transformers, the Triton kernel through the
interpreter against a float64 reference, and the dispatch (per platform, override, fallbacks)."""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from rocm_vit.backends.rope_torch import rotary_native_
from triton_interpreter import run_interpreted

import rocm_vit.policy as policy
import rocm_vit.rotary as rotary

transformers = pytest.importorskip("transformers")
from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb_vision  # noqa: E402

HEAD_DIMS = (64, 72, 80, 128)
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

Args = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _random_args(
    generator: torch.Generator,
    num_tokens: int,
    q_heads: int,
    k_heads: int,
    head_dim: int,
    q_dtype: torch.dtype,
    k_dtype: torch.dtype | None = None,
    trig_dtype: torch.dtype = torch.float32,
) -> Args:
    # cos/sin are plain random numbers, not real cos/sin: the two halves differ, so a kernel that
    # reused the first half of cos/sin for the second half of each head would be caught.
    q = torch.randn(num_tokens, q_heads, head_dim, generator=generator).to(q_dtype)
    k = torch.randn(num_tokens, k_heads, head_dim, generator=generator).to(k_dtype or q_dtype)
    cos = torch.randn(num_tokens, head_dim, generator=generator).to(trig_dtype)
    sin = torch.randn(num_tokens, head_dim, generator=generator).to(trig_dtype)
    return q, k, cos, sin


def _transformers(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> Args:
    q_out, k_out = apply_rotary_pos_emb_vision(q, k, cos, sin)
    return q_out, k_out, cos, sin


def _native(args: Args) -> Args:
    q, k, cos, sin = (t.clone() for t in args)
    rotary_native_(q, k, cos, sin)
    return q, k, cos, sin


def _assert_equal_bits(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype
    assert torch.equal(actual, expected), f"max |diff| {(actual.double() - expected.double()).abs().max()}"


# ---------------------------------------------------------------------------------------------
# The native helper is the definition: it must be transformers, bit for bit.


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize(
    ("q_dtype", "k_dtype", "trig_dtype"),
    [
        (torch.float32, torch.float32, torch.float32),
        (torch.float16, torch.float16, torch.float32),
        (torch.bfloat16, torch.bfloat16, torch.float32),
        (torch.float16, torch.bfloat16, torch.float32),
        (torch.bfloat16, torch.bfloat16, torch.bfloat16),
    ],
)
def test_native_matches_transformers_bitwise(generator, head_dim, q_dtype, k_dtype, trig_dtype):
    args = _random_args(generator, 9, 6, 2, head_dim, q_dtype, k_dtype, trig_dtype)
    q_expected, k_expected, _, _ = _transformers(*args)
    q, k, cos, sin = _native(args)
    _assert_equal_bits(q, q_expected)
    _assert_equal_bits(k, k_expected)
    _assert_equal_bits(cos, args[2])
    _assert_equal_bits(sin, args[3])


def test_native_handles_4d_and_non_contiguous_views(generator):
    # [B, N, H, D] q/k with [N, D] cos/sin, and q/k as strided views into one fused qkv buffer.
    q4, k4, cos, sin = _random_args(generator, 5, 4, 4, 72, torch.bfloat16)
    q4, k4 = q4.expand(2, -1, -1, -1).clone(), k4.expand(2, -1, -1, -1).clone()
    q_expected, k_expected, _, _ = _transformers(q4, k4, cos, sin)
    rotary_native_(q4, k4, cos, sin)
    _assert_equal_bits(q4, q_expected)
    _assert_equal_bits(k4, k_expected)

    qkv = torch.randn(5, 3, 4, 72, generator=generator).to(torch.float16)
    q, k = qkv[:, 0], qkv[:, 1]
    untouched_v = qkv[:, 2].clone()
    q_expected, k_expected, _, _ = _transformers(q, k, cos, sin)
    rotary_native_(q, k, cos, sin)
    _assert_equal_bits(q, q_expected)
    _assert_equal_bits(k, k_expected)
    _assert_equal_bits(qkv[:, 2], untouched_v)


# ---------------------------------------------------------------------------------------------
# The Triton kernel through the interpreter.
#
# One child process runs every kernel case under TRITON_INTERPRET=1 (tests/triton_interpreter.py
# says why a child; one interpreter start, a few seconds on 2 cores), saves the tensors it rotated
# in place, and the tests below compare them here.

_INTERPRETER_SCRIPT = """
import sys
import torch
from rocm_vit.backends.triton_rope import triton_rotary_, triton_rotary_supports
cases = torch.load(sys.argv[1])
for case in cases.values():
    case["supported"] = triton_rotary_supports(*case["args"])
    if case["supported"]:
        triton_rotary_(*case["args"])
torch.save(cases, sys.argv[2])
"""


def _kernel_cases() -> dict[str, dict]:
    generator = torch.Generator().manual_seed(2024)
    cases: dict[str, dict] = {}
    # 5 tokens and 3 heads: a partial last token block and padded heads in every program.
    for head_dim in HEAD_DIMS:
        for dtype_name, dtype in DTYPES.items():
            cases[f"d{head_dim}_{dtype_name}"] = {"args": _random_args(generator, 5, 3, 3, head_dim, dtype)}
    cases["gqa"] = {"args": _random_args(generator, 5, 6, 2, 72, torch.bfloat16)}
    cases["qwen3_vl_heads"] = {"args": _random_args(generator, 3, 16, 16, 72, torch.bfloat16)}
    cases["bf16_cos_sin"] = {"args": _random_args(generator, 5, 3, 3, 80, torch.float32, None, torch.bfloat16)}

    q, k, cos, sin = _random_args(generator, 5, 4, 2, 80, torch.float32)
    cases["mixed"] = {"args": (q.half(), k.bfloat16(), cos, sin)}
    cases["all_fp16"] = {"args": (q.half(), k.half(), cos.clone(), sin.clone())}
    cases["all_bf16"] = {"args": (q.bfloat16(), k.bfloat16(), cos.clone(), sin.clone())}

    # q and k as the leading part of larger buffers: the tails must survive the masked stores.
    q, k, cos, sin = _random_args(generator, 5, 3, 2, 72, torch.float16)
    q_buffer = torch.cat([q.flatten(), torch.randn(300, generator=generator).half()])
    k_buffer = torch.cat([k.flatten(), torch.randn(300, generator=generator).half()])
    cases["guarded"] = {
        "args": (q_buffer[: q.numel()].view(q.shape), k_buffer[: k.numel()].view(k.shape), cos, sin),
        "buffers": (q_buffer, k_buffer),
    }

    q, k, cos, sin = _random_args(generator, 5, 3, 3, 72, torch.bfloat16)
    qkv = torch.stack([q, k, q], dim=1)
    cases["q_4d"] = {"args": (q.unsqueeze(0), k.unsqueeze(0), cos, sin)}
    # q and k as views into one fused qkv projection, as the tower passes them: rotated in place.
    cases["qkv_views"] = {"args": (qkv[:, 0], qkv[:, 1], cos, sin), "buffers": (qkv,)}
    head_major = torch.stack([q, k], dim=0).transpose(1, 2).contiguous().transpose(1, 2)
    cases["non_contiguous"] = {"args": (head_major[0], head_major[1], cos, sin)}
    cases["cos_3d"] = {"args": (q, k, cos.unsqueeze(0), sin.unsqueeze(0))}
    cases["cos_one_row"] = {"args": (q, k, cos[:1], sin[:1])}
    cases["k_fewer_tokens"] = {"args": (q, k[:4], cos, sin)}
    cases["odd_head_dim"] = {"args": _random_args(generator, 5, 3, 3, 71, torch.bfloat16)}
    cases["fp64"] = {"args": _random_args(generator, 5, 3, 3, 64, torch.float64)}
    return cases


GRID_CASES = [f"d{d}_{name}" for d in HEAD_DIMS for name in DTYPES]
KERNEL_COVERED = [
    *GRID_CASES,
    "gqa",
    "qwen3_vl_heads",
    "bf16_cos_sin",
    "mixed",
    "all_fp16",
    "all_bf16",
    "guarded",
    "qkv_views",
]
KERNEL_UNCOVERED = ["q_4d", "non_contiguous", "cos_3d", "cos_one_row", "k_fewer_tokens", "odd_head_dim", "fp64"]


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict[str, tuple[dict, dict]]:
    """name -> (inputs, the same tensors after the interpreted kernel rotated them)."""
    pytest.importorskip("triton")
    cases = _kernel_cases()
    workdir = tmp_path_factory.mktemp("rotary_interpreter")
    outputs = run_interpreted(_INTERPRETER_SCRIPT, cases, workdir, {})
    return {name: (cases[name], outputs[name]) for name in cases}


def _float64_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Exact-ish rotation and the fp32 error bound |x*cos| + |rotate_half(x)*sin| per element."""
    x, cos, sin = x.double(), cos.double().unsqueeze(-2), sin.double().unsqueeze(-2)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin, (x * cos).abs() + (rotated * sin).abs()


def _ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Units in the last place between two fp16/bf16 tensors (+0 and -0 are equal)."""

    def ordered(t: torch.Tensor) -> torch.Tensor:
        bits = t.view(torch.int16).int()
        return torch.where(bits < 0, -(bits & 0x7FFF), bits)

    return (ordered(a) - ordered(b)).abs()


def _assert_close_to_reference(actual: torch.Tensor, original: torch.Tensor, cos, sin) -> None:
    reference, magnitude = _float64_reference(original, cos, sin)
    if actual.dtype == torch.float32:
        # Two rounded products and a rounded sum: at most 2**-23 * (|a| + |b|); 2**-22 for margin.
        assert ((actual.double() - reference).abs() <= 2**-22 * magnitude).all()
    else:
        # fp32 math then one rounding to 16 bits (a truncation for bf16 under the interpreter).
        assert _ulp_distance(actual, reference.to(actual.dtype)).max() <= 1


@pytest.mark.parametrize("name", [*GRID_CASES, "qwen3_vl_heads"])
def test_kernel_matches_float64_reference(interpreted, name):
    inputs, outputs = interpreted[name]
    (q0, k0, cos, sin), (q, k, _, _) = inputs["args"], outputs["args"]
    _assert_close_to_reference(q, q0, cos, sin)
    _assert_close_to_reference(k, k0, cos, sin)


@pytest.mark.parametrize("name", KERNEL_COVERED)
def test_kernel_matches_native_helper(interpreted, name):
    # fp32 and fp16 bit for bit; bf16 within one ulp only because the interpreter truncates the
    # fp32 -> bf16 cast (on a GPU it rounds to nearest even: tests/gpu checks bit equality there).
    inputs, outputs = interpreted[name]
    for actual, expected in zip(outputs["args"][:2], _native(inputs["args"])[:2], strict=True):
        if actual.dtype == torch.bfloat16:
            assert _ulp_distance(actual, expected).max() <= 1
        else:
            _assert_equal_bits(actual, expected)


def test_kernel_handles_gqa_heads(interpreted):
    inputs, outputs = interpreted["gqa"]
    q0, k0, cos, sin = inputs["args"]
    q, k, _, _ = outputs["args"]
    assert q.shape[1] != k.shape[1]
    _assert_close_to_reference(q, q0, cos, sin)
    _assert_close_to_reference(k, k0, cos, sin)


def test_kernel_writes_only_q_and_k(interpreted):
    inputs, outputs = interpreted["guarded"]
    q0, k0, cos0, sin0 = inputs["args"]
    q, k, cos, sin = outputs["args"]
    assert not torch.equal(q, q0)
    assert not torch.equal(k, k0)
    _assert_equal_bits(cos, cos0)
    _assert_equal_bits(sin, sin0)
    for before, after, rotated in zip(inputs["buffers"], outputs["buffers"], (q, k), strict=True):
        _assert_equal_bits(after[rotated.numel() :], before[rotated.numel() :])
        # The rotated view is still the front of the same buffer: the kernel worked in place.
        _assert_equal_bits(after[: rotated.numel()], rotated.flatten())


def test_kernel_rotates_q_and_k_inside_a_fused_qkv_buffer(interpreted):
    inputs, outputs = interpreted["qkv_views"]
    (qkv_before,), (qkv_after,) = inputs["buffers"], outputs["buffers"]
    q, k, _, _ = outputs["args"]
    assert q.stride(0) == 3 * q.shape[1] * q.shape[2]
    _assert_equal_bits(qkv_after[:, 0], q)
    _assert_equal_bits(qkv_after[:, 1], k)
    _assert_equal_bits(qkv_after[:, 2], qkv_before[:, 2])  # the v slice is never written
    q_expected, k_expected, _, _ = _native(inputs["args"])
    assert _ulp_distance(q, q_expected).max() <= 1
    assert _ulp_distance(k, k_expected).max() <= 1


def test_kernel_mixed_dtypes_match_single_dtype_runs(interpreted):
    q_mixed, k_mixed, _, _ = interpreted["mixed"][1]["args"]
    q_fp16 = interpreted["all_fp16"][1]["args"][0]
    k_bf16 = interpreted["all_bf16"][1]["args"][1]
    _assert_equal_bits(q_mixed, q_fp16)
    _assert_equal_bits(k_mixed, k_bf16)


def test_kernel_reads_cos_sin_in_model_dtype(interpreted):
    inputs, outputs = interpreted["bf16_cos_sin"]
    q0, k0, cos, sin = inputs["args"]
    _assert_close_to_reference(outputs["args"][0], q0, cos, sin)
    _assert_close_to_reference(outputs["args"][1], k0, cos, sin)


def test_kernel_supports_exactly_the_covered_shapes(interpreted):
    supported = {name: interpreted[name][1]["supported"] for name in KERNEL_COVERED + KERNEL_UNCOVERED}
    assert supported == {name: name in KERNEL_COVERED for name in supported}


# ---------------------------------------------------------------------------------------------
# Dispatch: per platform, the override, the fallbacks.


@pytest.fixture(autouse=True)
def fresh_selection(monkeypatch):
    """Each test chooses anew, from a clean environment, and leaves no cached choice behind."""
    monkeypatch.delenv("ROCM_VIT_ROTARY", raising=False)
    monkeypatch.delenv("ROCM_VIT_CONFIG", raising=False)
    policy.reset_policy()
    yield
    policy.reset_policy()


@pytest.fixture
def on_platform(fake_platform):
    return fake_platform


@pytest.fixture
def compiled_rotary(fake_platform, monkeypatch) -> None:
    """A ROCm platform whose rotary is the compiled helper (a ``tune`` or ``ROCM_VIT_ROTARY`` choice)."""
    fake_platform("rocm")
    monkeypatch.setenv("ROCM_VIT_ROTARY", "compiled")


@pytest.fixture
def recorded_kernel(monkeypatch) -> list[Args]:
    """Replace the Triton launch by a recorder that computes the native result; CPU tensors pass
    the device check as they do under the interpreter."""
    triton_rope = pytest.importorskip("rocm_vit.backends.triton_rope")
    calls: list[Args] = []

    def kernel(q, k, cos, sin):
        calls.append((q, k, cos, sin))
        rotary_native_(q, k, cos, sin)

    monkeypatch.setattr(triton_rope, "triton_rotary_", kernel)
    monkeypatch.setattr(triton_rope, "_INTERPRETED", True)
    return calls


@pytest.mark.parametrize(("platform", "expected"), [("cuda", "triton"), ("rocm", "triton"), ("cpu", "native")])
def test_default_implementation_per_platform(on_platform, platform, expected):
    pytest.importorskip("triton")
    on_platform(platform)
    assert rotary.rotary_impl_name() == expected


@pytest.mark.parametrize("value", ["triton", "compiled", "native", "Native"])
def test_env_override_wins_over_platform(monkeypatch, on_platform, value):
    pytest.importorskip("triton")
    on_platform("cpu" if value.lower() == "triton" else "cuda")  # a platform whose default differs
    monkeypatch.setenv("ROCM_VIT_ROTARY", value)
    assert rotary.rotary_impl_name() == value.lower()


def test_invalid_override_names_variable_and_value(monkeypatch):
    monkeypatch.setenv("ROCM_VIT_ROTARY", "fast")
    with pytest.raises(ValueError, match=r"ROCM_VIT_ROTARY = 'fast'"):
        rotary.rotary_impl_name()
    with pytest.raises(ValueError, match=r"ROCM_VIT_ROTARY = 'fast'"):
        rotary.apply_rotary(*_random_args(torch.Generator().manual_seed(0), 2, 1, 1, 8, torch.float32))


def test_cuda_without_triton_degrades_to_native(monkeypatch, on_platform, caplog):
    on_platform("cuda")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "triton" else real_find_spec(n, *a))
    assert rotary.rotary_impl_name() == "native"
    assert "Triton is not importable" in policy.current_policy().rotary.reason


def test_cuda_runs_the_kernel_for_covered_shapes(generator, on_platform, recorded_kernel):
    on_platform("cuda")
    args = _random_args(generator, 7, 16, 16, 72, torch.bfloat16)
    q, k, cos, sin = (t.clone() for t in args)
    rotary.apply_rotary(q, k, cos, sin)
    assert len(recorded_kernel) == 1 and recorded_kernel[0][0] is q
    q_expected, k_expected, _, _ = _transformers(*args)
    _assert_equal_bits(q, q_expected)
    _assert_equal_bits(k, k_expected)


@pytest.mark.parametrize("shape", ["q_4d", "non_contiguous", "batched_cos", "cos_one_row"])
def test_uncovered_shapes_fall_back_to_native(generator, on_platform, recorded_kernel, shape):
    on_platform("cuda")
    q, k, cos, sin = _random_args(generator, 5, 4, 2, 72, torch.bfloat16)
    if shape == "q_4d":
        q, k = q.unsqueeze(0), k.unsqueeze(0)
    elif shape == "non_contiguous":
        q, k = q.transpose(0, 1).contiguous().transpose(0, 1), k.transpose(0, 1).contiguous().transpose(0, 1)
    elif shape == "batched_cos":  # [B, N, H, D] q/k with [B, N, D] cos/sin
        q, k, cos, sin = q.unsqueeze(0), k.unsqueeze(0), cos.unsqueeze(0), sin.unsqueeze(0)
    else:
        cos, sin = cos[:1], sin[:1]
    q_expected, k_expected, _, _ = _transformers(q, k, cos, sin)
    rotary.apply_rotary(q, k, cos, sin)
    assert recorded_kernel == []
    _assert_equal_bits(q, q_expected)
    _assert_equal_bits(k, k_expected)


def _fused_qkv_args(generator: torch.Generator, num_tokens: int, heads: int, head_dim: int, dtype: torch.dtype):
    """q and k as the towers pass them: views of one fused qkv projection (``qkv.unbind(1)``)."""
    qkv = torch.randn(num_tokens, 3, heads, head_dim, generator=generator).to(dtype)
    cos = torch.randn(num_tokens, head_dim, generator=generator)
    sin = torch.randn(num_tokens, head_dim, generator=generator)
    return qkv, cos, sin


@pytest.mark.slow
@pytest.mark.parametrize("grad_mode", [torch.inference_mode, torch.no_grad])
def test_compiled_helper_rotates_fused_qkv_views_in_place(generator, compiled_rotary, grad_mode):
    """Real torch.compile (Inductor on the CPU): the views the towers pass, under both grad modes.

    The in-place compiled helper failed exactly here on an H200 (torch 2.11, inference_mode).
    """
    assert rotary.rotary_impl_name() == "compiled"
    for num_tokens, head_dim in ((13, 72), (29, 72), (7, 80)):  # new token counts and head dims reuse the compile
        qkv, cos, sin = _fused_qkv_args(generator, num_tokens, 4, head_dim, torch.bfloat16)
        original, expected = qkv.clone(), qkv.clone()
        rotary_native_(expected[:, 0], expected[:, 1], cos, sin)
        with grad_mode():
            q, k, _ = qkv.unbind(1)
            rotary.apply_rotary(q, k, cos, sin)
        # Inductor may fuse a multiply and an add (one rounding fewer): at most one bf16 ulp off.
        torch.testing.assert_close(qkv[:, :2].float(), expected[:, :2].float(), atol=0, rtol=2**-7)
        assert torch.equal(qkv[:, 2], expected[:, 2]), "v must not be written"
        assert not torch.equal(qkv[:, :2], original[:, :2]), "q and k must be rotated in place"


@pytest.mark.slow
def test_compiled_helper_compiles_once_for_no_grad_and_inference_mode(generator, compiled_rotary, monkeypatch):
    """SGLang's server starts (and captures) under ``no_grad`` and may serve under
    ``inference_mode``: one compile must serve both, with the same bits, or the first request of
    such a server compiles (seconds, on ROCm)."""
    compiles = _dynamo_compiles()
    qkv, cos, sin = _fused_qkv_args(generator, 11, 4, 72, torch.bfloat16)
    rotated = []
    for grad_mode in (torch.no_grad, torch.inference_mode, torch.no_grad):
        fused = qkv.clone()
        with grad_mode():
            q, k, _ = fused.unbind(1)
            rotary.apply_rotary(q, k, cos, sin)
        rotated.append(fused)
    assert compiles() == 1  # Dynamo's own count: it guards on the grad mode
    assert all(torch.equal(fused, rotated[0]) for fused in rotated)
    assert not torch.equal(rotated[0], qkv)


def _dynamo_compiles() -> Callable[[], int]:
    """A counter of the graphs Dynamo compiles from now on, with nothing compiled before (rotary's
    patterns and Dynamo's caches cleared)."""
    from torch._dynamo.utils import counters

    rotary.implementation.cache_clear()
    torch._dynamo.reset()
    counters.clear()
    return lambda: counters["stats"]["unique_graphs"]


@pytest.mark.slow
def test_a_first_call_whose_token_count_equals_the_head_count_compiles_for_every_token_count(
    generator, compiled_rotary
) -> None:
    """Dynamo's duck sizing gave 16 tokens through 16 heads one symbol, guarded them equal, and the
    first request of another size compiled again (the SGLang plugin's warm-up image has 16 tokens,
    Qwen3-VL 16 heads: 1.5 s inside the first request on the H200 under ROCm emulation)."""
    compiles = _dynamo_compiles()
    with torch.no_grad():
        for num_tokens in (16, 24, 300):
            qkv, cos, sin = _fused_qkv_args(generator, num_tokens, 16, 64, torch.bfloat16)
            q, k, _ = qkv.unbind(1)
            rotary.apply_rotary(q, k, cos, sin)
    assert compiles() == 1


@pytest.mark.slow
def test_inference_tensors_trace_without_duck_sizing_too(generator, compiled_rotary) -> None:
    """Tensors made under inference mode carry other dispatch keys, so Dynamo traces again for them,
    and that trace too must keep the token count its own symbol: the SGLang plugin's start warms up
    with 16 tokens under ``no_grad`` and under ``inference_mode``, Qwen3-VL has 16 heads, and the first
    inference-mode request of another size compiled again. One compile per kind of tensor."""
    compiles = _dynamo_compiles()
    for grad_mode, num_tokens in ((torch.no_grad, 16), (torch.inference_mode, 16), (torch.inference_mode, 300)):
        with grad_mode():  # the tensors too: made under inference mode, they are inference tensors
            qkv, cos, sin = _fused_qkv_args(generator, num_tokens, 16, 64, torch.bfloat16)
            q, k, _ = qkv.unbind(1)
            rotary.apply_rotary(q, k, cos, sin)
    assert compiles() == 2


@pytest.mark.slow
def test_compiled_helper_keeps_each_dtype_for_mixed_q_and_k(generator, compiled_rotary):
    args = _random_args(generator, 9, 4, 2, 80, torch.float16, torch.bfloat16)
    q, k, cos, sin = (t.clone() for t in args)
    with torch.inference_mode():
        rotary.apply_rotary(q, k, cos, sin)
    q_expected, k_expected, _, _ = _native(args)
    assert (q.dtype, k.dtype) == (torch.float16, torch.bfloat16)
    torch.testing.assert_close(q.float(), q_expected.float(), atol=0, rtol=2**-10)
    torch.testing.assert_close(k.float(), k_expected.float(), atol=0, rtol=2**-7)


def test_compile_failure_is_logged_once_and_served_natively(generator, monkeypatch, compiled_rotary, caplog):
    attempts: list[tuple] = []

    compiled_names: list[str] = []

    def failing_compile(fn, **kwargs):
        assert kwargs == {"fullgraph": True, "dynamic": True}
        compiled_names.append(fn.__name__)

        def run(*args):
            attempts.append(args)
            raise RuntimeError("stand-in: Inductor could not compile")

        return run

    monkeypatch.setattr(torch, "compile", failing_compile)
    with caplog.at_level(logging.WARNING, logger="rocm_vit.rotary"):
        for num_tokens in (5, 6, 7):
            args = _random_args(generator, num_tokens, 4, 4, 80, torch.float16)
            q, k, cos, sin = (t.clone() for t in args)
            rotary.apply_rotary(q, k, cos, sin)
            _assert_equal_bits(q, _transformers(*args)[0])
            _assert_equal_bits(k, _transformers(*args)[1])
    # One pattern (dtypes, head layout, strides, grad mode): compiled once, then native for good,
    # so graph captures and eager runs of that pattern take the same path.
    assert len(attempts) == 1 and compiled_names == ["rotated_native"]
    assert sum("torch.compile failed" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.slow
def test_compiled_helper_compiles_each_call_pattern_apart(generator, compiled_rotary, caplog):
    """More patterns than Dynamo's recompile limit (8 per code object): each still compiles.

    Sharing one compiled function, the ninth pattern failed (FailOnRecompileLimitHit) or, without
    fullgraph, silently ran uncompiled.
    """
    dtypes = (torch.float32, torch.float16, torch.bfloat16)
    with torch.inference_mode():
        for q_dtype in dtypes:
            for k_dtype in dtypes:
                args = _random_args(generator, 6, 2, 2, 8, q_dtype, k_dtype)
                q, k, cos, sin = (t.clone() for t in args)
                rotary.apply_rotary(q, k, cos, sin)
                q_expected, k_expected, _, _ = _native(args)
                torch.testing.assert_close(q, q_expected, atol=1e-2, rtol=1e-2)
                torch.testing.assert_close(k, k_expected, atol=1e-2, rtol=1e-2)
    assert "torch.compile failed" not in caplog.text  # all nine compiled; none fell back


def test_choice_is_made_once_and_logged_once(generator, on_platform, caplog):
    on_platform("cpu")
    with caplog.at_level(logging.INFO, logger="rocm_vit.policy"):
        for _ in range(3):
            rotary.apply_rotary(*_random_args(generator, 3, 2, 2, 64, torch.float32))
        on_platform("cuda")  # a later change of circumstances must not switch implementations
        assert rotary.rotary_impl_name() == "native"
    assert sum("rotary native" in r.getMessage() for r in caplog.records) == 1


def test_cpu_apply_rotary_is_transformers(generator, on_platform):
    on_platform("cpu")
    args = _random_args(generator, 11, 16, 16, 72, torch.bfloat16)
    q, k, cos, sin = (t.clone() for t in args)
    assert rotary.apply_rotary(q, k, cos, sin) is None
    q_expected, k_expected, _, _ = _transformers(*args)
    _assert_equal_bits(q, q_expected)
    _assert_equal_bits(k, k_expected)


# The GPU scripts' helpers replaced by recorders: each pytest and verify call, with the rotary in force.
_CI_STUB = """
ROOT=$(pwd)
die() { echo "$*" >&2; exit 1; }
choose_gpu_python() { PY=true; }
install_sglang_wheelhouse() { :; }
run_pytest() { echo "pytest ${ROCM_VIT_ROTARY:-default} ${ROCM_VIT_EMULATE:-native} $*" >> "$CALLS"; }
run_verify() { echo "verify ${ROCM_VIT_ROTARY:-default} ${ROCM_VIT_EMULATE:-native} $*" >> "$CALLS"; }
"""
_REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("script", "platform"), [("cuda.sh", "rocm"), ("rocm.sh", "native")])
def test_gpu_tiers_run_towers_runner_and_verify_with_the_compiled_rotary_too(tmp_path, script, platform):
    """The default rotary is Triton's; the compiled one (a tune or ROCM_VIT_ROTARY choice) keeps a pass
    of its own: the towers, the runner, SGLang's towers and ``verify`` in both grad modes, on ROCm or
    emulating it."""
    (tmp_path / "ci").mkdir()
    shutil.copy(_REPO / "ci" / script, tmp_path / "ci" / script)
    (tmp_path / "ci" / "common.sh").write_text(_CI_STUB)
    calls = tmp_path / "calls"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROCM_VIT_", "SGLANG_"))}
    subprocess.run(["bash", tmp_path / "ci" / script], cwd=_REPO, env={**env, "CALLS": str(calls)}, check=True)
    compiled = [line.split()[3:] for line in calls.read_text().splitlines() if f" compiled {platform} " in line]
    verified = [args for args in compiled if "--grad-mode" in args]
    assert sorted(args[args.index("--grad-mode") + 1] for args in verified) == ["inference", "no_grad"]
    files = {arg for args in compiled for arg in args if arg.startswith("tests/")}
    towers_and_runner = ("test_graphs_gpu.py", "test_serving_loop_gpu.py", "test_sglang_gpu.py")
    assert files == {f"tests/gpu/{name}" for name in towers_and_runner}
    assert all((_REPO / name).is_file() for name in files)
