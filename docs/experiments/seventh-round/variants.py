"""Issue #16, session 7: triton_attn variants that cut the softmax's per-score work.

LAZY  > 0: rescale the accumulators only when some row's max grows by more than LAZY (log2 units);
           otherwise keep the stale max (p <= 2**LAZY). 0: rescale every tile (shipped).
SUM_DOT:   the row sum comes out of the tail P.V dot through a ones column in the padded head dim
           (d72: columns 72..79 are padding); needs BLOCK_D0 + BLOCK_D1 > HEAD_DIM.
EXP:       0 fp32 exp2 (MUFU.EX2), 1 ex2.approx.f16x2 on fp16-rounded arguments, 2 ex2.approx.ftz.bf16x2,
           3 half the columns by a cubic on the FMA pipe, 4 the same on every other tile (a quarter).
"""

import triton
import triton.language as tl


@triton.jit
def _exp2(x, EXP: tl.constexpr, dtype: tl.constexpr):
    """exp2 of fp32 ``x``, returned in ``dtype`` (the P.V operand type)."""
    if EXP == 1:
        p16 = tl.inline_asm_elementwise(
            "ex2.approx.f16x2 $0, $1;", "=r,r", [x.to(tl.float16)], dtype=tl.float16, is_pure=True, pack=2
        )
        return p16.to(dtype)
    elif EXP == 2:
        return tl.inline_asm_elementwise(
            "ex2.approx.ftz.bf16x2 $0, $1;", "=r,r", [x.to(tl.bfloat16)], dtype=tl.bfloat16, is_pure=True, pack=2
        ).to(dtype)
    elif EXP == 3:
        # half the columns through a polynomial on the FMA pipe, half through MUFU
        a, b = tl.split(tl.reshape(x, (x.shape[0], x.shape[1] // 2, 2)))
        return tl.reshape(tl.join(_exp2_poly(a), tl.math.exp2(b)), x.shape).to(dtype)
    else:
        return tl.math.exp2(x).to(dtype)


@triton.jit
def _exp2_poly(x):
    """2**x on the FMA pipe (FlashAttention-4's idea): round to n, 2**f by a cubic (relative least squares) on [-0.5, 0.5], add n
    to the exponent bits. Relative error 7.7e-5 (below bf16's 2**-9). x is clamped to >= -125."""
    x = tl.maximum(x, -125.0)
    t = x + 12582912.0  # 1.5 * 2**23: the low mantissa bits now hold round(x)
    f = x - (t - 12582912.0)
    poly = 0.055088683807511106 * f + 0.24260405145947936
    poly = poly * f + 0.6932762416819607
    poly = poly * f + 0.9999289403695112
    bits = poly.to(tl.int32, bitcast=True) + (t.to(tl.int32, bitcast=True) << 23)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _load_tail(rows, offs_d1, HEAD_DIM: tl.constexpr, BLOCK_D0: tl.constexpr, BLOCK_D1: tl.constexpr):
    if BLOCK_D0 + BLOCK_D1 == HEAD_DIM:
        return tl.load(rows + offs_d1[None, :])
    return tl.load(rows + offs_d1[None, :], mask=(offs_d1 < HEAD_DIM)[None, :], other=0.0)


@triton.jit
def _varlen_attn_fwd(
    Q, K, V, Out, cu_seqlens,
    stride_qn, stride_qh, stride_kn, stride_kh, stride_vn, stride_vh, stride_on, stride_oh,
    qk_scale_log2,
    GROUP_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D0: tl.constexpr, BLOCK_D1: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ALIGN: tl.constexpr, DOT_PRECISION: tl.constexpr,
    LAZY: tl.constexpr, SUM_DOT: tl.constexpr, EXP: tl.constexpr,
):  # fmt: skip
    block_m = tl.program_id(0)
    seq = tl.program_id(1)
    head = tl.program_id(2)
    seq_start = tl.load(cu_seqlens + seq)
    seq_len = tl.load(cu_seqlens + seq + 1) - seq_start
    if block_m * BLOCK_M >= seq_len:
        return
    dtype = V.dtype.element_ty
    row0 = seq_start.to(tl.int64)
    kv_head = head // GROUP_SIZE
    offs_m = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d0 = tl.arange(0, BLOCK_D0)
    offs_d1 = BLOCK_D0 + tl.arange(0, BLOCK_D1)
    d1_valid = offs_d1 < HEAD_DIM
    m_valid = offs_m < seq_len
    offs_m_read = tl.minimum(offs_m, seq_len - 1)
    q_rows = Q + tl.multiple_of(row0 * stride_qn + head * stride_qh, ALIGN) + offs_m_read[:, None] * stride_qn
    q0 = tl.load(q_rows + offs_d0[None, :]).to(dtype)
    q1 = _load_tail(q_rows, offs_d1, HEAD_DIM, BLOCK_D0, BLOCK_D1)
    q1 = tl.where(d1_valid[None, :], q1, 0.0).to(dtype)
    acc0 = tl.zeros([BLOCK_M, BLOCK_D0], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_M, BLOCK_D1], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    k_base = K + tl.multiple_of(row0 * stride_kn + kv_head * stride_kh, ALIGN)
    v_base = V + tl.multiple_of(row0 * stride_vn + kv_head * stride_vh, ALIGN)
    ones_col = (offs_d1 == HEAD_DIM)[None, :]

    for start_n in range(0, seq_len, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        offs_n_read = tl.minimum(offs_n, seq_len - 1)
        k_rows = k_base + offs_n_read[:, None] * stride_kn
        v_rows = v_base + offs_n_read[:, None] * stride_vn
        k0 = tl.load(k_rows + offs_d0[None, :])
        scores = tl.dot(q0, tl.trans(k0.to(dtype)))
        k1 = _load_tail(k_rows, offs_d1, HEAD_DIM, BLOCK_D0, BLOCK_D1)
        scores = tl.dot(q1, tl.trans(k1.to(dtype)), scores)
        if start_n + BLOCK_N > seq_len:
            scores = tl.where((offs_n < seq_len)[None, :], scores, float("-inf"))
        m_cand = tl.maximum(m_i, tl.max(scores, 1) * qk_scale_log2)
        if LAZY > 0:
            if tl.max(m_cand - m_i, 0) > LAZY:
                alpha = tl.math.exp2(m_i - m_cand)
                acc0 = acc0 * alpha[:, None]
                acc1 = acc1 * alpha[:, None]
                if not SUM_DOT:
                    l_i = l_i * alpha
                m_i = m_cand
        else:
            alpha = tl.math.exp2(m_i - m_cand)
            acc0 = acc0 * alpha[:, None]
            acc1 = acc1 * alpha[:, None]
            if not SUM_DOT:
                l_i = l_i * alpha
            m_i = m_cand
        if EXP == 4:
            # a quarter through the polynomial: every other tile splits half and half
            if (start_n // BLOCK_N) % 2 == 0:
                p = _exp2(scores * qk_scale_log2 - m_i[:, None], 3, dtype)
            else:
                p = _exp2(scores * qk_scale_log2 - m_i[:, None], 0, dtype)
        else:
            p = _exp2(scores * qk_scale_log2 - m_i[:, None], EXP, dtype)
        if not SUM_DOT:
            l_i = l_i + tl.sum(p.to(tl.float32), 1)
        v0 = tl.load(v_rows + offs_d0[None, :])
        acc0 = tl.dot(p, v0.to(dtype), acc0)
        v1 = _load_tail(v_rows, offs_d1, HEAD_DIM, BLOCK_D0, BLOCK_D1)
        if SUM_DOT:
            v1 = tl.where(ones_col, 1.0, v1)
        acc1 = tl.dot(p, v1.to(dtype), acc1)

    if SUM_DOT:
        l_i = tl.sum(tl.where(ones_col, acc1, 0.0), 1)
    inv_l = 1.0 / l_i
    out_rows = Out + tl.multiple_of(row0 * stride_on + head * stride_oh, ALIGN) + offs_m[:, None] * stride_on
    tl.store(out_rows + offs_d0[None, :], (acc0 * inv_l[:, None]).to(dtype), mask=m_valid[:, None])
    tl.store(out_rows + offs_d1[None, :], (acc1 * inv_l[:, None]).to(dtype), mask=m_valid[:, None] & d1_valid[None, :])


@triton.jit
def _varlen_attn_fwd_tma(
    q_desc0, q_desc1, k_desc0, k_desc1, v_desc0, v_desc1, Out, cu_seqlens,
    stride_on, stride_oh, qk_scale_log2,
    GROUP_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D0: tl.constexpr, BLOCK_D1: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """The shipped kernel with q, k, v read by TMA (3-D descriptors [N, H, D]; the tail box past
    HEAD_DIM and rows past the tensor are zero-filled by the copy engine)."""
    block_m = tl.program_id(0)
    seq = tl.program_id(1)
    head = tl.program_id(2)
    seq_start = tl.load(cu_seqlens + seq)
    seq_len = tl.load(cu_seqlens + seq + 1) - seq_start
    if block_m * BLOCK_M >= seq_len:
        return
    dtype = Out.dtype.element_ty
    kv_head = head // GROUP_SIZE
    offs_m = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d0 = tl.arange(0, BLOCK_D0)
    offs_d1 = BLOCK_D0 + tl.arange(0, BLOCK_D1)
    q_row = seq_start + block_m * BLOCK_M
    q0 = q_desc0.load([q_row, head, 0]).reshape(BLOCK_M, BLOCK_D0)
    q1 = q_desc1.load([q_row, head, BLOCK_D0]).reshape(BLOCK_M, BLOCK_D1)
    acc0 = tl.zeros([BLOCK_M, BLOCK_D0], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_M, BLOCK_D1], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    for start_n in range(0, seq_len, BLOCK_N):
        row = seq_start + start_n
        k0 = k_desc0.load([row, kv_head, 0]).reshape(BLOCK_N, BLOCK_D0)
        k1 = k_desc1.load([row, kv_head, BLOCK_D0]).reshape(BLOCK_N, BLOCK_D1)
        scores = tl.dot(q0, tl.trans(k0))
        scores = tl.dot(q1, tl.trans(k1), scores)
        if start_n + BLOCK_N > seq_len:
            scores = tl.where(((start_n + tl.arange(0, BLOCK_N)) < seq_len)[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1) * qk_scale_log2)
        p = tl.math.exp2(scores * qk_scale_log2 - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        p = p.to(dtype)
        v0 = v_desc0.load([row, kv_head, 0]).reshape(BLOCK_N, BLOCK_D0)
        v1 = v_desc1.load([row, kv_head, BLOCK_D0]).reshape(BLOCK_N, BLOCK_D1)
        acc0 = tl.dot(p, v0, acc0 * alpha[:, None])
        acc1 = tl.dot(p, v1, acc1 * alpha[:, None])
        m_i = m_new
    inv_l = 1.0 / l_i
    m_valid = offs_m < seq_len
    out_rows = Out + (seq_start.to(tl.int64) * stride_on + head * stride_oh) + offs_m[:, None] * stride_on
    tl.store(out_rows + offs_d0[None, :], (acc0 * inv_l[:, None]).to(dtype), mask=m_valid[:, None])
    tl.store(out_rows + offs_d1[None, :], (acc1 * inv_l[:, None]).to(dtype),
             mask=m_valid[:, None] & (offs_d1 < HEAD_DIM)[None, :])  # fmt: skip


@triton.jit
def _varlen_attn_fwd_tmakv(
    Q, stride_qn, stride_qh, k_desc0, k_desc1, v_desc0, v_desc1, Out, cu_seqlens,
    stride_on, stride_oh, qk_scale_log2,
    GROUP_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D0: tl.constexpr, BLOCK_D1: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """q by pointer loads as shipped; k, v read by TMA (3-D descriptors [N, H, D]; the tail box past
    HEAD_DIM and rows past the tensor are zero-filled by the copy engine)."""
    block_m = tl.program_id(0)
    seq = tl.program_id(1)
    head = tl.program_id(2)
    seq_start = tl.load(cu_seqlens + seq)
    seq_len = tl.load(cu_seqlens + seq + 1) - seq_start
    if block_m * BLOCK_M >= seq_len:
        return
    dtype = Out.dtype.element_ty
    kv_head = head // GROUP_SIZE
    offs_m = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d0 = tl.arange(0, BLOCK_D0)
    offs_d1 = BLOCK_D0 + tl.arange(0, BLOCK_D1)
    offs_m_read = tl.minimum(offs_m, seq_len - 1)
    q_rows = Q + (seq_start.to(tl.int64) * stride_qn + head * stride_qh) + offs_m_read[:, None] * stride_qn
    q0 = tl.load(q_rows + offs_d0[None, :])
    q1 = tl.load(q_rows + offs_d1[None, :], mask=(offs_d1 < HEAD_DIM)[None, :], other=0.0)
    acc0 = tl.zeros([BLOCK_M, BLOCK_D0], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_M, BLOCK_D1], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    for start_n in range(0, seq_len, BLOCK_N):
        row = seq_start + start_n
        k0 = k_desc0.load([row, kv_head, 0]).reshape(BLOCK_N, BLOCK_D0)
        k1 = k_desc1.load([row, kv_head, BLOCK_D0]).reshape(BLOCK_N, BLOCK_D1)
        scores = tl.dot(q0, tl.trans(k0))
        scores = tl.dot(q1, tl.trans(k1), scores)
        if start_n + BLOCK_N > seq_len:
            scores = tl.where(((start_n + tl.arange(0, BLOCK_N)) < seq_len)[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1) * qk_scale_log2)
        p = tl.math.exp2(scores * qk_scale_log2 - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        p = p.to(dtype)
        v0 = v_desc0.load([row, kv_head, 0]).reshape(BLOCK_N, BLOCK_D0)
        v1 = v_desc1.load([row, kv_head, BLOCK_D0]).reshape(BLOCK_N, BLOCK_D1)
        acc0 = tl.dot(p, v0, acc0 * alpha[:, None])
        acc1 = tl.dot(p, v1, acc1 * alpha[:, None])
        m_i = m_new
    inv_l = 1.0 / l_i
    m_valid = offs_m < seq_len
    out_rows = Out + (seq_start.to(tl.int64) * stride_on + head * stride_oh) + offs_m[:, None] * stride_on
    tl.store(out_rows + offs_d0[None, :], (acc0 * inv_l[:, None]).to(dtype), mask=m_valid[:, None])
    tl.store(out_rows + offs_d1[None, :], (acc1 * inv_l[:, None]).to(dtype),
             mask=m_valid[:, None] & (offs_d1 < HEAD_DIM)[None, :])  # fmt: skip
