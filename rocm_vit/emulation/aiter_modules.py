"""Which compiled aiter module a ``flash_attn_varlen_func`` forward loads, and which ones aiter's build ships.

A call whose module is not built runs hipcc inside the request. Read from aiter's ``ops/mha.py``
(``_flash_attn_varlen_forward``) and ``setup.py`` (``PREBUILD_KERNELS=1``) at ``SGLANG_IMAGE_AITER_COMMIT``
and at main e4048607a535, identical on this path (docs/rocm.md, "Hazards").
"""

from __future__ import annotations

import torch

SGLANG_IMAGE_AITER_COMMIT = "c16d44b93a528b2a4bfd6d8d3409116d465872a9"
AITER_MAIN_COMMIT = "e4048607a535ace3a2b51ded31b1c8c2d45c0879"
V3_VARLEN_MODULE = "module_fmha_v3_varlen_fwd"
V3_ARCHS = ("gfx942", "gfx950")
_V3_HEAD_DIMS = ((128, 128), (192, 128))

# setup.py (PREBUILD_KERNELS=1): the varlen forward modules of the build, by the aiter commit read.
_PREBUILT_AT_BOTH = frozenset(
    {
        "module_fmha_v3_fwd",
        V3_VARLEN_MODULE,
        "mha_varlen_fwd_bf16_nlogits_nbias_mask_nlse_ndropout_nskip_nqscale",
        "mha_varlen_fwd_bf16_nlogits_nbias_nmask_lse_ndropout_nskip_nqscale",
        "mha_varlen_fwd_bf16_nlogits_nbias_mask_nlse_ndropout_skip_nqscale",
        "mha_varlen_fwd_bf16_nlogits_nbias_mask_lse_ndropout_skip_nqscale",
        "mha_varlen_fwd_bf16_nlogits_nbias_nmask_lse_ndropout_skip_nqscale",
    }
)
PREBUILT_VARLEN: dict[str, frozenset[str]] = {
    SGLANG_IMAGE_AITER_COMMIT: _PREBUILT_AT_BOTH,
    AITER_MAIN_COMMIT: _PREBUILT_AT_BOTH,
}


def varlen_forward_module(
    dtype: torch.dtype,
    head_dim: int,
    head_dim_v: int,
    *,
    heads: int,
    kv_heads: int,
    causal: bool,
    return_lse: bool,
    arch: str,
) -> str:
    """The module a plain ``flash_attn_varlen_func`` forward loads (head dims padded to a multiple of 8)."""
    v3 = (
        arch in V3_ARCHS
        and dtype == torch.bfloat16
        and (head_dim, head_dim_v) in _V3_HEAD_DIMS
        and heads % kv_heads == 0
    )
    if v3:
        return V3_VARLEN_MODULE
    name = {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(dtype)
    if name is None:
        raise ValueError(f"aiter's varlen forward takes fp16 or bf16 (and fp8 with descales), not {dtype}")
    mask = "mask" if causal else "nmask"
    lse = "lse" if return_lse else "nlse"
    return f"mha_varlen_fwd_{name}_nlogits_nbias_{mask}_{lse}_ndropout_nskip_nqscale"
