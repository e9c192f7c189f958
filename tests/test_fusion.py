"""Fused tower ops: the Triton kernels (interpreted on CPU) against the plain torch ops, and dispatch."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from triton_interpreter import run_interpreted

from rocm_vit import fusion
from rocm_vit.models.tower import RMSNorm

_INTERPRETER_SCRIPT = """
import sys, torch
from rocm_vit.backends import triton_add_norm, triton_pos_embed, triton_silu_mul
cases = torch.load(sys.argv[1])
out = {}
for name, case in cases.items():
    if name.startswith("silu_"):
        supported = triton_silu_mul.supports(case["gate_up"])
        out[name] = {"supports": supported}
        if supported:
            out[name]["result"] = triton_silu_mul.silu_mul(case["gate_up"])
        continue
    if name.startswith("pos_"):
        args = (case["x"].clone(), case["table"], case["taps"], case["weights"])
        supported = triton_pos_embed.supports(*args)
        out[name] = {"supports": supported}
        if supported:
            out[name]["result"] = triton_pos_embed.add_position_embedding_(*args)
        continue
    x, update, weight, bias, kind = case["x"], case["update"], case["weight"], case["bias"], case["kind"]
    supported = triton_add_norm.supports(x, update, weight, bias, kind)
    out[name] = {"supports": supported}
    if supported:
        out[name]["result"] = triton_add_norm.add_norm(x, update, weight, bias, 1e-6, kind)
torch.save(out, sys.argv[2])
"""

# Hidden sizes: Qwen3-VL 2B/4B (1024), 8B (1152, not a power of two: a masked tail), Qwen2.5-VL (1280).
HIDDEN = (1024, 1152, 1280)
KINDS = ("layer_norm", "rms_norm")


def _case(generator: torch.Generator, rows: int, hidden: int, dtype: torch.dtype, kind: str, with_update: bool):
    x = (torch.randn(rows, hidden, generator=generator) * 3 + 0.5).to(dtype)
    update = (torch.randn(rows, hidden, generator=generator) * 2).to(dtype) if with_update else None
    weight = (torch.randn(hidden, generator=generator) * 0.5 + 1).to(dtype)
    bias = (torch.randn(hidden, generator=generator) * 0.1).to(dtype) if kind == "layer_norm" else None
    return {"x": x, "update": update, "weight": weight, "bias": bias, "kind": kind}


def _norm_cases() -> dict[str, dict]:
    generator = torch.Generator().manual_seed(7)
    cases = {}
    for hidden in HIDDEN:
        for kind in KINDS:
            for dtype in (torch.float32, torch.bfloat16):
                for with_update in (True, False):
                    name = f"{kind}_{hidden}_{str(dtype)[6:]}_{'add' if with_update else 'alone'}"
                    cases[name] = _case(generator, 5, hidden, dtype, kind, with_update)
    return cases


def _refused_cases() -> dict[str, dict]:
    generator = torch.Generator().manual_seed(8)
    base = _case(generator, 4, 64, torch.float32, "layer_norm", True)
    return {
        "layer_norm_without_bias": {**base, "bias": None},
        "unknown_kind": {**base, "kind": "group_norm"},
        "x_3d": {**base, "x": base["x"][None], "update": base["update"][None]},
        "x_not_contiguous": {**base, "x": base["x"].t().contiguous().t()},
        "update_other_dtype": {**base, "update": base["update"].double()},
        "update_other_shape": {**base, "update": base["update"][:2]},
        "weight_too_short": {**base, "weight": base["weight"][:32]},
        "hidden_too_wide": _case(generator, 1, 16385, torch.float32, "rms_norm", False),
    }


def _reference(case: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain torch pair in float64 from the (already rounded) sum: what the kernel approximates."""
    x, update, weight, bias = case["x"], case["update"], case["weight"], case["bias"]
    summed = x if update is None else x + update  # eager torch's rounding of the residual stream
    hidden = x.shape[1]
    if case["kind"] == "layer_norm":
        normed = nn.functional.layer_norm(summed.double(), (hidden,), weight.double(), bias.double(), 1e-6)
    else:
        s64 = summed.double()
        normed = weight.double() * (s64 * torch.rsqrt(s64.pow(2).mean(-1, keepdim=True) + 1e-6))
    return summed, normed


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory) -> dict[str, tuple[dict, dict]]:
    pytest.importorskip("triton")
    cases = {**_norm_cases(), **_refused_cases(), **_position_cases(), **_silu_cases()}
    outputs = run_interpreted(_INTERPRETER_SCRIPT, cases, tmp_path_factory.mktemp("add_norm"), {})
    return {name: (cases[name], outputs[name]) for name in cases}


