"""No serving call compiles an aiter kernel: every module rocm-vit's aiter calls load is one SGLang's
ROCm image ships, or one built while the tower is constructed (rocm_vit/emulation/aiter_modules.py
holds aiter's module naming and its prebuilt list, with the commits they were read from).

The calls go through rocm-vit's backends into the emulation's aiter stand-in, which records the
module of every call and which of them aiter's JIT would have had to build.
"""

from __future__ import annotations

import sys

import pytest
import torch
from rocm_vit.backends.aiter_attn import prepare_aiter

from rocm_vit.attention import AiterAttention, AiterPaddedAttention
from rocm_vit.emulation import aiter_standin
from rocm_vit.emulation.aiter_modules import (
    AITER_MAIN_COMMIT,
    PREBUILT_VARLEN,
    SGLANG_IMAGE_AITER_COMMIT,
    V3_VARLEN_MODULE,
    varlen_forward_module,
)
from rocm_vit.layout import VisionLayout
from rocm_vit.models import preset

# The towers rocm-vit serves: head dims 64 (Qwen3-VL 2B/4B), 72 (8B and larger), 80 (Qwen2.5-VL).
PRESETS = ("qwen3-vl-2b", "qwen3-vl-8b", "qwen2.5-vl-7b")
GRID = [(1, 4, 6), (2, 2, 2), (1, 6, 4)]


@pytest.fixture
def standin() -> None:
    """The stand-in as ``aiter`` with the build state of a fresh SGLang ROCm image."""
    report = aiter_standin.install()
    if not aiter_standin.installed():
        pytest.skip(report)
    aiter_standin.reset_builds()
    prepare_aiter.cache_clear()  # what an earlier test prepared was built in another "install"
    try:
        yield
    finally:
        sys.modules.pop("aiter", None)


@pytest.mark.parametrize(
    ("dtype", "head_dim", "return_lse", "arch", "expected"),
    [
        (torch.bfloat16, 72, False, "gfx950", "mha_varlen_fwd_bf16_nlogits_nbias_nmask_nlse_ndropout_nskip_nqscale"),
        (torch.bfloat16, 72, True, "gfx950", "mha_varlen_fwd_bf16_nlogits_nbias_nmask_lse_ndropout_nskip_nqscale"),
        (torch.bfloat16, 128, False, "gfx942", V3_VARLEN_MODULE),
        (torch.bfloat16, 128, True, "gfx90a", "mha_varlen_fwd_bf16_nlogits_nbias_nmask_lse_ndropout_nskip_nqscale"),
        (torch.float16, 128, True, "gfx950", "mha_varlen_fwd_fp16_nlogits_nbias_nmask_lse_ndropout_nskip_nqscale"),
    ],
)
def test_module_names_follow_aiters_rules(dtype, head_dim, return_lse, arch, expected):
    module = varlen_forward_module(
        dtype, head_dim, head_dim, heads=16, kv_heads=16, causal=False, return_lse=return_lse, arch=arch
    )
    assert module == expected


def test_sglangs_image_lacks_the_variant_without_lse_and_every_fp16_one():
    """The hazard itself (aiter PR 5605): the plain non-causal call compiles on first use."""
    prebuilt = PREBUILT_VARLEN[SGLANG_IMAGE_AITER_COMMIT]
    assert prebuilt == PREBUILT_VARLEN[AITER_MAIN_COMMIT]
    assert "mha_varlen_fwd_bf16_nlogits_nbias_nmask_nlse_ndropout_nskip_nqscale" not in prebuilt
    assert "mha_varlen_fwd_bf16_nlogits_nbias_nmask_lse_ndropout_nskip_nqscale" in prebuilt
    assert not any("_fp16_" in module for module in prebuilt)


def _serve(backend: AiterAttention, name: str, dtype: torch.dtype, generator: torch.Generator) -> None:
    """A preset's attention as a server calls it: the graph runner's list, then an eager caller's."""
    config = preset(name)
    heads, head_dim = config.num_heads, config.hidden_size // config.num_heads
    layout = VisionLayout.from_grid_thw(GRID, spatial_merge_size=1)
    q, k, v = (torch.randn(layout.num_patches, heads, head_dim, generator=generator).to(dtype) for _ in range(3))
    cu_seqlens = layout.cu_seqlens_tensor("cpu")
    backend(q, k, v, backend.runner_args(layout, cu_seqlens), head_dim**-0.5)
    backend(q, k, v, backend.layer_args_from_tensor(cu_seqlens, layout.max_seqlen, layout.seq_lens), head_dim**-0.5)


@pytest.mark.parametrize("backend_class", [AiterAttention, AiterPaddedAttention], ids=lambda cls: cls.name)
@pytest.mark.parametrize("name", PRESETS)
def test_bf16_towers_load_only_modules_sglangs_image_ships(standin, backend_class, name, generator):
    backend = backend_class()
    _serve(backend, name, torch.bfloat16, generator)
    builds = aiter_standin.builds
    assert builds.compiled == [], f"{name} through {backend.name} would compile {builds.compiled} in a request"
    assert set(builds.loaded) <= PREBUILT_VARLEN[SGLANG_IMAGE_AITER_COMMIT]


@pytest.mark.parametrize("backend_class", [AiterAttention, AiterPaddedAttention], ids=lambda cls: cls.name)
def test_what_the_image_lacks_is_built_when_the_backend_is_prepared_not_in_a_request(standin, backend_class, generator):
    config = preset("qwen3-vl-8b")
    heads, head_dim = config.num_heads, config.hidden_size // config.num_heads
    backend = backend_class()
    backend.prepare(head_dim, heads, heads, torch.float16, torch.device("cpu"))
    builds = aiter_standin.builds
    (built_ahead,) = builds.compiled
    assert "_fp16_" in built_ahead
    _serve(backend, "qwen3-vl-8b", torch.float16, generator)
    assert builds.compiled == [built_ahead]  # nothing more inside the requests
