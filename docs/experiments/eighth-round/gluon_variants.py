"""Experimental FA3-style varlen (non-causal) attention forward for sm_90a in Triton Gluon 3.6.

Two kernels share the same math:

* ``_attn_fwd_v1``  single partition: K/V tiles arrive by TMA in a NUM_STAGES-deep shared-memory ring,
  each slot guarded by its own mbarrier (K and V separately, so QK^T can start before V lands);
  QK^T of tile j is issued as async wgmma *before* PV of tile j-1, so the tensor core works on
  both while the warps do the softmax of tile j (FA3 "intra-warpgroup overlap").
  num_warps=8 -> BLOCK_M=128 (two warpgroups, 64 rows each); num_warps=4 -> BLOCK_M=64.
* ``_attn_fwd_v2``  warp-specialised: a 1-warp TMA producer partition (few registers) fills the ring
  and waits on "slot free" mbarriers; the default partition (num_warps consumer warps) runs the
  same overlapped loop and releases slots by arriving on those barriers.

Head dim D is split as 64 + 16 (72 -> 64 + 16 with cols 72..79 zero-filled by TMA because the
descriptor's last global dim is the real D; 80 -> 64 + 16; 64 -> 64 only). Descriptors are 3-D over
the strided [T, H, D] view (token stride 3*H*D for a fused qkv), block [rows, 1, 64|16]; the
shared-memory tile is reshaped to 2-D for wgmma.

Segment bounds come from cu_seqlens on the device (no host sync). Keys past the segment end are
masked to -inf by index (TMA may read the next segment's rows); query rows past the end are
computed but not stored.
"""

from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

try:  # the compile-only path (compile_local.py) does not need torch
    import torch
except ImportError:  # pragma: no cover
    torch = None

# Triton 3.9 renamed the TMA load builtin (the old name still exists there but raises).
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
# Triton 3.9 has no gl.thread_barrier; gl.barrier() (cluster=False) lowers to the same CTA barrier.
_thread_barrier = getattr(gl, "thread_barrier", None) or gl.barrier

_LOG2_E = 1.4426950408889634
D0 = 64  # head-dim main part
D1 = 16  # head-dim tail (only when HEAD_DIM > 64)


# --------------------------------------------------------------------------------------------
# shared device helpers
# --------------------------------------------------------------------------------------------


@gluon.jit
def _issue_kv(k_desc0, k_desc1, v_desc0, v_desc1, k0_smem, k1_smem, v0_smem, v1_smem, k_bar, v_bar,
              tile, slot, row0, head, pred, HAS_TAIL: gl.constexpr, BLOCK_N: gl.constexpr):
    """TMA for K and V of key tile ``tile`` into ring slot ``slot`` (predicated)."""
    row = row0 + tile * BLOCK_N
    if HAS_TAIL:
        kv_bytes: gl.constexpr = BLOCK_N * (64 + 16) * 2
    else:
        kv_bytes: gl.constexpr = BLOCK_N * 64 * 2
    kb = k_bar.index(slot)
    mbarrier.expect(kb, kv_bytes, pred=pred)
    _tma_load(k_desc0, [row, head, 0], kb, k0_smem.index(slot), pred=pred)
    if HAS_TAIL:
        _tma_load(k_desc1, [row, head, 64], kb, k1_smem.index(slot), pred=pred)
    vb = v_bar.index(slot)
    mbarrier.expect(vb, kv_bytes, pred=pred)
    _tma_load(v_desc0, [row, head, 0], vb, v0_smem.index(slot), pred=pred)
    if HAS_TAIL:
        _tma_load(v_desc1, [row, head, 64], vb, v1_smem.index(slot), pred=pred)


@gluon.jit
def _issue_k(k_desc0, k_desc1, k0_smem, k1_smem, k_bar, tile, slot, row0, head, pred,
             HAS_TAIL: gl.constexpr, BLOCK_N: gl.constexpr):
    row = row0 + tile * BLOCK_N
    if HAS_TAIL:
        nbytes: gl.constexpr = BLOCK_N * (64 + 16) * 2
    else:
        nbytes: gl.constexpr = BLOCK_N * 64 * 2
    kb = k_bar.index(slot)
    mbarrier.expect(kb, nbytes, pred=pred)
    _tma_load(k_desc0, [row, head, 0], kb, k0_smem.index(slot), pred=pred)
    if HAS_TAIL:
        _tma_load(k_desc1, [row, head, 64], kb, k1_smem.index(slot), pred=pred)


@gluon.jit
def _issue_v(v_desc0, v_desc1, v0_smem, v1_smem, v_bar, tile, slot, row0, head, pred,
             HAS_TAIL: gl.constexpr, BLOCK_N: gl.constexpr):
    row = row0 + tile * BLOCK_N
    if HAS_TAIL:
        nbytes: gl.constexpr = BLOCK_N * (64 + 16) * 2
    else:
        nbytes: gl.constexpr = BLOCK_N * 64 * 2
    vb = v_bar.index(slot)
    mbarrier.expect(vb, nbytes, pred=pred)
    _tma_load(v_desc0, [row, head, 0], vb, v0_smem.index(slot), pred=pred)
    if HAS_TAIL:
        _tma_load(v_desc1, [row, head, 64], vb, v1_smem.index(slot), pred=pred)


@gluon.jit
def _qk(q0_2d, q1_2d, k0_smem, k1_smem, slot, s_zero, HAS_TAIL: gl.constexpr, BLOCK_N: gl.constexpr):
    """Issue S = Q K^T for the tile in ``slot`` as async wgmma (1 or 2 commit groups)."""
    k0 = k0_smem.index(slot).reshape([BLOCK_N, 64]).permute((1, 0))
    s_tok = warpgroup_mma(q0_2d, k0, s_zero, use_acc=False, is_async=True)
    if HAS_TAIL:
        k1 = k1_smem.index(slot).reshape([BLOCK_N, 16]).permute((1, 0))
        s_tok = warpgroup_mma(q1_2d, k1, s_tok, is_async=True)
    return s_tok