@pytest.mark.parametrize("name", list(_norm_cases()))
def test_kernel_matches_plain_add_then_norm(interpreted, name: str) -> None:
    case, output = interpreted[name]
    assert output["supports"]
    summed, normed = output["result"]
    expected_sum, reference = _reference(case)
    assert summed.dtype == case["x"].dtype and normed.dtype == case["x"].dtype
    # The residual stream is eager torch's rounded sum, bit for bit (fp32 and bf16 sums are exact
    # roundings of the same fp32 sum; the interpreter's truncating bf16 cast can still move one ulp).
    if case["x"].dtype == torch.float32:
        assert torch.equal(summed, expected_sum)
        assert torch.allclose(normed.double(), reference, rtol=1e-5, atol=1e-5)
    else:
        assert torch.allclose(summed.float(), expected_sum.float(), rtol=2**-7, atol=0)
        assert torch.allclose(normed.double(), reference, rtol=2**-6, atol=2**-6)


def _position_cases() -> dict[str, dict]:
    generator = torch.Generator().manual_seed(10)
    cases = {}
    for hidden in (64, 1152):
        for dtype in (torch.float32, torch.bfloat16):
            table = torch.randn(48 * 48, hidden, generator=generator).to(dtype)
            weights = torch.rand(37, 4, generator=generator)
            cases[f"pos_{hidden}_{str(dtype)[6:]}"] = {
                "x": torch.randn(37, hidden, generator=generator).to(dtype),
                "table": table,
                "taps": torch.randint(0, table.shape[0], (37, 4), generator=generator),
                "weights": weights / weights.sum(1, keepdim=True),
            }
    base = cases["pos_64_float32"]
    cases["pos_refused_table_dtype"] = {**base, "table": base["table"].double()}
    cases["pos_refused_three_taps"] = {**base, "taps": base["taps"][:, :3], "weights": base["weights"][:, :3]}
    cases["pos_refused_fp16_weights"] = {**base, "weights": base["weights"].half()}
    return cases


@pytest.mark.parametrize("name", [name for name in _position_cases() if "refused" not in name])
def test_position_kernel_matches_the_plain_interpolation(interpreted, name: str) -> None:
    case, output = interpreted[name]
    assert output["supports"]
    taps, weights, table, x = case["taps"], case["weights"], case["table"], case["x"]
    expected = x + (nn.functional.embedding(taps, table) * weights[:, :, None]).sum(1).to(x.dtype)
    _assert_interpreted_close(output["result"], expected)


def _assert_interpreted_close(result: torch.Tensor, expected: torch.Tensor) -> None:
    """An interpreted kernel with two roundings against eager torch: fp32 to its last bits (the
    exponentials and sum orders may differ there); bf16 within two ulps, since the interpreter
    truncates its bf16 casts where a GPU rounds them."""
    assert result.dtype == expected.dtype
    if expected.dtype == torch.float32:
        torch.testing.assert_close(result, expected, rtol=1e-6, atol=1e-6)
    else:
        torch.testing.assert_close(result.float(), expected.float(), rtol=2**-6, atol=2**-6)


@pytest.mark.parametrize("name", [name for name in _position_cases() if "refused" in name])
def test_position_kernel_refuses_what_it_does_not_cover(interpreted, name: str) -> None:
    assert interpreted[name][1] == {"supports": False}


