"""Varlen non-causal attention for Hopper (sm_90) in Triton's Gluon dialect: FlashAttention-3's schedule.

The schedule: docs/long-sequences.md, "`gluon_attn`: FlashAttention-3's schedule in Gluon".
Invariants: segment bounds are read on the device, so a launch is capturable; no atomics, and a split
last wave is merged in a fixed order, so it is deterministic. Calls outside its scope
(``gluon_unsupported_reason``), and a shape this Triton fails to compile (logged once), run
``triton_attn``.
"""

from __future__ import annotations

import functools
import logging

import torch
from triton.compiler.errors import CompilationError
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from . import fast_launch
from .launch_math import cdiv
from .tail_split import TailSplit, merge_tail, partials, plan_tail_split
from .triton_attn import triton_varlen_attention
from .varlen_args import check_varlen_inputs, longest_segment_bound, varlen_output

logger = logging.getLogger(__name__)

GLUON_HEAD_DIMS = (64, 72, 80)
CONSUMER_ROWS = 64  # query rows per consumer warpgroup
BLOCK_N = 128  # keys per tile
NUM_STAGES = 3  # K/V ring slots: 40 KB each at head dim 72-80, 140 KB (150 with 3 consumers) with Q
# Three consumers (192 rows) from this many waves; below it, fewer, longer programs leave SMs idle.
# The crossover: docs/benchmarks.md, "`rocm-vit tune`".
THREE_CONSUMER_WAVES = 1.5
# setmaxnreg requests of the worker consumers (the first consumer, Triton's default partition, gets
# what is left of the pool) and of the one-warp loader. With three, 160 registers leave no room for
# QK(j) and PV(j - 1) in flight together (it spilled), so their warpgroups run each tile in series.
CONSUMER_REGS = {2: 224, 3: 160}
LOADER_REGS = 24
# 128-key tiles, 3 stages and no ping-pong between consumers: the alternatives measured slower or
# within noise (docs/long-sequences.md, "Tried and dropped").

# Triton 3.9 renamed the TMA load; the 3.6 name raises there.
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_LOG2_E = 1.4426950408889634
_PART_WIDTH = gl.constexpr(80)  # columns of a split program's partial output: the 64 + 16 it computes
_GL_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}


def gluon_varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int | None,
    scale: float,
    *,
    out: torch.Tensor | None = None,
    three_consumer_waves: float | None = None,
) -> torch.Tensor:
    """Non-causal attention within each segment of packed ``q`` ``[N, H, D]``, ``k``/``v`` ``[N, KH, D]``:
    the contract of ``triton_varlen_attention``. ``three_consumer_waves``: from how many waves programs
    get three consumers (``None``: ``THREE_CONSUMER_WAVES``; tuned per GPU).
    """
    check_varlen_inputs(q, k, v, cu_seqlens, max_seqlen)
    unsupported = gluon_unsupported_reason(q, k, v)
    key = (q.shape[2], q.dtype)
    if unsupported is not None or key in _failed_to_compile:
        return triton_varlen_attention(q, k, v, cu_seqlens, max_seqlen, scale, out=out)
    tokens, heads, head_dim = q.shape
    out = varlen_output(q, v, out)
    num_seqs = cu_seqlens.shape[0] - 1
    bound = longest_segment_bound(tokens, cu_seqlens, max_seqlen)
    if bound == 0:
        return out
    cu_seqlens = cu_seqlens.to(device=q.device, dtype=torch.int32, non_blocking=True)
    descriptors = (*_descriptors(q, CONSUMER_ROWS), *_descriptors(k, BLOCK_N), *_descriptors(v, BLOCK_N))
    sms = _sm_count(q.device.index or 0)
    waves = THREE_CONSUMER_WAVES if three_consumer_waves is None else three_consumer_waves
    consumers = consumer_warpgroups(bound, heads * num_seqs, sms, waves)
    block_rows = consumers * CONSUMER_ROWS
    launch = functools.partial(_launch, descriptors, out, cu_seqlens, float(scale) * _LOG2_E, head_dim, consumers)
    # Equal segments (one image, a video's frames): the host knows every program's work and can split
    # the last wave (backends/tail_split.py). Other layouts run one launch.
    plan = None
    if bound * num_seqs == tokens:
        plan = plan_tail_split(bound, block_rows, BLOCK_N, heads * num_seqs, sms)
    try:
        if plan is None:
            launch((cdiv(bound, block_rows), heads, num_seqs))
        else:
            if plan.first_tail_block:
                launch((plan.first_tail_block, heads, num_seqs))
            part_o, part_ml = partials(plan, block_rows, num_seqs, heads, _PART_WIDTH.value, q.device)
            launch((plan.tail_blocks * plan.splits, heads, num_seqs), part_o, part_ml, plan)
            merge_tail(part_o, part_ml, out, cu_seqlens, plan.first_tail_block * block_rows)
    except CompilationError as err:
        _failed_to_compile.add(key)
        logger.error("gluon_attn does not compile for head dim %d %s with this Triton; triton_attn runs: %s", *key, err)
        return triton_varlen_attention(q, k, v, cu_seqlens, max_seqlen, scale, out=out)
    return out


