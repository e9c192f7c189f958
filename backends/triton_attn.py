"""rocm-vit's own varlen non-causal flash attention in Triton, for CUDA and ROCm.

Invariants: segment bounds are read on the device and ``max_seqlen`` only sizes the grid, so nothing
is read back; the configuration is fixed per arch, head dim and dtype (never autotuned), so a launch
is capturable. Head dims 72 and 80 run as 64 plus a 16-wide masked tail, not padded to 128.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import fast_launch
from .launch_math import cdiv, next_power_of_2
from .varlen_args import check_varlen_inputs, longest_segment_bound, varlen_output

_LOG2_E = 1.4426950408889634


@dataclass(frozen=True)
class TritonAttnConfig:
    """Tile sizes and launch shape of one kernel specialisation."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def default_config(head_dim: int, dtype: torch.dtype, query_tiles: int | None = None, *, arch: str) -> TritonAttnConfig:
    """The fixed launch configuration on ``arch`` (a ``"gfx*"`` gets AMD's, anything else NVIDIA's);
    ``query_tiles``: the launch's 128-row query tiles. Never autotuned: that would benchmark inside a
    capture."""
    if arch.startswith("gfx"):
        return _amd_config(arch, dtype)
    if dtype == torch.float32:
        return TritonAttnConfig(block_m=64, block_n=32, num_warps=4, num_stages=2)
    if query_tiles is not None and query_tiles <= _FEW_QUERY_TILES:
        # One short segment (a 224² image: 32 tiles of 128 rows at 16 heads) leaves most SMs idle;
        # 64-row tiles on one warpgroup double the programs (measured in c13b1fc).
        return TritonAttnConfig(block_m=64, block_n=64, num_warps=4, num_stages=3)
    # sm_90: two warpgroups split the 128 query rows; 141 registers at head dim 72 and 176 at 128,
    # no spills, where 4 warps spill at 255. Three stages pipeline the K/V copies (80 KiB of smem).
    return TritonAttnConfig(block_m=128, block_n=64, num_warps=8, num_stages=3)


def _amd_config(arch: str, dtype: torch.dtype) -> TritonAttnConfig:
    """AMD Instinct tiles (an arch not listed: gfx942's, which fit CDNA's smallest LDS); no few-tiles
    rule, as none was timed on an Instinct GPU yet."""
    half, fp32 = _AMD_CONFIGS.get(arch, _AMD_CONFIGS["gfx942"])
    return fp32 if dtype == torch.float32 else half


# (bf16/fp16, fp32) per arch. Two workgroups per CU must fit, so one hides the other's K/V loads: LDS
# at most half the CU's, VGPRs (AGPRs included) at most 256. Registers, LDS and occupancy per head dim,
# compiled by Triton 3.9 and checked on every CPU run (tests/test_aot_rocm.py): docs/rocm-kernels.md.
_AMD_CONFIGS = {
    # MI300X, 64 KiB of LDS per CU: two stages would fit one workgroup only. aiter's tuned Triton
    # forward default on gfx942 is this same shape.
    "gfx942": (
        TritonAttnConfig(block_m=128, block_n=64, num_warps=4, num_stages=1),
        TritonAttnConfig(block_m=64, block_n=32, num_warps=4, num_stages=2),
    ),
    # MI355X, 160 KiB of LDS per CU: the two-stage K/V prefetch fits twice. aiter's gfx950 default runs
    # one stage; an MI355X sweep (rocm-vit bench-attn --sweep-triton) should decide between the two.
    "gfx950": (
        TritonAttnConfig(block_m=128, block_n=64, num_warps=4, num_stages=2),
        TritonAttnConfig(block_m=64, block_n=32, num_warps=4, num_stages=2),
    ),
}


# The largest key tile this kernel is run with (`bench-attn --sweep-triton` goes up to 128). A config
# override past it is refused: (64, 256, 4 warps, 1 stage) faulted on an H200 under Triton 3.6
# (1ed14db).
MAX_BLOCK_N = 128

# At most this many 128-row query tiles (segments x heads x tiles per segment): half the SMs of an
# H100/H200 or fewer, where 64-row tiles win.
_FEW_QUERY_TILES = 64