@gluon.jit
def _softmax_tile(s, m_i, l_i, tile, seq_len, qk_scale, s_layout: gl.constexpr, BLOCK_N: gl.constexpr,
                  MASK: gl.constexpr = True):
    """Online-softmax step on raw scores ``s``: returns (p fp32, alpha, m_new, l_new).

    MASK=False: the caller guarantees the tile is full (not the segment's last tile). Inside a loop the
    column indices of the mask are loop-invariant, so LLVM hoists them and keeps BLOCK_N / 4 of them
    live across the loop (32 registers at BLOCK_N=128): that made the 160-register consumers spill.
    """
    if MASK and (tile + 1) * BLOCK_N > seq_len:
        # Only a segment's last tile can run past its end (TMA may have read the next segment).
        cols = tile * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        s = gl.where(gl.expand_dims(cols < seq_len, 0), s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
    alpha = gl.exp2(m_i - m_new)
    l_new = l_i * alpha + gl.sum(p, 1)
    return p, alpha, m_new, l_new


@gluon.jit
def _store_out(out_ptr, o, l_i, row_start, seq_len, seq_row0, head, stride_on, stride_oh, col0: gl.constexpr,
               HEAD_DIM: gl.constexpr, o_layout: gl.constexpr, BLOCK_M: gl.constexpr, WIDTH: gl.constexpr):
    inv_l = 1.0 / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
    o = o * gl.expand_dims(inv_l, 1)
    rows = row_start + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
    cols = col0 + gl.arange(0, WIDTH, layout=gl.SliceLayout(0, o_layout))
    offs = gl.expand_dims((seq_row0 + rows).to(gl.int64) * stride_on, 1) + gl.expand_dims(cols, 0)
    mask = gl.expand_dims(rows < seq_len, 1) & gl.expand_dims(cols < HEAD_DIM, 0)
    gl.store(out_ptr + head * stride_oh + offs, o.to(gl.bfloat16), mask=mask)


# --------------------------------------------------------------------------------------------
# v1: single partition
# --------------------------------------------------------------------------------------------


@gluon.jit
def _attn_fwd_v1(q_desc0, q_desc1, k_desc0, k_desc1, v_desc0, v_desc1, out_ptr, cu_seqlens,
                 stride_on, stride_oh, qk_scale,
                 HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                 NUM_STAGES: gl.constexpr, NUM_WARPS: gl.constexpr):
    HAS_TAIL: gl.constexpr = HEAD_DIM > 64
    pid_m = gl.program_id(0)
    head = gl.program_id(1)
    seq = gl.program_id(2)
    seq_row0 = gl.load(cu_seqlens + seq)
    seq_len = gl.load(cu_seqlens + seq + 1) - seq_row0
    row_start = pid_m * BLOCK_M
    if row_start >= seq_len:
        return
    n_tiles = gl.cdiv(seq_len, BLOCK_N)

    # ---- layouts -------------------------------------------------------------------------
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NUM_WARPS, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o0_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NUM_WARPS, 1],
                                                        instr_shape=[16, 64, 16])
    o1_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NUM_WARPS, 1],
                                                        instr_shape=[16, 16, 16])
    p0_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o0_layout, k_width=2)
    p1_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o1_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)

    # ---- shared memory -------------------------------------------------------------------
    q0_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, 1, 64], q_desc0.layout)
    k0_smem = gl.allocate_shared_memory(gl.bfloat16, [NUM_STAGES, BLOCK_N, 1, 64], k_desc0.layout)
    v0_smem = gl.allocate_shared_memory(gl.bfloat16, [NUM_STAGES, BLOCK_N, 1, 64], v_desc0.layout)
    if HAS_TAIL:
        q1_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, 1, 16], q_desc1.layout)
        k1_smem = gl.allocate_shared_memory(gl.bfloat16, [NUM_STAGES, BLOCK_N, 1, 16], k_desc1.layout)
        v1_smem = gl.allocate_shared_memory(gl.bfloat16, [NUM_STAGES, BLOCK_N, 1, 16], v_desc1.layout)
    else:
        q1_smem = q0_smem
        k1_smem = k0_smem
        v1_smem = v0_smem
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bar = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_bar = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(k_bar.index(i), count=1)
        mbarrier.init(v_bar.index(i), count=1)

    # ---- prologue: Q and the first NUM_STAGES K/V tiles ---------------------------------------
    if HAS_TAIL:
        q_bytes: gl.constexpr = BLOCK_M * (64 + 16) * 2
    else:
        q_bytes: gl.constexpr = BLOCK_M * 64 * 2
    mbarrier.expect(q_bar, q_bytes)
    _tma_load(q_desc0, [seq_row0 + row_start, head, 0], q_bar, q0_smem)
    if HAS_TAIL:
        _tma_load(q_desc1, [seq_row0 + row_start, head, 64], q_bar, q1_smem)
    for i in gl.static_range(NUM_STAGES):
        _issue_kv(k_desc0, k_desc1, v_desc0, v_desc1, k0_smem, k1_smem, v0_smem, v1_smem, k_bar, v_bar,
                  i, i, seq_row0, head, i < n_tiles, HAS_TAIL, BLOCK_N)

    q0_2d = q0_smem.reshape([BLOCK_M, 64])
    q1_2d = q1_smem.reshape([BLOCK_M, 16]) if HAS_TAIL else q0_2d
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    mbarrier.wait(q_bar, 0)

    # ---- tile 0 (peeled) -----------------------------------------------------------------
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_layout)
    l_i = gl.zeros([BLOCK_M], gl.float32, row_layout)
    mbarrier.wait(k_bar.index(0), 0)
    s_tok = _qk(q0_2d, q1_2d, k0_smem, k1_smem, 0, s_zero, HAS_TAIL, BLOCK_N)
    s = warpgroup_mma_wait(0, deps=[s_tok])
    p, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, 0, seq_len, qk_scale, s_layout, BLOCK_N)
    p_bf = gl.convert_layout(p.to(gl.bfloat16), p0_layout)
    o0 = gl.zeros([BLOCK_M, 64], gl.float32, o0_layout)
    if HAS_TAIL:
        o1 = gl.zeros([BLOCK_M, 16], gl.float32, o1_layout)
    else:
        o1 = gl.zeros([BLOCK_M, 16], gl.float32, o1_layout)  # unused placeholder

    # ---- steady state: QK(j) || PV(j-1) on the tensor core, softmax(j) on the warps ---------
    for j in range(1, n_tiles):
        slot = j % NUM_STAGES
        prev = (j - 1) % NUM_STAGES
        mbarrier.wait(k_bar.index(slot), (j // NUM_STAGES) & 1)
        s_tok = _qk(q0_2d, q1_2d, k0_smem, k1_smem, slot, s_zero, HAS_TAIL, BLOCK_N)
        mbarrier.wait(v_bar.index(prev), ((j - 1) // NUM_STAGES) & 1)
        o0_tok = warpgroup_mma(p_bf, v0_smem.index(prev).reshape([BLOCK_N, 64]), o0, is_async=True)
        if HAS_TAIL:
            o1_tok = warpgroup_mma(gl.convert_layout(p_bf, p1_layout), v1_smem.index(prev).reshape([BLOCK_N, 16]),
                                   o1, is_async=True)
            s = warpgroup_mma_wait(2, deps=[s_tok])
        else:
            s = warpgroup_mma_wait(1, deps=[s_tok])
        p, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, j, seq_len, qk_scale, s_layout, BLOCK_N)
        if HAS_TAIL:
            o0, o1 = warpgroup_mma_wait(0, deps=[o0_tok, o1_tok])
            o1 = o1 * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o1_layout)), 1)
        else:
            o0 = warpgroup_mma_wait(0, deps=[o0_tok])
        o0 = o0 * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o0_layout)), 1)
        p_bf = gl.convert_layout(p.to(gl.bfloat16), p0_layout)
        # Slot ``prev`` (K and V of tile j-1) is now read by every warp of this CTA's warpgroups;
        # all warps must be past their wgmma wait before the single TMA-issuing thread refills it.
        _thread_barrier()
        nxt = j - 1 + NUM_STAGES
        _issue_kv(k_desc0, k_desc1, v_desc0, v_desc1, k0_smem, k1_smem, v0_smem, v1_smem, k_bar, v_bar,
                  nxt, prev, seq_row0, head, nxt < n_tiles, HAS_TAIL, BLOCK_N)

    # ---- last PV -------------------------------------------------------------------------
    last = n_tiles - 1
    lslot = last % NUM_STAGES
    mbarrier.wait(v_bar.index(lslot), (last // NUM_STAGES) & 1)
    o0_tok = warpgroup_mma(p_bf, v0_smem.index(lslot).reshape([BLOCK_N, 64]), o0, is_async=True)
    if HAS_TAIL:
        o1_tok = warpgroup_mma(gl.convert_layout(p_bf, p1_layout), v1_smem.index(lslot).reshape([BLOCK_N, 16]),
                               o1, is_async=True)
        o0, o1 = warpgroup_mma_wait(0, deps=[o0_tok, o1_tok])
    else:
        o0 = warpgroup_mma_wait(0, deps=[o0_tok])

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(k_bar.index(i))
        mbarrier.invalidate(v_bar.index(i))

    _store_out(out_ptr, o0, l_i, row_start, seq_len, seq_row0, head, stride_on, stride_oh, 0, HEAD_DIM,
               o0_layout, BLOCK_M, 64)
    if HAS_TAIL:
        _store_out(out_ptr, o1, l_i, row_start, seq_len, seq_row0, head, stride_on, stride_oh, 64, HEAD_DIM,
                   o1_layout, BLOCK_M, 16)



# --------------------------------------------------------------------------------------------
# v2: warp-specialised (FA3 layout): 1 TMA producer warp + NUM_CONSUMERS (1..3) consumer
#     warpgroups, each owning 64 query rows. Slots are released by per-warpgroup arrives on
#     k_empty / v_empty (count = NUM_CONSUMERS), so no barrier spans more than one warpgroup.
#     PINGPONG=True adds FA3's inter-warpgroup scheduling ("turn" mbarriers, protocol below).
#
# mbarrier protocols (all barriers are in shared memory, initialised by the whole CTA before
# gl.warp_specialize, which starts with a CTA-wide barrier, so every partition sees them initialised):
#
#   q_bar[c]    count 1. Loader: expect(bytes) + TMA (tx completes it). Consumer c waits parity 0
#               once. One phase in the kernel's life.
#   k_ready[s]  count 1. Loader, tile t in slot s = t % S: expect + TMA -> phase t // S completes.
#   v_ready[s]  Consumers wait parity (t // S) & 1 for tile t. A waiter can not be two phases behind:
#               the loader refills slot s with tile t+S only after k_empty/v_empty[s] phase t // S,
#               which needs this very consumer's arrive for tile t (after its wait).
#   k_empty[s]  count NUM_CONSUMERS: every consumer warpgroup arrives once per tile t (one elected
#   v_empty[s]  thread; Triton puts a 128-thread partition bar.sync before it), k_empty right after
#               its QK(t) wgmma wait, v_empty right after its PV(t) wait. The loader waits parity
#               ((t // S) & 1) ^ 1 before loading tile t into slot s: for t < S that is parity 1 of
#               a fresh barrier (phase 0 in progress), which passes at once ("previous phase
#               complete"); for t >= S it waits for phase (t // S) - 1 = release of tile t - S.
#               The loader never waits for the last S tiles' releases, so consumers need not
#               arrive for the last tile (they don't: no v_empty arrive after the final PV).
#   turn[c]     (PINGPONG only) count 1. A consumer's GEMM-issue "rounds" are r = 0 (QK(0)),
#               r = j for j = 1..n_tiles-1 (QK(j) + PV(j-1)), and r = n_tiles (PV(last)): all
#               consumers of a CTA run the same n_tiles + 1 rounds (n_tiles depends on the segment
#               only; consumers whose rows are all past the end still compute, they only skip the
#               store). Round r of consumer c:  wait(turn[c], parity) -> (wait k_ready / v_ready,
#               issue wgmmas) -> arrive(turn[(c + 1) % N]).
#                 c = 0 waits parity (r & 1) ^ 1: r = 0 passes at once (fresh barrier); round r >= 1
#                   waits for phase r - 1 of turn[0], completed by consumer N-1's arrive after its
#                   round r - 1.
#                 c > 0 waits parity r & 1, i.e. phase r of turn[c], completed by consumer c-1's
#                   arrive after its round r.
#               So rounds run C0 r0, C1 r0, .., C(N-1) r0, C0 r1, ... No phase can be skipped:
#               turn[c] phase r+1 needs consumer c-1's round r+1, which (following the chain back
#               through C0, which needs C(N-1)'s round r) comes after consumer c's round r.
#               The final arrive of C(N-1) (on turn[0], after round n_tiles) has no waiter: harmless.
#               No deadlock with the K/V ring: while consumer c holds its turn for round j it waits
#               at most for k_ready(j) / v_ready(j-1). Every consumer has already *issued* round j-1
#               (C0..C(c-1) even round j), and what follows an issue up to the next turn wait
#               (wgmma waits, k_empty / v_empty arrives, softmax) blocks on nothing, so all
#               releases of tiles <= j-2 arrive; the loader needs releases of tiles <= j - S
#               (S >= 2) for K(j) and of tiles <= j-1-S for V(j-1) (and it issues V(j-1) before K(j)).
# --------------------------------------------------------------------------------------------


@gluon.jit
def _v2_loader(q_desc0, q_desc1, k_desc0, k_desc1, v_desc0, v_desc1, q0_smem, q1_smem, k0_smem, k1_smem,
               v0_smem, v1_smem, q_bar, k_ready, v_ready, k_empty, v_empty, seq_row0, row_start, head, n_tiles,
               HAS_TAIL: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
               NUM_CONSUMERS: gl.constexpr):
    if HAS_TAIL:
        q_bytes: gl.constexpr = 64 * (64 + 16) * 2
    else:
        q_bytes: gl.constexpr = 64 * 64 * 2
    for c in gl.static_range(NUM_CONSUMERS):
        qb = q_bar.index(c)
        mbarrier.expect(qb, q_bytes)
        _tma_load(q_desc0, [seq_row0 + row_start + c * 64, head, 0], qb, q0_smem.index(c))
        if HAS_TAIL:
            _tma_load(q_desc1, [seq_row0 + row_start + c * 64, head, 64], qb, q1_smem.index(c))
    for t in range(n_tiles):
        slot = t % NUM_STAGES
        # Fresh barriers complete the "previous" phase: the first NUM_STAGES waits pass at once.
        ph = ((t // NUM_STAGES) & 1) ^ 1
        mbarrier.wait(k_empty.index(slot), ph)
        _issue_k(k_desc0, k_desc1, k0_smem, k1_smem, k_ready, t, slot, seq_row0, head, True, HAS_TAIL, BLOCK_N)
        mbarrier.wait(v_empty.index(slot), ph)
        _issue_v(v_desc0, v_desc1, v0_smem, v1_smem, v_ready, t, slot, seq_row0, head, True, HAS_TAIL, BLOCK_N)


@gluon.jit
def _turn_wait(turn, c: gl.constexpr, r, PINGPONG: gl.constexpr):
    """Ping-pong: wait until it is consumer c's turn to issue its wgmmas of round r (see protocol)."""
    if PINGPONG:
        if c == 0:
            mbarrier.wait(turn.index(0), (r & 1) ^ 1)
        else:
            mbarrier.wait(turn.index(c), r & 1)


@gluon.jit
def _turn_pass(turn, c: gl.constexpr, PINGPONG: gl.constexpr, NUM_CONSUMERS: gl.constexpr):
    """Ping-pong: hand the tensor core to the next consumer warpgroup (after issuing, not after waiting)."""
    if PINGPONG:
        mbarrier.arrive(turn.index((c + 1) % NUM_CONSUMERS))


@gluon.jit
def _v2_step(j, c: gl.constexpr, q0_2d, q1_2d, k0_smem, k1_smem, v0_smem, v1_smem, k_ready, v_ready, k_empty,
             v_empty, turn, s_zero, p_bf, o0, o1, m_i, l_i, seq_len, qk_scale, s_layout: gl.constexpr,
             o0_layout: gl.constexpr, o1_layout: gl.constexpr, p0_layout: gl.constexpr, p1_layout: gl.constexpr,
             HAS_TAIL: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr, NUM_CONSUMERS: gl.constexpr,
             PINGPONG: gl.constexpr, OVERLAP: gl.constexpr, MASK: gl.constexpr):
    """Round j (1 <= j < n_tiles) of a consumer: QK(j) + PV(j-1) on the tensor core, softmax(j)."""
    slot = j % NUM_STAGES
    prev = (j - 1) % NUM_STAGES
    _turn_wait(turn, c, j, PINGPONG)
    mbarrier.wait(k_ready.index(slot), (j // NUM_STAGES) & 1)
    s_tok = _qk(q0_2d, q1_2d, k0_smem, k1_smem, slot, s_zero, HAS_TAIL, BLOCK_N)
    mbarrier.wait(v_ready.index(prev), ((j - 1) // NUM_STAGES) & 1)
    o0_tok = warpgroup_mma(p_bf, v0_smem.index(prev).reshape([BLOCK_N, 64]), o0, is_async=True)
    if HAS_TAIL:
        o1_tok = warpgroup_mma(gl.convert_layout(p_bf, p1_layout), v1_smem.index(prev).reshape([BLOCK_N, 16]),
                               o1, is_async=True)
    _turn_pass(turn, c, PINGPONG, NUM_CONSUMERS)
    if OVERLAP:
        # intra-warpgroup overlap: only QK(j) is waited for; PV(j-1) runs under the softmax
        if HAS_TAIL:
            s = warpgroup_mma_wait(2, deps=[s_tok])
        else:
            s = warpgroup_mma_wait(1, deps=[s_tok])
    else:
        # no intra-warpgroup overlap (fewer live registers: P(j-1) dies before the softmax);
        # the other consumer warpgroups' GEMMs fill the tensor core meanwhile (use with PINGPONG)
        if HAS_TAIL:
            s, o0, o1 = warpgroup_mma_wait(0, deps=[s_tok, o0_tok, o1_tok])
        else:
            s, o0 = warpgroup_mma_wait(0, deps=[s_tok, o0_tok])
        mbarrier.arrive(v_empty.index(prev))
    mbarrier.arrive(k_empty.index(slot))
    p, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, j, seq_len, qk_scale, s_layout, BLOCK_N, MASK)
    if OVERLAP:
        if HAS_TAIL:
            o0, o1 = warpgroup_mma_wait(0, deps=[o0_tok, o1_tok])
        else:
            o0 = warpgroup_mma_wait(0, deps=[o0_tok])
        mbarrier.arrive(v_empty.index(prev))
    if HAS_TAIL:
        o1 = o1 * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o1_layout)), 1)
    o0 = o0 * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o0_layout)), 1)
    p_bf = gl.convert_layout(p.to(gl.bfloat16), p0_layout)
    return p_bf, o0, o1, m_i, l_i


@gluon.jit
def _v2_consumer(c: gl.constexpr, q0_smem, q1_smem, k0_smem, k1_smem, v0_smem, v1_smem, q_bar, k_ready, v_ready,
                 k_empty, v_empty, turn, out_ptr, seq_row0, seq_len, row_start, head, stride_on, stride_oh,
                 qk_scale, n_tiles, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
                 NUM_CONSUMERS: gl.constexpr, PINGPONG: gl.constexpr, OVERLAP: gl.constexpr):
    HAS_TAIL: gl.constexpr = HEAD_DIM > 64
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o0_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, 64, 16])
    o1_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, 16, 16])
    p0_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o0_layout, k_width=2)
    p1_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o1_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)

    q0_2d = q0_smem.index(c).reshape([64, 64])
    if HAS_TAIL:
        q1_2d = q1_smem.index(c).reshape([64, 16])
    else:
        q1_2d = q0_2d
    s_zero = gl.zeros([64, BLOCK_N], gl.float32, s_layout)
    my_row0 = row_start + c * 64
    mbarrier.wait(q_bar.index(c), 0)

    m_i = gl.full([64], float("-inf"), gl.float32, row_layout)
    l_i = gl.zeros([64], gl.float32, row_layout)
    # round 0: QK(0)
    _turn_wait(turn, c, 0, PINGPONG)
    mbarrier.wait(k_ready.index(0), 0)
    s_tok = _qk(q0_2d, q1_2d, k0_smem, k1_smem, 0, s_zero, HAS_TAIL, BLOCK_N)
    _turn_pass(turn, c, PINGPONG, NUM_CONSUMERS)
    s = warpgroup_mma_wait(0, deps=[s_tok])
    mbarrier.arrive(k_empty.index(0))
    p, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, 0, seq_len, qk_scale, s_layout, BLOCK_N)
    p_bf = gl.convert_layout(p.to(gl.bfloat16), p0_layout)
    o0 = gl.zeros([64, 64], gl.float32, o0_layout)
    o1 = gl.zeros([64, 16], gl.float32, o1_layout)

    # rounds j = 1 .. n_tiles-2: QK(j) + PV(j-1); these tiles are full (no key mask)
    for j in range(1, n_tiles - 1):
        p_bf, o0, o1, m_i, l_i = _v2_step(
            j, c, q0_2d, q1_2d, k0_smem, k1_smem, v0_smem, v1_smem, k_ready, v_ready, k_empty, v_empty, turn,
            s_zero, p_bf, o0, o1, m_i, l_i, seq_len, qk_scale, s_layout, o0_layout, o1_layout, p0_layout, p1_layout,
            HAS_TAIL, BLOCK_N, NUM_STAGES, NUM_CONSUMERS, PINGPONG, OVERLAP, False)
    # round n_tiles-1 (peeled): the segment's last tile, the only one that may need the key mask
    if n_tiles > 1:
        p_bf, o0, o1, m_i, l_i = _v2_step(
            n_tiles - 1, c, q0_2d, q1_2d, k0_smem, k1_smem, v0_smem, v1_smem, k_ready, v_ready, k_empty, v_empty,
            turn, s_zero, p_bf, o0, o1, m_i, l_i, seq_len, qk_scale, s_layout, o0_layout, o1_layout, p0_layout,
            p1_layout, HAS_TAIL, BLOCK_N, NUM_STAGES, NUM_CONSUMERS, PINGPONG, OVERLAP, True)

    # round n_tiles: PV(last)
    last = n_tiles - 1
    lslot = last % NUM_STAGES
    _turn_wait(turn, c, n_tiles, PINGPONG)
    mbarrier.wait(v_ready.index(lslot), (last // NUM_STAGES) & 1)
    o0_tok = warpgroup_mma(p_bf, v0_smem.index(lslot).reshape([BLOCK_N, 64]), o0, is_async=True)
    if HAS_TAIL:
        o1_tok = warpgroup_mma(gl.convert_layout(p_bf, p1_layout), v1_smem.index(lslot).reshape([BLOCK_N, 16]),
                               o1, is_async=True)
        _turn_pass(turn, c, PINGPONG, NUM_CONSUMERS)
        o0, o1 = warpgroup_mma_wait(0, deps=[o0_tok, o1_tok])
    else:
        _turn_pass(turn, c, PINGPONG, NUM_CONSUMERS)
        o0 = warpgroup_mma_wait(0, deps=[o0_tok])
    # (no v_empty arrive needed for the last tile: the loader issues no further loads)

    _store_out(out_ptr, o0, l_i, my_row0, seq_len, seq_row0, head, stride_on, stride_oh, 0, HEAD_DIM,
               o0_layout, 64, 64)
    if HAS_TAIL:
        _store_out(out_ptr, o1, l_i, my_row0, seq_len, seq_row0, head, stride_on, stride_oh, 64, HEAD_DIM,
                   o1_layout, 64, 16)


@gluon.jit
def _v2_consumer0(q0_smem, q1_smem, k0_smem, k1_smem, v0_smem, v1_smem, q_bar, k_ready, v_ready,
                  k_empty, v_empty, turn, out_ptr, seq_row0, seq_len, row_start, head, stride_on, stride_oh,
                  qk_scale, n_tiles, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
                  NUM_CONSUMERS: gl.constexpr, PINGPONG: gl.constexpr, OVERLAP: gl.constexpr):
    _v2_consumer(0, q0_smem, q1_smem, k0_smem, k1_smem, v0_smem, v1_smem, q_bar, k_ready, v_ready,
                 k_empty, v_empty, turn, out_ptr, seq_row0, seq_len, row_start, head, stride_on, stride_oh, qk_scale,
                 n_tiles, HEAD_DIM, BLOCK_N, NUM_STAGES, NUM_CONSUMERS, PINGPONG, OVERLAP)


@gluon.jit
def _v2_consumer1(q0_smem, q1_smem, k0_smem, k1_smem, v0_smem, v1_smem, q_bar, k_ready, v_ready,
                  k_empty, v_empty, turn, out_ptr, seq_row0, seq_len, row_start, head, stride_on, stride_oh,
                  qk_scale, n_tiles, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
                  NUM_CONSUMERS: gl.constexpr, PINGPONG: gl.constexpr, OVERLAP: gl.constexpr):
    _v2_consumer(1, q0_smem, q1_smem, k0_smem, k1_smem, v0_smem, v1_smem, q_bar, k_ready, v_ready,
                 k_empty, v_empty, turn, out_ptr, seq_row0, seq_len, row_start, head, stride_on, stride_oh, qk_scale,
                 n_tiles, HEAD_DIM, BLOCK_N, NUM_STAGES, NUM_CONSUMERS, PINGPONG, OVERLAP)


@gluon.jit
def _v2_consumer2(q0_smem, q1_smem, k0_smem, k1_smem, v0_smem, v1_smem, q_bar, k_ready, v_ready,
                  k_empty, v_empty, turn, out_ptr, seq_row0, seq_len, row_start, head, stride_on, stride_oh,
                  qk_scale, n_tiles, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
                  NUM_CONSUMERS: gl.constexpr, PINGPONG: gl.constexpr, OVERLAP: gl.constexpr):
    _v2_consumer(2, q0_smem, q1_smem, k0_smem, k1_smem, v0_smem, v1_smem, q_bar, k_ready, v_ready,
                 k_empty, v_empty, turn, out_ptr, seq_row0, seq_len, row_start, head, stride_on, stride_oh, qk_scale,
                 n_tiles, HEAD_DIM, BLOCK_N, NUM_STAGES, NUM_CONSUMERS, PINGPONG, OVERLAP)


@gluon.jit
def _attn_fwd_v2(q_desc0, q_desc1, k_desc0, k_desc1, v_desc0, v_desc1, out_ptr, cu_seqlens,
                 stride_on, stride_oh, qk_scale,
                 HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                 NUM_STAGES: gl.constexpr, NUM_WARPS: gl.constexpr,
                 LOADER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr, PINGPONG: gl.constexpr,
                 OVERLAP: gl.constexpr):
    # NUM_WARPS (= num_warps of the launch, 4) is the default partition: consumer warpgroup 0.
    # Workers: consumer warpgroups 1..NUM_CONSUMERS-1 (4 warps, CONSUMER_REGS each) and the loader
    # (1 warp, LOADER_REGS; Triton pads it to a warpgroup).
    HAS_TAIL: gl.constexpr = HEAD_DIM > 64
    NUM_CONSUMERS: gl.constexpr = BLOCK_M // 64
    pid_m = gl.program_id(0)
    head = gl.program_id(1)
    seq = gl.program_id(2)
    seq_row0 = gl.load(cu_seqlens + seq)
    seq_len = gl.load(cu_seqlens + seq + 1) - seq_row0
    row_start = pid_m * BLOCK_M
    if row_start >= seq_len:
        return
    n_tiles = gl.cdiv(seq_len, BLOCK_N)

    q0_smem = gl.allocate_shared_memory(gl.bfloat16, [NUM_CONSUMERS, 64, 1, 64], q_desc0.layout)
    k0_smem = gl.allocate_shared_memory(gl.bfloat16, [NUM_STAGES, BLOCK_N, 1, 64], k_desc0.layout)
    v0_smem = gl.allocate_shared_memory(gl.bfloat16, [NUM_STAGES, BLOCK_N, 1, 64], v_desc0.layout)
    if HAS_TAIL:
        q1_smem = gl.allocate_shared_memory(gl.bfloat16, [NUM_CONSUMERS, 64, 1, 16], q_desc1.layout)
        k1_smem = gl.allocate_shared_memory(gl.bfloat16, [NUM_STAGES, BLOCK_N, 1, 16], k_desc1.layout)
        v1_smem = gl.allocate_shared_memory(gl.bfloat16, [NUM_STAGES, BLOCK_N, 1, 16], v_desc1.layout)
    else:
        q1_smem = q0_smem
        k1_smem = k0_smem
        v1_smem = v0_smem
    q_bar = gl.allocate_shared_memory(gl.int64, [NUM_CONSUMERS, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [NUM_CONSUMERS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_CONSUMERS):
        mbarrier.init(q_bar.index(i), count=1)
        mbarrier.init(turn.index(i), count=1)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=NUM_CONSUMERS)
        mbarrier.init(v_empty.index(i), count=NUM_CONSUMERS)

    # The argument tuples are written inline: assigning a tuple to a variable first would turn its
    # constexpr members into tensors.
    if NUM_CONSUMERS == 3:
        gl.warp_specialize([
            (_v2_consumer0, (q0_smem, q1_smem, k0_smem, k1_smem, v0_smem, v1_smem, q_bar, k_ready, v_ready, k_empty,
                             v_empty, turn, out_ptr, seq_row0, seq_len, row_start, head, stride_on, stride_oh,
                             qk_scale, n_tiles, HEAD_DIM, BLOCK_N, NUM_STAGES, NUM_CONSUMERS, PINGPONG, OVERLAP)),
            (_v2_consumer1, (q0_smem, q1_smem, k0_smem, k1_smem, v0_smem, v1_smem, q_bar, k_ready, v_ready, k_empty,
                             v_empty, turn, out_ptr, seq_row0, seq_len, row_start, head, stride_on, stride_oh,
                             qk_scale, n_tiles, HEAD_DIM, BLOCK_N, NUM_STAGES, NUM_CONSUMERS, PINGPONG, OVERLAP)),
            (_v2_consumer2, (q0_smem, q1_smem, k0_smem, k1_smem, v0_smem, v1_smem, q_bar, k_ready, v_ready, k_empty,
                             v_empty, turn, out_ptr, seq_row0, seq_len, row_start, head, stride_on, stride_oh,
                             qk_scale, n_tiles, HEAD_DIM, BLOCK_N, NUM_STAGES, NUM_CONSUMERS, PINGPONG, OVERLAP)),
            (_v2_loader, (q_desc0, q_desc1, k_desc0, k_desc1, v_desc0, v_desc1, q0_smem, q1_smem, k0_smem, k1_smem,
                          v0_smem, v1_smem, q_bar, k_ready, v_ready, k_empty, v_empty, seq_row0, row_start, head,
                          n_tiles, HAS_TAIL, BLOCK_N, NUM_STAGES, NUM_CONSUMERS)),
        ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, LOADER_REGS])
    elif NUM_CONSUMERS == 2:
        gl.warp_specialize([
            (_v2_consumer0, (q0_smem, q1_smem, k0_smem, k1_smem, v0_smem, v1_smem, q_bar, k_ready, v_ready, k_empty,
                             v_empty, turn, out_ptr, seq_row0, seq_len, row_start, head, stride_on, stride_oh,
                             qk_scale, n_tiles, HEAD_DIM, BLOCK_N, NUM_STAGES, NUM_CONSUMERS, PINGPONG, OVERLAP)),
            (_v2_consumer1, (q0_smem, q1_smem, k0_smem, k1_smem, v0_smem, v1_smem, q_bar, k_ready, v_ready, k_empty,
                             v_empty, turn, out_ptr, seq_row0, seq_len, row_start, head, stride_on, stride_oh,
                             qk_scale, n_tiles, HEAD_DIM, BLOCK_N, NUM_STAGES, NUM_CONSUMERS, PINGPONG, OVERLAP)),
            (_v2_loader, (q_desc0, q_desc1, k_desc0, k_desc1, v_desc0, v_desc1, q0_smem, q1_smem, k0_smem, k1_smem,
                          v0_smem, v1_smem, q_bar, k_ready, v_ready, k_empty, v_empty, seq_row0, row_start, head,
                          n_tiles, HAS_TAIL, BLOCK_N, NUM_STAGES, NUM_CONSUMERS)),
        ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
    else:
        gl.warp_specialize([
            (_v2_consumer0, (q0_smem, q1_smem, k0_smem, k1_smem, v0_smem, v1_smem, q_bar, k_ready, v_ready, k_empty,
                             v_empty, turn, out_ptr, seq_row0, seq_len, row_start, head, stride_on, stride_oh,
                             qk_scale, n_tiles, HEAD_DIM, BLOCK_N, NUM_STAGES, NUM_CONSUMERS, False, OVERLAP)),
            (_v2_loader, (q_desc0, q_desc1, k_desc0, k_desc1, v_desc0, v_desc1, q0_smem, q1_smem, k0_smem, k1_smem,
                          v0_smem, v1_smem, q_bar, k_ready, v_ready, k_empty, v_empty, seq_row0, row_start, head,
                          n_tiles, HAS_TAIL, BLOCK_N, NUM_STAGES, NUM_CONSUMERS)),
        ], [1], [LOADER_REGS])


# --------------------------------------------------------------------------------------------
# host side
# --------------------------------------------------------------------------------------------

# name -> (kernel, BLOCK_M, BLOCK_N, NUM_STAGES, num_warps[, v2 options])
# v2 options: pingpong (bool), consumer_regs / loader_regs (setmaxnreg requests of the worker
# consumer warpgroups / the loader warp). The default partition (consumer 0) gets what Triton's
# AllocateWarpGroups leaves: compile_local.py prints the plan and checks that it fits the pool.
VARIANTS = {
    "v1_m128n64": ("v1", 128, 64, 3, 8),
    "v1_m128n128": ("v1", 128, 128, 2, 8),
    "v1_m64n64": ("v1", 64, 64, 3, 4),
    # v2: num_warps=4 is the default partition (consumer warpgroup 0); BLOCK_M // 64 consumer warpgroups
    "v2_m128n64": ("v2", 128, 64, 3, 4),
    "v2_m128n128": ("v2", 128, 128, 3, 4),
    "v2_m128n128s2": ("v2", 128, 128, 2, 4),
    "v2_m128n128s4": ("v2", 128, 128, 4, 4),
    "v2pp_m128n128s4": ("v2", 128, 128, 4, 4, dict(pingpong=True)),
    "v2pp_m128n128": ("v2", 128, 128, 3, 4, dict(pingpong=True)),
    "v2pp_m128n128s2": ("v2", 128, 128, 2, 4, dict(pingpong=True)),
    "v2ppno_m128n128": ("v2", 128, 128, 3, 4, dict(pingpong=True, overlap=False)),
    "v2_m192n64": ("v2", 192, 64, 4, 4, dict(consumer_regs=160)),
    "v2pp_m192n64": ("v2", 192, 64, 4, 4, dict(pingpong=True, consumer_regs=160)),
    "v2pp_m192n64s3": ("v2", 192, 64, 3, 4, dict(pingpong=True, consumer_regs=160)),
}

# Compiled for reference only (compile_local.py accepts them by name), NOT for the GPU: with three
# consumer warpgroups the register plan is 168 / 160 / 160 / 24 (the most that fits 512 per thread of a
# warpgroup), and at BLOCK_N=128 the consumers need S (64) + P (32) + O (40) accumulator registers in
# flight at once: ptxas spills (160 B) and serialises every wgmma (C7512). Do not time these.
SPILLING_VARIANTS = {
    "v2_m192n128": ("v2", 192, 128, 3, 4, dict(consumer_regs=160)),
    "v2pp_m192n128": ("v2", 192, 128, 3, 4, dict(pingpong=True, consumer_regs=160)),
    "v2ppno_m192n128s2": ("v2", 192, 128, 2, 4, dict(pingpong=True, overlap=False, consumer_regs=160)),
}

# what check.py times by default (best guesses first)
RECOMMENDED = ["v2pp_m128n128", "v2pp_m192n64", "v2_m192n64", "v2_m128n128", "v2ppno_m128n128",
               "v2pp_m128n128s2", "v2_m128n128s2"]


# default setmaxnreg requests of the v2 worker partitions (consumer warpgroups 1.., loader warp)
V2_CONSUMER_REGS = 224
V2_LOADER_REGS = 24


def variant_config(name):
    """VARIANTS[name] as a dict: kind, block_m, block_n, stages, warps, and the kernel's constexprs."""
    kind, block_m, block_n, stages, warps, *rest = VARIANTS[name] if name in VARIANTS else SPILLING_VARIANTS[name]
    opts = rest[0] if rest else {}
    const = dict(BLOCK_M=block_m, BLOCK_N=block_n, NUM_STAGES=stages, NUM_WARPS=warps)
    if kind == "v2":
        const.update(LOADER_REGS=opts.get("loader_regs", V2_LOADER_REGS),
                     CONSUMER_REGS=opts.get("consumer_regs", V2_CONSUMER_REGS),
                     PINGPONG=bool(opts.get("pingpong", False)), OVERLAP=bool(opts.get("overlap", True)))
    return dict(kind=kind, block_m=block_m, block_n=block_n, stages=stages, warps=warps,
                qrows=block_m if kind == "v1" else 64, const=const,
                kernel=_attn_fwd_v1 if kind == "v1" else _attn_fwd_v2)


def _smem_layouts(rows):
    l0 = gl.NVMMASharedLayout.get_default_for([rows, 1, 64], gl.bfloat16)
    l1 = gl.NVMMASharedLayout.get_default_for([rows, 1, 16], gl.bfloat16)
    return l0, l1


def _descs(x, rows):
    """Two 3-D TMA descriptors over the strided [T, H, D] view: cols 0..63 and 64..79.

    The host class is ``triton.experimental.gluon.nvidia.hopper.TensorDescriptor`` in 3.6 and 3.9, with
    the same positional (base, shape, strides, block_shape, layout) fields.
    """
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    l0, l1 = _smem_layouts(rows)
    shape = list(x.shape)
    strides = list(x.stride())
    return (TensorDescriptor(x, shape, strides, [rows, 1, 64], l0),
            TensorDescriptor(x, shape, strides, [rows, 1, 16], l1))


def _prepare(q, k, v, cu_seqlens, max_seqlen, variant, out):
    """Everything up to the launch (no GPU work): (kernel, grid, args, kwargs)."""
    cfg = variant_config(variant)
    T, H, D = q.shape
    assert q.dtype == torch.bfloat16 and k.shape == q.shape and v.shape == q.shape
    assert D in (64, 72, 80), "head dims 64 / 72 / 80 only (64 + 16 split)"
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
    if out is None:
        out = torch.empty((T, H, D), dtype=q.dtype, device=q.device)
    cu = cu_seqlens if cu_seqlens.dtype == torch.int32 else cu_seqlens.to(torch.int32)
    batch = cu.shape[0] - 1
    qd0, qd1 = _descs(q, cfg["qrows"])
    kd0, kd1 = _descs(k, cfg["block_n"])
    vd0, vd1 = _descs(v, cfg["block_n"])
    grid = (triton.cdiv(int(max_seqlen), cfg["block_m"]), H, batch)
    args = (qd0, qd1, kd0, kd1, vd0, vd1, out, cu, out.stride(0), out.stride(1), float(D ** -0.5) * _LOG2_E)
    kwargs = dict(HEAD_DIM=D, num_warps=cfg["warps"], **cfg["const"])
    return cfg["kernel"], grid, args, kwargs, out


def gluon_varlen_attention(q, k, v, cu_seqlens, max_seqlen, variant="v1_m128n64", out=None):
    """Non-causal attention within each packed segment; q, k, v strided [T, H, D] bf16 views."""
    kernel, grid, args, kwargs, out = _prepare(q, k, v, cu_seqlens, max_seqlen, variant, out)
    kernel[grid](*args, **kwargs)
    return out
