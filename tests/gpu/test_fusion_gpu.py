"""Fused block ops on the device: residual add + norm, fc1 + tanh-GELU, and whole towers against fp32.

Each fused op is checked against the plain torch pair it replaces and against a float64 reference; the
towers are checked end to end: a bf16 tower with fused ops must be as close to the same tower in fp32
as the plain bf16 tower is. (Graph replay against eager, which runs the fused ops too, is
tests/gpu/test_graphs_gpu.py.)
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from rocm_vit import fusion
from rocm_vit.models import preset, tower_class
from rocm_vit.models.tower import RMSNorm
from rocm_vit.policy import reset_policy

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU (torch.cuda.is_available() is False)"
    ),
]

DEVICE = torch.device("cuda")


@pytest.fixture
def fused_ops(monkeypatch):
    """Turn the fused ops on or off for this process (``ROCM_VIT_FUSED_OPS``), restoring the default after."""

    def select(enabled: bool) -> str:
        monkeypatch.setenv("ROCM_VIT_FUSED_OPS", "1" if enabled else "0")
        reset_policy()
        return fusion.fused_ops_name()

    yield select
    monkeypatch.delenv("ROCM_VIT_FUSED_OPS", raising=False)
    reset_policy()


def _norm(kind: str, hidden: int, dtype: torch.dtype, generator: torch.Generator) -> nn.Module:
    norm = nn.LayerNorm(hidden, eps=1e-6) if kind == "layer_norm" else RMSNorm(hidden)
    with torch.no_grad():
        for param in norm.parameters():
            param.copy_(torch.randn(param.shape, generator=generator, device=DEVICE) * 0.3 + 1)
    return norm.to(DEVICE, dtype)


@torch.inference_mode()
@pytest.mark.parametrize("kind", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("hidden", [1024, 1152, 1280, 4608])
def test_add_norm_rounds_the_sum_like_torch_and_normalises_as_accurately(
    fused_ops, kind: str, dtype: torch.dtype, hidden: int
) -> None:
    assert fused_ops(True) == "fused"
    generator = torch.Generator(device=DEVICE).manual_seed(hidden)
    norm = _norm(kind, hidden, dtype, generator)
    x = (torch.randn(333, hidden, generator=generator, device=DEVICE) * 4 + 1).to(dtype)
    update = (torch.randn(333, hidden, generator=generator, device=DEVICE) * 2).to(dtype)
    torch.full((64 << 20,), float("nan"), device=DEVICE)  # freed at once: the outputs may land on NaNs
    summed, normed = fusion.add_norm(x, update, norm)
    assert torch.equal(summed, x + update)
    _assert_as_accurate_as_torch(normed, norm(summed), _float64_norm(norm, summed))
    _, alone = fusion.add_norm(x, None, norm)
    _assert_as_accurate_as_torch(alone, norm(x), _float64_norm(norm, x))


def _float64_norm(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    x64, weight = x.double(), norm.weight.double()
    if isinstance(norm, nn.LayerNorm):
        return F.layer_norm(x64, norm.normalized_shape, weight, norm.bias.double(), norm.eps)
    return weight * x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + norm.eps)


def _assert_as_accurate_as_torch(fused: torch.Tensor, plain: torch.Tensor, reference: torch.Tensor) -> None:
    """The fused result is no further from float64 than torch's own, elementwise at worst and on average.

    (Not a ulp bound between the two: where the bias cancels the normalised value the output is near
    zero, and there one fp32 rounding of the mean moves the result by many of its tiny ulps.)
    """
    assert fused.dtype == plain.dtype and not fused.isnan().any()
    if fused.dtype == torch.float32:  # both within a few fp32 roundings
        torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-5)
        return
    fused_error = (fused.double() - reference).abs()
    plain_error = (plain.double() - reference).abs()
    assert fused_error.max() <= 1.5 * plain_error.max(), (fused_error.max(), plain_error.max())
    assert fused_error.mean() <= 1.1 * plain_error.mean(), (fused_error.mean(), plain_error.mean())


@torch.inference_mode()
def test_linear_gelu_tanh_is_at_least_as_accurate_as_the_plain_pair(fused_ops) -> None:
    generator = torch.Generator(device=DEVICE).manual_seed(5)
    linear = nn.Linear(1152, 4304).to(DEVICE)
    with torch.no_grad():
        linear.weight.normal_(0, 0.03, generator=generator)
        linear.bias.normal_(0, 0.5, generator=generator)
    x = torch.randn(196, 1152, generator=generator, device=DEVICE)
    reference = F.gelu(F.linear(x.double(), linear.weight.double(), linear.bias.double()), approximate="tanh")
    linear_bf16 = copy.deepcopy(linear).bfloat16()
    errors = {}
    for enabled in (True, False):
        fused_ops(enabled)
        out = fusion.linear_gelu_tanh(x.bfloat16(), linear_bf16)
        assert out.dtype == torch.bfloat16
        errors[enabled] = ((out.double() - reference).norm() / reference.norm()).item()
    assert errors[True] <= errors[False] * 1.05, errors


@torch.inference_mode()
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
def test_silu_mul_rounds_like_torch(fused_ops, dtype: torch.dtype) -> None:
    assert fused_ops(True) == "fused"
    generator = torch.Generator(device=DEVICE).manual_seed(13)
    # Qwen2.5-VL's stacked gate+up at its padded width, 333 rows.
    gate_up = (torch.randn(333, 2 * 3424, generator=generator, device=DEVICE) * 4).to(dtype)
    torch.full((64 << 20,), float("nan"), device=DEVICE)  # freed at once: the output may land on NaNs
    fused = fusion.silu_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=1)
    plain = F.silu(gate) * up
    assert fused.shape == plain.shape and fused.dtype == dtype and not fused.isnan().any()
    # The same two roundings; only the exponential may differ (by an fp32 ulp before the first one),
    # which moves a rare element by an ulp of the dtype, and by two after the product.
    one_ulp = {torch.bfloat16: 2**-7, torch.float16: 2**-10, torch.float32: 2**-20}[dtype]  # fp32: a few ulps
    torch.testing.assert_close(fused.float(), plain.float(), rtol=2 * one_ulp, atol=0)
    if dtype != torch.float32:  # in fp32 the exponentials' last bits show in many elements
        assert (fused != plain).float().mean().item() < 0.01


def _tower_errors(fused_ops, name: str, overrides: dict, grid) -> dict[bool, float]:
    """Relative L2 error against the fp32 tower of the bf16 tower with fused ops on and off."""
    torch.manual_seed(0)
    config = preset(name, **overrides)
    # The fp32 reference attends with sdpa: aiter (ROCm, or its stand-in when emulated) takes only
    # fp16/bf16. The bf16 tower has the same weights and the platform's default backend.
    reference_tower = tower_class(config)(config, attention_backend="sdpa").to(DEVICE).eval()
    tower = tower_class(config)(config).to(DEVICE).eval()
    tower.load_state_dict(reference_tower.state_dict())
    tower.bfloat16()
    width = config.in_channels * config.temporal_patch_size * config.patch_size**2
    generator = torch.Generator(device=DEVICE).manual_seed(1)
    pixels = torch.randn(sum(t * h * w for t, h, w in grid), width, generator=generator, device=DEVICE)
    fused_ops(False)
    reference = reference_tower(pixels, grid).double()
    errors = {}
    for enabled in (True, False):
        fused_ops(enabled)
        out = tower(pixels.bfloat16(), grid).double()
        errors[enabled] = ((out - reference).norm() / reference.norm()).item()
    return errors


@torch.inference_mode()
@pytest.mark.parametrize(
    ("name", "overrides", "grid"),
    [
        ("qwen3-vl-8b", {"depth": 6, "deepstack_visual_indexes": [1, 3, 5]}, [(1, 14, 14), (1, 32, 24)]),
        ("qwen2.5-vl-7b", {"depth": 4, "fullatt_block_indexes": [1, 3]}, [(1, 16, 16), (2, 12, 20)]),
    ],
    ids=["qwen3-vl-8b-width", "qwen2.5-vl-7b-width"],
)
def test_fused_tower_is_as_close_to_fp32_as_the_plain_tower(fused_ops, name: str, overrides: dict, grid) -> None:
    errors = _tower_errors(fused_ops, name, overrides, grid)
    assert errors[True] < 2e-2, errors
    assert errors[True] <= errors[False] * 1.1, errors


@torch.inference_mode()
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_position_embedding_kernel_is_as_accurate_as_the_plain_interpolation(fused_ops, dtype: torch.dtype) -> None:
    assert fused_ops(True) == "fused"
    generator = torch.Generator(device=DEVICE).manual_seed(11)
    table = torch.randn(48 * 48, 1152, generator=generator, device=DEVICE).to(dtype)
    x = torch.randn(3000, 1152, generator=generator, device=DEVICE).to(dtype)
    taps = torch.randint(0, table.shape[0], (3000, 4), generator=generator, device=DEVICE)
    weights = torch.rand(3000, 4, generator=generator, device=DEVICE)
    plain = x + (F.embedding(taps, table) * weights[:, :, None]).sum(1).to(dtype)
    reference = x.double() + (F.embedding(taps, table.double()) * weights.double()[:, :, None]).sum(1)
    fused = fusion.add_position_embedding(x.clone(), table, taps, weights)
    _assert_as_accurate_as_torch(fused, plain, reference)


@torch.inference_mode()
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
def test_position_embedding_kernel_rounds_each_weighted_row_as_sglangs_qwen3_vl(fused_ops, dtype: torch.dtype) -> None:
    """``round_products``: SGLang's ``fast_pos_embed_interpolate_from_list`` ops, bit for bit."""
    assert fused_ops(True) == "fused"
    generator = torch.Generator(device=DEVICE).manual_seed(12)
    table = torch.randn(48 * 48, 1152, generator=generator, device=DEVICE).to(dtype)
    x = torch.randn(3000, 1152, generator=generator, device=DEVICE).to(dtype)
    taps = torch.randint(0, table.shape[0], (3000, 4), generator=generator, device=DEVICE)
    weights = torch.rand(3000, 4, generator=generator, device=DEVICE).to(dtype)  # SGLang rounds them
    # SGLang's order: [4, N, C] rows times weights in the table's dtype, summed over the taps.
    sglangs = x + (F.embedding(taps.t(), table) * weights.t()[:, :, None]).sum(0)
    fused = fusion.add_position_embedding(x.clone(), table, taps, weights.float(), round_products=True)
    assert torch.equal(fused, sglangs)