def _launch(
    descriptors: tuple[TensorDescriptor, ...],
    out: torch.Tensor,
    cu_seqlens: torch.Tensor,
    qk_scale_log2: float,
    head_dim: int,
    consumers: int,
    grid: tuple[int, int, int],
    part_o: torch.Tensor | None = None,
    part_ml: torch.Tensor | None = None,
    plan: TailSplit | None = None,
) -> None:
    """One launch of the kernel: whole programs into ``out``, or a tail split's programs into partials."""
    fast_launch.launcher(_attn_fwd, num_warps=4)(
        grid,
        *descriptors,
        out,
        cu_seqlens,
        out.stride(0),
        out.stride(1),
        qk_scale_log2,
        part_o,
        part_ml,
        None if plan is None else plan.first_tail_block,
        1 if plan is None else plan.splits,
        head_dim,  # HEAD_DIM
        BLOCK_N,
        NUM_STAGES,
        CONSUMER_REGS[consumers],
        LOADER_REGS,
        plan is not None,  # SPLIT
        consumers,  # CONSUMERS
    )


def variant_layouts(
    heads: int, device: torch.device, three_consumer_waves: float | None = None
) -> list[tuple[int, int]]:
    """``(segments, tokens each)`` of calls launching every variant a ``heads``-head call can (two or
    three consumers, whole and split), for ``GluonAttention.prepare`` to compile before serving."""
    sms = _sm_count(device.index or 0)
    waves = THREE_CONSUMER_WAVES if three_consumer_waves is None else three_consumer_waves
    first: dict[tuple[int, bool], tuple[int, int]] = {}
    candidates = (
        (segments, tokens)
        for segments in (1, 2, 4, 8, 16, 32, 64)
        for tokens in range(BLOCK_N, _LONGEST_VARIANT_IMAGE // segments + 1, BLOCK_N)
    )
    for segments, tokens in candidates:
        consumers = consumer_warpgroups(tokens, heads * segments, sms, waves)
        split = plan_tail_split(tokens, consumers * CONSUMER_ROWS, BLOCK_N, heads * segments, sms) is not None
        first.setdefault((consumers, split), (segments, tokens))
        if len(first) == 4:  # two and three consumers, whole and split: every variant there is
            break
    return sorted(first.values())


# The most tokens ``variant_layouts`` tries in one call: 64 MP of patches, past what a checkpoint's limits let in.
_LONGEST_VARIANT_IMAGE = 65536


def consumer_warpgroups(longest_segment: int, programs_per_block: int, sms: int, three_from_waves: float) -> int:
    """Consumer warpgroups per program: three once the programs fill ``three_from_waves`` waves."""
    return 3 if three_consumer_programs(longest_segment, programs_per_block) >= three_from_waves * sms else 2


def three_consumer_programs(longest_segment: int, programs_per_block: int) -> int:
    """Programs of a launch with three consumer warpgroups (192 query rows each)."""
    return cdiv(longest_segment, 3 * CONSUMER_ROWS) * programs_per_block


def gluon_unsupported_reason(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    """Why this kernel does not take these tensors (``triton_attn`` runs them), or ``None``."""
    if q.dtype not in _GL_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"q, k, v are {q.dtype}, {k.dtype}, {v.dtype}; the kernel takes one of bf16 or fp16 for all three"
    if q.shape[2] not in GLUON_HEAD_DIMS:
        return f"head dim {q.shape[2]} is not one of {GLUON_HEAD_DIMS}"
    if k.shape[1] != q.shape[1]:
        return f"{k.shape[1]} k/v heads for {q.shape[1]} q heads (grouped-query attention)"
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        strides_bytes = [stride * tensor.element_size() for stride in tensor.stride()[:2]]
        if tensor.data_ptr() % 16 or any(stride % 16 for stride in strides_bytes):
            return f"{name}'s base or token/head strides ({strides_bytes} B) are not 16-byte aligned, as TMA needs"
    if q.device.type != "cuda" or _capability(q.device.index or 0) != (9, 0):
        return f"q is on {q.device}, not an sm_90 GPU"
    return None


_failed_to_compile: set[tuple[int, torch.dtype]] = set()


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


@functools.cache
def _sm_count(index: int) -> int:
    # One program per SM: 144 KB of shared memory and the whole register file at d72.
    return torch.cuda.get_device_properties(index).multi_processor_count


def _descriptors(x: torch.Tensor, rows: int) -> tuple[TensorDescriptor, TensorDescriptor]:
    """TMA descriptors over ``x`` ``[N, H, D]`` for ``rows`` x 64 and ``rows`` x 16 columns, built once
    per pointer and shape (host time every layer paid), over a ``_DevicePointer`` so the cache holds
    no tensor alive."""
    key = (x.data_ptr(), x.shape, x.stride(), x.dtype, rows)
    pair = _kept_descriptors.get(key)
    if pair is None:
        base = _DevicePointer(x.data_ptr(), x.dtype) if _POINTER_BASES else x
        shape, strides = list(x.shape), list(x.stride())
        pair = tuple(
            TensorDescriptor(base, shape, strides, [rows, 1, width], _shared_layout(rows, width, x.dtype))
            for width in (64, 16)
        )
        if _POINTER_BASES:
            if len(_kept_descriptors) >= _KEPT_DESCRIPTORS:
                _kept_descriptors.clear()
            _kept_descriptors[key] = pair
    return pair


class _DevicePointer:
    """What a descriptor reads of its base tensor: the address and the dtype."""

    __slots__ = ("_address", "dtype")

    def __init__(self, address: int, dtype: torch.dtype) -> None:
        self._address = address
        self.dtype = dtype

    def data_ptr(self) -> int:
        return self._address


def _pointer_bases_specialise_as_tensors() -> bool:
    """Whether Triton specialises a descriptor over a ``_DevicePointer`` as over its tensor; else
    descriptors are built per launch."""
    try:
        from triton._C.libtriton import native_specialize_impl
        from triton.backends.compiler import BaseBackend

        x = torch.empty(8, 1, 80, dtype=torch.bfloat16)
        layout = _shared_layout(8, 64, x.dtype)
        over = [
            TensorDescriptor(base, list(x.shape), list(x.stride()), [8, 1, 64], layout)
            for base in (x, _DevicePointer(x.data_ptr(), x.dtype))
        ]
        return len({native_specialize_impl(BaseBackend, desc, False, True, True) for desc in over}) == 1
    except Exception:  # an internal moved: the plain path
        logger.info("gluon_attn builds TMA descriptors per launch: pointer bases do not specialise as tensors")
        return False


# Descriptors of recent tensors: a layout's layers reuse a few addresses; cleared when full.
_KEPT_DESCRIPTORS = 256
_kept_descriptors: dict[tuple, tuple[TensorDescriptor, TensorDescriptor]] = {}


@functools.cache
def _shared_layout(rows: int, width: int, dtype: torch.dtype) -> gl.NVMMASharedLayout:
    # Six per call otherwise, on the eager path where host time is what a small image waits on.
    return gl.NVMMASharedLayout.get_default_for([rows, 1, width], _GL_DTYPES[dtype])


_POINTER_BASES = _pointer_bases_specialise_as_tensors()


# ---------------------------------------------------------------------------------------------
# The kernel. `ruff format` is off below: Gluon's long argument lists read better packed.
# mbarrier protocol (barriers live in shared memory, initialised by the whole CTA before
# gl.warp_specialize, which begins with a CTA-wide barrier); C = CONSUMERS:
#   q_ready[c]  count 1: the loader's TMA of consumer c's 64 query rows completes it; c waits once.
#   k_ready[s], v_ready[s]  count 1: the loader's TMA of tile t into slot s = t % NUM_STAGES completes
#       phase t // NUM_STAGES; a consumer waits parity (t // NUM_STAGES) & 1. It cannot fall a whole
#       phase behind: the loader refills slot s only after that consumer released it (below).
#   k_free[s], v_free[s]  count C: each consumer arrives once per tile, on k_free after its QK wait and
#       on v_free after its PV wait. The loader waits parity ((t // NUM_STAGES) & 1) ^ 1 before loading
#       tile t: for t < NUM_STAGES that is the phase before a fresh barrier's first, which counts as
#       complete, so the first NUM_STAGES loads start at once; later it waits for tile t - NUM_STAGES's
#       release. The loader never waits on the last NUM_STAGES releases, so the last PV arrives on none.
# fmt: off


# The split's count and first block are arguments, unspecialized: a kernel variant per split plan
# compiled inside the requests that first needed it (docs/design.md, "Compiles before serving").
@gluon.jit(do_not_specialize=["first_tail_block", "splits"])
def _attn_fwd(q_desc0, q_desc1, k_desc0, k_desc1, v_desc0, v_desc1, out_ptr, cu_seqlens, stride_on, stride_oh,
              qk_scale_log2, part_o, part_ml, first_tail_block, splits, HEAD_DIM: gl.constexpr,
              BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, CONSUMER_REGS: gl.constexpr,
              LOADER_REGS: gl.constexpr, SPLIT: gl.constexpr, CONSUMERS: gl.constexpr):
    """Whole programs (``SPLIT`` false: grid ``(query blocks, heads, segments)``, into ``out``) or a
    tail split's (grid ``(tail blocks x splits, heads, segments)``: key range ``split`` of query block
    ``first_tail_block + tail block``, into ``part_o``/``part_ml``; backends/tail_split.py). A query
    block is ``CONSUMERS`` x 64 rows."""
    HAS_TAIL: gl.constexpr = HEAD_DIM > 64
    ROWS: gl.constexpr = 64  # per consumer warpgroup
    # program_id(0) is read first. Read after the cu_seqlens loads, it moved into the partitions in
    # the PTX and the kernel ran 20 % slower (H200, Triton 3.6, 1x12800: 2.18 against 1.77 ms).
    if not SPLIT:
        row_start = gl.program_id(0) * (CONSUMERS * ROWS)
    else:
        split = gl.program_id(0) % splits
        tail_block = gl.program_id(0) // splits
        row_start = (first_tail_block + tail_block) * (CONSUMERS * ROWS)
    head = gl.program_id(1)
    seq = gl.program_id(2)
    seq_row0 = gl.load(cu_seqlens + seq)
    seq_len = gl.load(cu_seqlens + seq + 1) - seq_row0
    if row_start >= seq_len:
        return
    n_tiles = gl.cdiv(seq_len, BLOCK_N)
    if not SPLIT:
        tile0 = 0
        part_row0 = 0
    else:
        # Key tiles tile0 .. tile0 + n_tiles of the segment; partial rows part_row0 .. + CONSUMERS x 64.
        tile0 = split * n_tiles // splits
        n_tiles = (split + 1) * n_tiles // splits - tile0
        tail_blocks = gl.num_programs(0) // splits
        part_row0 = ((split * gl.num_programs(2) + seq) * tail_blocks + tail_block) * (CONSUMERS * ROWS)

    dtype: gl.constexpr = k_desc0.dtype
    q0_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, ROWS, 1, 64], q_desc0.layout)
    k0_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, 1, 64], k_desc0.layout)
    v0_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, 1, 64], v_desc0.layout)
    if HAS_TAIL:
        q1_smem = gl.allocate_shared_memory(dtype, [CONSUMERS, ROWS, 1, 16], q_desc1.layout)
        k1_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, 1, 16], k_desc1.layout)
        v1_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, 1, 16], v_desc1.layout)
    else:
        q1_smem = q0_smem
        k1_smem = k0_smem
        v1_smem = v0_smem
    q_ready = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    k_free = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_free = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(CONSUMERS):
        mbarrier.init(q_ready.index(i), count=1)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_free.index(i), count=CONSUMERS)
        mbarrier.init(v_free.index(i), count=CONSUMERS)

    # The argument tuples are written inline: a tuple assigned to a name first turns its constexpr
    # members into tensors. The first consumer is the default partition (the kernel's 4 warps).
    if CONSUMERS == 2:
        gl.warp_specialize([
            (_consumer, (0, q0_smem, q1_smem, k0_smem, k1_smem, v0_smem, v1_smem, q_ready, k_ready, v_ready, k_free,
                         v_free, out_ptr, seq_row0, seq_len, row_start, head, stride_on, stride_oh, qk_scale_log2,
                         tile0, n_tiles, part_o, part_ml, part_row0, HEAD_DIM, BLOCK_N, NUM_STAGES, SPLIT, True)),
            (_consumer, (1, q0_smem, q1_smem, k0_smem, k1_smem, v0_smem, v1_smem, q_ready, k_ready, v_ready, k_free,
                         v_free, out_ptr, seq_row0, seq_len, row_start, head, stride_on, stride_oh, qk_scale_log2,
                         tile0, n_tiles, part_o, part_ml, part_row0, HEAD_DIM, BLOCK_N, NUM_STAGES, SPLIT, True)),
            (_loader, (q_desc0, q_desc1, k_desc0, k_desc1, v_desc0, v_desc1, q0_smem, q1_smem, k0_smem, k1_smem,
                       v0_smem, v1_smem, q_ready, k_ready, v_ready, k_free, v_free, seq_row0, row_start, head, tile0,
                       n_tiles, HAS_TAIL, BLOCK_N, NUM_STAGES, CONSUMERS)),
        ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
    else:
        gl.warp_specialize([
            (_consumer, (0, q0_smem, q1_smem, k0_smem, k1_smem, v0_smem, v1_smem, q_ready, k_ready, v_ready, k_free,
                         v_free, out_ptr, seq_row0, seq_len, row_start, head, stride_on, stride_oh, qk_scale_log2,
                         tile0, n_tiles, part_o, part_ml, part_row0, HEAD_DIM, BLOCK_N, NUM_STAGES, SPLIT, False)),
            (_consumer, (1, q0_smem, q1_smem, k0_smem, k1_smem, v0_smem, v1_smem, q_ready, k_ready, v_ready, k_free,
                         v_free, out_ptr, seq_row0, seq_len, row_start, head, stride_on, stride_oh, qk_scale_log2,
                         tile0, n_tiles, part_o, part_ml, part_row0, HEAD_DIM, BLOCK_N, NUM_STAGES, SPLIT, False)),
            (_consumer, (2, q0_smem, q1_smem, k0_smem, k1_smem, v0_smem, v1_smem, q_ready, k_ready, v_ready, k_free,
                         v_free, out_ptr, seq_row0, seq_len, row_start, head, stride_on, stride_oh, qk_scale_log2,
                         tile0, n_tiles, part_o, part_ml, part_row0, HEAD_DIM, BLOCK_N, NUM_STAGES, SPLIT, False)),
            (_loader, (q_desc0, q_desc1, k_desc0, k_desc1, v_desc0, v_desc1, q0_smem, q1_smem, k0_smem, k1_smem,
                       v0_smem, v1_smem, q_ready, k_ready, v_ready, k_free, v_free, seq_row0, row_start, head, tile0,
                       n_tiles, HAS_TAIL, BLOCK_N, NUM_STAGES, CONSUMERS)),
        ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, LOADER_REGS])


@gluon.jit
def _loader(q_desc0, q_desc1, k_desc0, k_desc1, v_desc0, v_desc1, q0_smem, q1_smem, k0_smem, k1_smem, v0_smem,
            v1_smem, q_ready, k_ready, v_ready, k_free, v_free, seq_row0, row_start, head, tile0, n_tiles,
            HAS_TAIL: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, CONSUMERS: gl.constexpr):
    for c in gl.static_range(CONSUMERS):
        _load_rows(q_desc0, q_desc1, q0_smem.index(c), q1_smem.index(c), q_ready.index(c),
                   seq_row0 + row_start + c * 64, head, 64, HAS_TAIL)
    for t in range(n_tiles):
        slot = t % NUM_STAGES
        free_phase = ((t // NUM_STAGES) & 1) ^ 1
        row = seq_row0 + (tile0 + t) * BLOCK_N
        mbarrier.wait(k_free.index(slot), free_phase)
        _load_rows(k_desc0, k_desc1, k0_smem.index(slot), k1_smem.index(slot), k_ready.index(slot), row, head,
                   BLOCK_N, HAS_TAIL)
        mbarrier.wait(v_free.index(slot), free_phase)
        _load_rows(v_desc0, v_desc1, v0_smem.index(slot), v1_smem.index(slot), v_ready.index(slot), row, head,
                   BLOCK_N, HAS_TAIL)


@gluon.jit
def _load_rows(desc0, desc1, smem0, smem1, ready, row, head, ROWS: gl.constexpr, HAS_TAIL: gl.constexpr):
    """TMA of rows ``row .. row + ROWS`` of one head: columns 0-63 into smem0, 64-79 into smem1."""
    if HAS_TAIL:
        nbytes: gl.constexpr = ROWS * (64 + 16) * 2
    else:
        nbytes: gl.constexpr = ROWS * 64 * 2
    mbarrier.expect(ready, nbytes)
    _tma_load(desc0, [row, head, 0], ready, smem0)
    if HAS_TAIL:
        _tma_load(desc1, [row, head, 64], ready, smem1)


@gluon.jit
def _consumer(c: gl.constexpr, q0_smem, q1_smem, k0_smem, k1_smem, v0_smem, v1_smem, q_ready, k_ready, v_ready,
              k_free, v_free, out_ptr, seq_row0, seq_len, row_start, head, stride_on, stride_oh, qk_scale_log2,
              tile0, n_tiles, part_o, part_ml, part_row0, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
              NUM_STAGES: gl.constexpr, SPLIT: gl.constexpr, OVERLAP: gl.constexpr):
    """Consumer warpgroup ``c``: query rows ``row_start + 64 c ..`` against key tiles ``tile0 ..
    tile0 + n_tiles`` of the segment (ring slots and phases count from ``tile0``). ``OVERLAP``: QK of
    a tile runs with PV of the one before (``_step``)."""
    HAS_TAIL: gl.constexpr = HEAD_DIM > 64
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o0_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, 64, 16])
    o1_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, 16, 16])
    p0_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o0_layout, k_width=2)
    p1_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o1_layout, k_width=2)

    q0 = q0_smem.index(c).reshape([64, 64])
    q1 = q1_smem.index(c).reshape([64, 16]) if HAS_TAIL else q0
    s_zero = gl.zeros([64, BLOCK_N], gl.float32, s_layout)
    mbarrier.wait(q_ready.index(c), 0)

    # Tile 0: QK and its softmax (masked when it is also the segment's last tile).
    m_i = gl.full([64], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([64], gl.float32, gl.SliceLayout(1, s_layout))
    mbarrier.wait(k_ready.index(0), 0)
    s = warpgroup_mma_wait(0, deps=[_qk(q0, q1, k0_smem, k1_smem, 0, s_zero, HAS_TAIL, BLOCK_N)])
    mbarrier.arrive(k_free.index(0))
    p, _, m_i, l_i = _softmax(s, m_i, l_i, tile0, seq_len, qk_scale_log2, s_layout, BLOCK_N, True)
    p_in = gl.convert_layout(p.to(k0_smem.dtype), p0_layout)
    o0 = gl.zeros([64, 64], gl.float32, o0_layout)
    o1 = gl.zeros([64, 16], gl.float32, o1_layout)

    # Tiles 1 .. n_tiles - 2 are whole: no key mask. Masking inside the loop kept the column indices
    # live across it (32 registers at BLOCK_N = 128): 1.83 against 1.77 ms at 1x12800 (H200).
    for j in range(1, n_tiles - 1):
        p_in, o0, o1, m_i, l_i = _step(j, tile0, q0, q1, k0_smem, k1_smem, v0_smem, v1_smem, k_ready, v_ready,
                                       k_free, v_free, s_zero, p_in, o0, o1, m_i, l_i, seq_len, qk_scale_log2,
                                       s_layout, o0_layout, o1_layout, p0_layout, p1_layout, HAS_TAIL, BLOCK_N,
                                       NUM_STAGES, False, OVERLAP)
    if n_tiles > 1:
        p_in, o0, o1, m_i, l_i = _step(n_tiles - 1, tile0, q0, q1, k0_smem, k1_smem, v0_smem, v1_smem, k_ready,
                                       v_ready, k_free, v_free, s_zero, p_in, o0, o1, m_i, l_i, seq_len,
                                       qk_scale_log2, s_layout, o0_layout, o1_layout, p0_layout, p1_layout, HAS_TAIL,
                                       BLOCK_N, NUM_STAGES, True, OVERLAP)

    # PV of the last tile.
    last = n_tiles - 1
    slot = last % NUM_STAGES
    mbarrier.wait(v_ready.index(slot), (last // NUM_STAGES) & 1)
    o0_token, o1_token = _pv(p_in, v0_smem, v1_smem, slot, o0, o1, p1_layout, HAS_TAIL, BLOCK_N)
    o0, o1 = _pv_wait(o0_token, o1_token, HAS_TAIL)

    if not SPLIT:
        rows_start = row_start + c * 64
        _store(out_ptr, o0, l_i, rows_start, seq_len, seq_row0, head, stride_on, stride_oh, 0, HEAD_DIM, o0_layout,
               64)
        if HAS_TAIL:
            _store(out_ptr, o1, l_i, rows_start, seq_len, seq_row0, head, stride_on, stride_oh, 64, HEAD_DIM,
                   o1_layout, 16)
    else:
        part_row = part_row0 + c * 64
        _store_row_stats(part_ml, m_i, l_i, part_row, head, s_layout)
        _store_partial(part_o, o0, part_row, head, 0, o0_layout, 64)
        if HAS_TAIL:
            _store_partial(part_o, o1, part_row, head, 64, o1_layout, 16)


@gluon.jit
def _step(j, tile0, q0, q1, k0_smem, k1_smem, v0_smem, v1_smem, k_ready, v_ready, k_free, v_free, s_zero, p_in, o0, o1,
          m_i, l_i, seq_len, qk_scale_log2, s_layout: gl.constexpr, o0_layout: gl.constexpr,
          o1_layout: gl.constexpr, p0_layout: gl.constexpr, p1_layout: gl.constexpr, HAS_TAIL: gl.constexpr,
          BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, MASK: gl.constexpr, OVERLAP: gl.constexpr):
    """Tile ``j`` (the segment's ``tile0 + j``) and PV of tile ``j - 1``. ``OVERLAP``: QK(j) and PV(j - 1)
    issued together, the softmax of j while PV(j - 1) runs; else PV(j - 1), then QK(j), in series. The
    fp32 operations on each row are the same either way."""
    slot = j % NUM_STAGES
    prev = (j - 1) % NUM_STAGES
    if not OVERLAP:
        mbarrier.wait(v_ready.index(prev), ((j - 1) // NUM_STAGES) & 1)
        o0_token, o1_token = _pv(p_in, v0_smem, v1_smem, prev, o0, o1, p1_layout, HAS_TAIL, BLOCK_N)
        o0, o1 = _pv_wait(o0_token, o1_token, HAS_TAIL)
        mbarrier.arrive(v_free.index(prev))
    mbarrier.wait(k_ready.index(slot), (j // NUM_STAGES) & 1)
    s_token = _qk(q0, q1, k0_smem, k1_smem, slot, s_zero, HAS_TAIL, BLOCK_N)
    if OVERLAP:
        mbarrier.wait(v_ready.index(prev), ((j - 1) // NUM_STAGES) & 1)
        o0_token, o1_token = _pv(p_in, v0_smem, v1_smem, prev, o0, o1, p1_layout, HAS_TAIL, BLOCK_N)
        s = warpgroup_mma_wait(2 if HAS_TAIL else 1, deps=[s_token])  # QK done; PV's groups may still run
    else:
        s = warpgroup_mma_wait(0, deps=[s_token])
    mbarrier.arrive(k_free.index(slot))
    p, alpha, m_i, l_i = _softmax(s, m_i, l_i, tile0 + j, seq_len, qk_scale_log2, s_layout, BLOCK_N, MASK)
    if OVERLAP:
        o0, o1 = _pv_wait(o0_token, o1_token, HAS_TAIL)
        mbarrier.arrive(v_free.index(prev))
    if HAS_TAIL:
        o1 = o1 * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o1_layout)), 1)
    o0 = o0 * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o0_layout)), 1)
    p_in = gl.convert_layout(p.to(k0_smem.dtype), p0_layout)
    return p_in, o0, o1, m_i, l_i


@gluon.jit
def _pv(p_in, v0_smem, v1_smem, slot, o0, o1, p1_layout: gl.constexpr, HAS_TAIL: gl.constexpr,
        BLOCK_N: gl.constexpr):
    """Issue ``O += P V`` for the tile in ``slot`` as asynchronous wgmma (the tail as a second group)."""
    o0_token = warpgroup_mma(p_in, v0_smem.index(slot).reshape([BLOCK_N, 64]), o0, is_async=True)
    o1_token = o1
    if HAS_TAIL:
        o1_token = warpgroup_mma(gl.convert_layout(p_in, p1_layout), v1_smem.index(slot).reshape([BLOCK_N, 16]),
                                 o1, is_async=True)
    return o0_token, o1_token


@gluon.jit
def _pv_wait(o0_token, o1_token, HAS_TAIL: gl.constexpr):
    """Wait for ``_pv``'s groups: ``(o0, o1)`` (``o1`` passes through without a tail)."""
    if HAS_TAIL:
        o0, o1 = warpgroup_mma_wait(0, deps=[o0_token, o1_token])
    else:
        o0 = warpgroup_mma_wait(0, deps=[o0_token])
        o1 = o1_token
    return o0, o1


@gluon.jit
def _qk(q0, q1, k0_smem, k1_smem, slot, s_zero, HAS_TAIL: gl.constexpr, BLOCK_N: gl.constexpr):
    """Issue ``S = Q K^T`` for the tile in ``slot`` as asynchronous wgmma (the tail as a second group)."""
    k0 = k0_smem.index(slot).reshape([BLOCK_N, 64]).permute((1, 0))
    s_token = warpgroup_mma(q0, k0, s_zero, use_acc=False, is_async=True)
    if HAS_TAIL:
        k1 = k1_smem.index(slot).reshape([BLOCK_N, 16]).permute((1, 0))
        s_token = warpgroup_mma(q1, k1, s_token, is_async=True)
    return s_token


@gluon.jit
def _softmax(s, m_i, l_i, tile, seq_len, qk_scale_log2, s_layout: gl.constexpr, BLOCK_N: gl.constexpr,
             MASK: gl.constexpr):
    """One online-softmax step in base 2: ``(p, alpha, m, l)``, fp32, the row sum over unrounded ``p``."""
    if MASK and (tile + 1) * BLOCK_N > seq_len:
        # The segment's last tile: TMA read the next segment's keys (or zeros past the tensor).
        cols = tile * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        s = gl.where(gl.expand_dims(cols < seq_len, 0), s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale_log2)
    p = gl.exp2(s * qk_scale_log2 - gl.expand_dims(m_new, 1))
    alpha = gl.exp2(m_i - m_new)
    return p, alpha, m_new, l_i * alpha + gl.sum(p, 1)


@gluon.jit
def _store(out_ptr, o, l_i, rows_start, seq_len, seq_row0, head, stride_on, stride_oh, col0: gl.constexpr,
           HEAD_DIM: gl.constexpr, o_layout: gl.constexpr, WIDTH: gl.constexpr):
    """``o / l`` for the rows inside the segment and the columns below ``HEAD_DIM``."""
    o = o * gl.expand_dims(1.0 / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout)), 1)
    rows = rows_start + gl.arange(0, 64, layout=gl.SliceLayout(1, o_layout))
    cols = col0 + gl.arange(0, WIDTH, layout=gl.SliceLayout(0, o_layout))
    offsets = gl.expand_dims((seq_row0 + rows).to(gl.int64) * stride_on, 1) + gl.expand_dims(cols, 0)
    mask = gl.expand_dims(rows < seq_len, 1) & gl.expand_dims(cols < HEAD_DIM, 0)
    gl.store(out_ptr + head * stride_oh + offsets, o.to(out_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def _store_partial(part_o, o, part_row, head, col0: gl.constexpr, o_layout: gl.constexpr, WIDTH: gl.constexpr):
    """Unnormalised ``o`` of partial rows ``part_row ..`` (every row: the merge masks the segment's end)."""
    rows = part_row + gl.arange(0, 64, layout=gl.SliceLayout(1, o_layout))
    cols = col0 + gl.arange(0, WIDTH, layout=gl.SliceLayout(0, o_layout))
    entries = rows.to(gl.int64) * gl.num_programs(1) + head
    gl.store(part_o + gl.expand_dims(entries * _PART_WIDTH, 1) + gl.expand_dims(cols, 0), o)


@gluon.jit
def _store_row_stats(part_ml, m_i, l_i, part_row, head, s_layout: gl.constexpr):
    """The base-2 row max and row sum of partial rows ``part_row ..``."""
    rows = part_row + gl.arange(0, 64, layout=gl.SliceLayout(1, s_layout))
    entries = rows.to(gl.int64) * gl.num_programs(1) + head
    gl.store(part_ml + 2 * entries, m_i)
    gl.store(part_ml + 2 * entries + 1, l_i)