def test_cpu_position_embedding_is_the_plain_interpolation() -> None:
    case = _position_cases()["pos_64_float32"]
    taps, weights, table, x = case["taps"], case["weights"], case["table"], case["x"]
    expected = x + (table[taps] * weights[:, :, None]).sum(1)
    assert torch.equal(fusion.add_position_embedding(x, table, taps, weights), expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_cpu_position_embedding_rounds_each_weighted_row_when_asked(dtype: torch.dtype) -> None:
    """``round_products``: SGLang's Qwen3-VL ops (rows times weights in the table's dtype, summed over taps)."""
    case = _position_cases()[f"pos_1152_{str(dtype)[6:]}"]
    taps, table, x = case["taps"], case["table"], case["x"]
    weights = case["weights"].to(dtype)  # SGLang rounds the weights to the tower's dtype
    sglangs = x + (nn.functional.embedding(taps.t(), table) * weights.t()[:, :, None]).sum(0)
    rounded = fusion.add_position_embedding(x, table, taps, weights.float(), round_products=True)
    assert torch.equal(rounded, sglangs)
    if dtype != torch.float32:  # the rounding is what makes them equal
        assert not torch.equal(fusion.add_position_embedding(x, table, taps, weights.float()), sglangs)


def _silu_cases() -> dict[str, dict]:
    generator = torch.Generator().manual_seed(12)
    cases = {}
    # Qwen2.5-VL's padded width (3424: three whole blocks and a masked tail) and a single short block (300).
    for width in (3424, 300):
        for dtype in (torch.float32, torch.bfloat16):
            gate_up = (torch.randn(7, 2 * width, generator=generator) * 4).to(dtype)
            cases[f"silu_{width}_{str(dtype)[6:]}"] = {"gate_up": gate_up}
    base = cases["silu_300_float32"]["gate_up"]
    cases["silu_refused_odd_width"] = {"gate_up": base[:, :599].contiguous()}
    cases["silu_refused_3d"] = {"gate_up": base[None]}
    cases["silu_refused_not_contiguous"] = {"gate_up": base.t().contiguous().t()}
    cases["silu_refused_float64"] = {"gate_up": base.double()}
    return cases


@pytest.mark.parametrize("name", [name for name in _silu_cases() if "refused" not in name])
def test_silu_mul_kernel_matches_the_plain_pair(interpreted, name: str) -> None:
    case, output = interpreted[name]
    assert output["supports"]
    gate_up = case["gate_up"]
    gate, up = gate_up.chunk(2, dim=1)
    expected = nn.functional.silu(gate) * up  # eager torch: SiLU rounded, then the product rounded
    assert output["result"].shape == gate.shape
    _assert_interpreted_close(output["result"], expected)


@pytest.mark.parametrize("name", [name for name in _silu_cases() if "refused" in name])
def test_silu_mul_kernel_refuses_what_it_does_not_cover(interpreted, name: str) -> None:
    assert interpreted[name][1] == {"supports": False}


def test_cpu_silu_mul_is_the_plain_pair() -> None:
    gate_up = torch.randn(5, 32, generator=torch.Generator().manual_seed(13))
    expected = nn.functional.silu(gate_up[:, :16]) * gate_up[:, 16:]
    assert torch.equal(fusion.silu_mul(gate_up), expected)


@pytest.mark.parametrize("name", list(_refused_cases()))
def test_kernel_refuses_what_it_does_not_cover(interpreted, name: str) -> None:
    assert interpreted[name][1] == {"supports": False}


def test_kernel_refuses_cpu_tensors_outside_the_interpreter() -> None:
    pytest.importorskip("triton")
    from rocm_vit.backends import triton_add_norm

    case = _case(torch.Generator().manual_seed(9), 4, 64, torch.float32, "layer_norm", True)
    assert not triton_add_norm.supports(case["x"], case["update"], case["weight"], case["bias"], "layer_norm")


def test_norm_kinds() -> None:
    assert fusion.norm_kind(nn.LayerNorm(8)) == "layer_norm"
    assert fusion.norm_kind(nn.LayerNorm(8, bias=False)) is None
    assert fusion.norm_kind(RMSNorm(8)) == "rms_norm"
    assert fusion.norm_kind(nn.GroupNorm(2, 8)) is None


@pytest.mark.parametrize("norm", [nn.LayerNorm(16, eps=1e-6), RMSNorm(16)], ids=["layer_norm", "rms_norm"])
def test_cpu_add_norm_is_the_plain_pair(norm: nn.Module) -> None:
    generator = torch.Generator().manual_seed(3)
    x, update = torch.randn(6, 16, generator=generator), torch.randn(6, 16, generator=generator)
    summed, normed = fusion.add_norm(x, update, norm)
    assert torch.equal(summed, x + update)
    assert torch.equal(normed, norm(x + update))
    summed, normed = fusion.add_norm(x, None, norm)
    assert summed is x and torch.equal(normed, norm(x))


def test_cpu_linear_gelu_is_the_plain_pair() -> None:
    linear = nn.Linear(16, 32)
    x = torch.randn(5, 16)
    assert torch.equal(fusion.linear_gelu_tanh(x, linear), nn.functional.gelu(linear(x), approximate="tanh"))
    assert fusion.fused_ops_name() == "plain"


def test_launch_math_is_tritons() -> None:
    """The wrappers' plain-Python launch arithmetic gives what Triton's constexpr functions give."""
    triton = pytest.importorskip("triton")
    from rocm_vit.backends.launch_math import cdiv, next_power_of_2

    # From 1: importing SGLang rebinds triton.next_power_of_2 to its own, which gives 1 for 0 (Triton's
    # gives 0), so a test of this process that imported SGLang earlier would change the reference.
    assert [next_power_of_2(v) for v in range(1, 4200)] == [triton.next_power_of_2(v) for v in range(1, 4200)]
    assert next_power_of_2(0) == 0
    pairs = [(a, b) for a in range(0, 1000, 7) for b in (1, 3, 16, 64, 128)]
    assert [cdiv(a, b) for a, b in pairs] == [triton.cdiv(a, b) for a, b in pairs]
