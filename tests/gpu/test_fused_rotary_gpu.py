"""triton_attn's rotary inside its launch on the device: bf16 bit for bit against triton_rope + the kernel,
one launch fewer per block of a tower, and compiled by prepare.

The CPU suite checks the same equality under the interpreter in fp32 and fp16 (tests/test_fused_rotary.py);
only a GPU compiles the kernel with fp fusion on, where an unguarded product would become an FMA.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from rocm_vit.attention import TritonAttention, VarlenArgs
from rocm_vit.models import preset, tower_class
from rocm_vit.policy import reset_policy

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU (torch.cuda.is_available() is False)"
    ),
]

DEVICE = torch.device("cuda")

# Segment lengths up to the fused bound (256): a 224² image, two, a video's many frames (NVIDIA's
# many-tiles configuration), ragged ones ending in partial tiles, single tokens.
LAYOUTS = {
    "1x196": [196],
    "2x196": [196, 196],
    "40x64": [64] * 40,
    "ragged": [37, 1, 16, 200, 256, 5],
}


@pytest.fixture(autouse=True)
def triton_rotary(monkeypatch):
    """The policy's rotary is triton_rope's (CUDA's default; ROCm needs it asked for)."""
    monkeypatch.setenv("ROCM_VIT_ROTARY", "triton")
    reset_policy()
    yield
    reset_policy()


def _case(lengths: list[int], heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, seed: int):
    generator = torch.Generator(DEVICE).manual_seed(seed)
    tokens = sum(lengths)
    qkv = torch.randn(tokens, heads + 2 * kv_heads, head_dim, generator=generator, device=DEVICE).to(dtype)
    angles = torch.rand(tokens, head_dim // 2, generator=generator, device=DEVICE) * 40
    angles = torch.cat([angles, angles], dim=-1)
    offsets = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=DEVICE)
    return qkv, (heads, kv_heads, kv_heads), angles.cos(), angles.sin(), offsets


@torch.inference_mode()
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("shape", [(16, 16, 72), (16, 16, 80), (8, 2, 64), (4, 4, 128)], ids=str)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_fused_rotary_equals_triton_rope_then_the_kernel_bitwise(layout, shape, dtype):
    from rocm_vit.backends.triton_attn import fuses_rotary, triton_varlen_attention
    from rocm_vit.backends.triton_rope import triton_rotary_

    lengths = LAYOUTS[layout]
    qkv, views, cos, sin, offsets = _case(lengths, *shape, dtype, seed=len(lengths))
    scale = shape[2] ** -0.5
    unfused_qkv, fused_qkv = qkv.clone(), qkv.clone()
    q, k, v = unfused_qkv.split(views, dim=1)
    triton_rotary_(q, k, cos, sin)
    unfused = triton_varlen_attention(q, k, v, offsets, max(lengths), scale)
    q, k, v = fused_qkv.split(views, dim=1)
    assert fuses_rotary(q, k, cos, sin, max(lengths))
    fused = triton_varlen_attention(q, k, v, offsets, max(lengths), scale, cos=cos, sin=sin)
    torch.cuda.synchronize()
    assert torch.equal(fused_qkv, qkv), "the fused launch only reads q and k"
    difference = (fused.float() - unfused.float()).abs().max().item()
    assert torch.equal(fused, unfused), f"max difference {difference}"


def _device_kernels(call) -> int:
    from rocm_vit.workloads.launch_cost import count_device_activities

    return count_device_activities(call, DEVICE)


@torch.inference_mode()
@pytest.mark.parametrize("name", ["qwen3-vl-8b", "qwen2.5-vl-7b"])
def test_tower_launches_one_kernel_fewer_per_block_and_gives_the_same_bits(name):
    config = preset(name)
    torch.manual_seed(0)
    with torch.device(DEVICE):
        tower = tower_class(config)(config, attention_backend="triton_attn").to(torch.bfloat16).eval()
    grid_thw = [(1, 14, 14)] if config.model_type == "qwen3_vl" else [(1, 16, 16)]  # one 224² image
    patches = sum(t * h * w for t, h, w in grid_thw)
    width = config.in_channels * config.temporal_patch_size * config.patch_size**2
    pixels = torch.randn(patches, width, device=DEVICE, dtype=torch.bfloat16)
    results = {}
    for fused in (True, False):
        tower.attention._fuses_rotary = fused
        tower(pixels, grid_thw)  # compiles
        out = tower(pixels, grid_thw)
        results[fused] = (out, _device_kernels(lambda: tower(pixels, grid_thw)))
    (fused_out, fused_kernels), (unfused_out, unfused_kernels) = results[True], results[False]
    print(f"{name}: {unfused_kernels} kernels unfused, {fused_kernels} fused, {config.depth} blocks")
    assert unfused_kernels - fused_kernels == config.depth
    # As bits: a random-weight tower's NaNs, if any, must match too.
    assert torch.equal(fused_out.view(torch.int16), unfused_out.view(torch.int16))


def _compiled_variants(kernel) -> int:
    return sum(len(cache[0]) for cache in kernel.device_caches.values())


@torch.inference_mode()
def test_prepare_compiles_every_fused_variant_a_stream_of_short_layouts_launches():
    from rocm_vit.backends import triton_attn

    backend = TritonAttention()
    backend.prepare(72, 16, 16, torch.bfloat16, DEVICE)
    prepared = _compiled_variants(triton_attn._varlen_attn_fwd)
    generator = torch.Generator().manual_seed(0)
    for _ in range(40):
        segments = int(torch.randint(1, 48, (), generator=generator))
        lengths = (torch.randint(1, triton_attn.FUSED_ROTARY_MAX_SEQLEN + 1, (segments,), generator=generator)).tolist()
        qkv, views, cos, sin, offsets = _case(lengths, 16, 16, 72, torch.bfloat16, seed=segments)
        q, k, v = qkv.split(views, dim=1)
        backend.attend_rotated(q, k, v, VarlenArgs(offsets, max(lengths)), 72**-0.5, cos, sin)
    torch.cuda.synchronize()
    assert _compiled_variants(triton_attn._varlen_attn_fwd) == prepared