def triton_varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int | None,
    scale: float,
    *,
    out: torch.Tensor | None = None,
    config: TritonAttnConfig | None = None,
    arch: str | None = None,
) -> torch.Tensor:
    """Non-causal attention within each segment of packed ``q`` ``[N, H, D]``, ``k``/``v`` ``[N, KH, D]``.

    ``KH`` divides ``H``; ``cu_seqlens`` int32 (or int64) ``[B + 1]`` offsets on q's device (a CPU
    one is copied, for eager callers only); ``max_seqlen`` a host int sizing the grid (``None``: by
    ``N``, no device read). Returns ``[N, H, D]`` in ``v.dtype``, into ``out`` if given. Head dims
    16..256, last dims contiguous. ``arch`` (``None``: q's device's) picks tiles and fp32 precision.
    """
    check_varlen_inputs(q, k, v, cu_seqlens, max_seqlen)
    tokens, heads, head_dim = q.shape
    kv_heads = k.shape[1]
    out = varlen_output(q, v, out)
    if cu_seqlens.device != q.device:
        cu_seqlens = cu_seqlens.to(q.device, non_blocking=True)
    num_seqs = cu_seqlens.shape[0] - 1
    bound = longest_segment_bound(tokens, cu_seqlens, max_seqlen)
    if bound == 0:
        return out
    arch = arch or _device_arch(q.device)
    config = config or default_config(head_dim, v.dtype, cdiv(bound, 128) * num_seqs * heads, arch=arch)
    if config.block_n > MAX_BLOCK_N:
        raise ValueError(
            f"config.block_n = {config.block_n} is over {MAX_BLOCK_N}: 256-key tiles with 64-row query tiles "
            "faulted (illegal memory access) on an H200 under Triton 3.6"
        )
    block_d0, block_d1 = _head_dim_split(head_dim)
    strides = (*q.stride()[:2], *k.stride()[:2], *v.stride()[:2], *out.stride()[:2])
    grid = (cdiv(bound, config.block_m), num_seqs, heads)
    launch = fast_launch.launcher(_varlen_attn_fwd, num_warps=config.num_warps, num_stages=config.num_stages)
    launch(
        grid,
        q,
        k,
        v,
        out,
        cu_seqlens,
        *strides,
        float(scale) * _LOG2_E,
        heads // kv_heads,  # GROUP_SIZE
        head_dim,  # HEAD_DIM
        block_d0,  # BLOCK_D0
        block_d1,  # BLOCK_D1
        config.block_m,  # BLOCK_M
        config.block_n,  # BLOCK_N
        _common_alignment(strides),  # ALIGN
        _fp32_dot_precision(arch) if v.dtype == torch.float32 else None,  # DOT_PRECISION
    )
    return out


def variant_layouts(
    heads: int, head_dim: int, dtype: torch.dtype, device: torch.device, *, arch: str | None = None
) -> list[tuple[int, int]]:
    """``(segments, tokens each)`` of calls launching every tile configuration a ``heads``-head call
    can get on ``arch``, for ``TritonAttention.prepare`` to compile before serving."""
    arch = arch or _device_arch(device)
    first: dict[TritonAttnConfig, tuple[int, int]] = {}
    for tiles in range(1, 2 * _FEW_QUERY_TILES + 2):
        first.setdefault(default_config(head_dim, dtype, tiles * heads, arch=arch), (1, tiles * 128))
    return sorted(first.values())


def _device_arch(device: torch.device) -> str:
    """``"gfx942"``, ``"sm_90"``, ...: the architecture of a GPU ``device``; ``"cpu"`` off the GPU."""
    if device.type != "cuda":
        return "cpu"
    return _gpu_arch(torch.cuda.current_device() if device.index is None else device.index)


@functools.cache
def _gpu_arch(index: int) -> str:
    # Cached: a device query per launch would be host work on the graph-capture path.
    props = torch.cuda.get_device_properties(index)
    if torch.version.hip is not None:
        return props.gcnArchName.split(":")[0]  # "gfx942:sramecc+:xnack-" -> "gfx942"
    return f"sm_{props.major}{props.minor}"


def _fp32_dot_precision(arch: str) -> str:
    """fp32 products near fp32 accuracy (the default would round them to tf32).

    NVIDIA: three tf32 tensor-core products ("tf32x3"); the exact "ieee" FMA path spills registers
    at every tile size tried on sm_90. AMD: "ieee", compiled without spills on gfx942 and gfx950 at
    the fp32 tiles of ``_amd_config``.
    """
    return "ieee" if arch.startswith("gfx") else "tf32x3"


def _common_alignment(strides: tuple[int, ...]) -> int:
    """The largest power of two up to 16 dividing every token and head stride (in elements)."""
    align = 16
    for stride in strides:
        while stride % align:
            align //= 2
    return align


def _head_dim_split(head_dim: int) -> tuple[int, int]:
    """``(power-of-two head part, masked power-of-two tail or 0)``: 72 -> (64, 16), 128 -> (128, 0);
    ``tl.dot`` needs power-of-two sides of at least 16."""
    head = 1 << (head_dim.bit_length() - 1)
    rest = head_dim - head
    return head, (max(16, next_power_of_2(rest)) if rest else 0)


@triton.jit
def _varlen_attn_fwd(
    Q,
    K,
    V,
    Out,
    cu_seqlens,
    stride_qn,
    stride_qh,
    stride_kn,
    stride_kh,
    stride_vn,
    stride_vh,
    stride_on,
    stride_oh,
    qk_scale_log2,
    GROUP_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D0: tl.constexpr,
    BLOCK_D1: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ALIGN: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    block_m = tl.program_id(0)
    seq = tl.program_id(1)
    head = tl.program_id(2)
    seq_start = tl.load(cu_seqlens + seq)
    seq_len = tl.load(cu_seqlens + seq + 1) - seq_start
    # The grid is sized by max_seqlen: tiles past this segment's end have nothing to do.
    if block_m * BLOCK_M >= seq_len:
        return
    dtype = V.dtype.element_ty
    row0 = seq_start.to(tl.int64)
    kv_head = head // GROUP_SIZE
    offs_m = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d0 = tl.arange(0, BLOCK_D0)
    m_valid = offs_m < seq_len
    # Head offsets are multiples of ALIGN elements (checked on the host): without this hint a head
    # stride like 72 defeats vectorised loads and with them the pipelined async copies.
    # Rows are never masked (rows past the segment re-read its last row, and are not stored); only
    # the head-dim tail, by column. 2-D masks on a peeled partial key tile gave NaNs under Triton 3.6
    # (e41e5b3).
    offs_m_read = tl.minimum(offs_m, seq_len - 1)
    q_rows = Q + tl.multiple_of(row0 * stride_qn + head * stride_qh, ALIGN) + offs_m_read[:, None] * stride_qn
    q0 = tl.load(q_rows + offs_d0[None, :]).to(dtype)
    acc0 = tl.zeros([BLOCK_M, BLOCK_D0], dtype=tl.float32)
    if BLOCK_D1 > 0:
        offs_d1 = BLOCK_D0 + tl.arange(0, BLOCK_D1)
        d1_valid = offs_d1 < HEAD_DIM
        q1 = _load_tail(q_rows, offs_d1, HEAD_DIM, BLOCK_D0, BLOCK_D1)
        q1 = tl.where(d1_valid[None, :], q1, 0.0).to(dtype)
        acc1 = tl.zeros([BLOCK_M, BLOCK_D1], dtype=tl.float32)
    else:
        # Placeholders, never read: no tail columns for a power-of-two head dim.
        q1 = q0
        acc1 = tl.zeros([1], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    k_base = K + tl.multiple_of(row0 * stride_kn + kv_head * stride_kh, ALIGN)
    v_base = V + tl.multiple_of(row0 * stride_vn + kv_head * stride_vh, ALIGN)

    # One loop, every tile bounds-checked: peeling the partial last tile gave NaNs at d80 (Triton 3.6).
    for start_n in range(0, seq_len, BLOCK_N):
        acc0, acc1, m_i, l_i = _attend_tile(
            acc0, acc1, m_i, l_i, q0, q1, k_base, v_base, stride_kn, stride_vn, start_n, seq_len,
            qk_scale_log2, HEAD_DIM, BLOCK_D0, BLOCK_D1, BLOCK_N, DOT_PRECISION,
        )  # fmt: skip

    inv_l = 1.0 / l_i
    out_rows = Out + tl.multiple_of(row0 * stride_on + head * stride_oh, ALIGN) + offs_m[:, None] * stride_on
    tl.store(out_rows + offs_d0[None, :], (acc0 * inv_l[:, None]).to(dtype), mask=m_valid[:, None])
    if BLOCK_D1 > 0:
        tl.store(
            out_rows + offs_d1[None, :],
            (acc1 * inv_l[:, None]).to(dtype),
            mask=m_valid[:, None] & d1_valid[None, :],
        )


@triton.jit
def _attend_tile(
    acc0,
    acc1,
    m_i,
    l_i,
    q0,
    q1,
    k_base,
    v_base,
    stride_kn,
    stride_vn,
    start_n,
    seq_len,
    qk_scale_log2,
    HEAD_DIM: tl.constexpr,
    BLOCK_D0: tl.constexpr,
    BLOCK_D1: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One key/value tile of the online softmax: scores in log2 units, rescale, accumulate."""
    dtype = q0.dtype
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d0 = tl.arange(0, BLOCK_D0)
    # Keys past the segment re-read its last row: their scores become -inf below, so they weigh
    # exactly 0, and every address stays inside the segment (no masked loads, see the kernel).
    offs_n_read = tl.minimum(offs_n, seq_len - 1)
    k_rows = k_base + offs_n_read[:, None] * stride_kn
    v_rows = v_base + offs_n_read[:, None] * stride_vn
    k0 = tl.load(k_rows + offs_d0[None, :])
    scores = tl.dot(q0, tl.trans(k0.to(dtype)), input_precision=DOT_PRECISION)
    if BLOCK_D1 > 0:
        offs_d1 = BLOCK_D0 + tl.arange(0, BLOCK_D1)
        k1 = _load_tail(k_rows, offs_d1, HEAD_DIM, BLOCK_D0, BLOCK_D1)
        scores = tl.dot(q1, tl.trans(k1.to(dtype)), scores, input_precision=DOT_PRECISION)
    if start_n + BLOCK_N > seq_len:
        # Only a segment's last tile can run past it: a branch keeps the mask off the full tiles
        # (e3b9822); unlike peeling that tile, it stays correct.
        scores = tl.where((offs_n < seq_len)[None, :], scores, float("-inf"))
    # Every tile holds at least one valid key, so m_new is finite and exp2(-inf - m_new) is 0.
    m_new = tl.maximum(m_i, tl.max(scores, 1) * qk_scale_log2)
    p = tl.math.exp2(scores * qk_scale_log2 - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    p = p.to(dtype)
    v0 = tl.load(v_rows + offs_d0[None, :])
    acc0 = tl.dot(p, v0, acc0 * alpha[:, None], input_precision=DOT_PRECISION)
    if BLOCK_D1 > 0:
        v1 = _load_tail(v_rows, offs_d1, HEAD_DIM, BLOCK_D0, BLOCK_D1)
        acc1 = tl.dot(p, v1, acc1 * alpha[:, None], input_precision=DOT_PRECISION)
    return acc0, acc1, m_new, l_i


@triton.jit
def _load_tail(rows, offs_d1, HEAD_DIM: tl.constexpr, BLOCK_D0: tl.constexpr, BLOCK_D1: tl.constexpr):
    """The head-dim tail ``[rows, BLOCK_D1]``, zeros past ``HEAD_DIM`` (masked by column only).

    Re-reading the last column instead defeats vectorised loads (1.65x slower at d72 on an H200).
    """
    if BLOCK_D0 + BLOCK_D1 == HEAD_DIM:
        return tl.load(rows + offs_d1[None, :])
    return tl.load(rows + offs_d1[None, :], mask=(offs_d1 < HEAD_DIM)[None, :], other=0.0)
