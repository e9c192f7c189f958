"""More resident warpgroups per SM: the shipped kernel with narrow key tiles and a register cap.

The shipped kernel is latency-bound with 2 programs (4 warpgroups) per SM, limited by 126 registers
and 82 KB of shared memory per program. 128x32 tiles need less of both; Triton's `maxnreg` caps the
registers so that 3 or 4 programs fit (65,536 / (256 threads x N) programs by registers).

    PYTHONPATH=$PWD python docs/experiments/seventh-round/occupancy.py
"""
import torch
import triton
import triton.testing

from rocm_vit.backends.triton_attn import _LOG2_E, _common_alignment, _head_dim_split, _varlen_attn_fwd, triton_varlen_attention

H = 16


def launch(q, k, v, cu, n, out, cfg, maxnreg):
    bm, bn, w, s = cfg
    d = q.shape[2]
    d0, d1 = _head_dim_split(d)
    strides = (*q.stride()[:2], *k.stride()[:2], *v.stride()[:2], *out.stride()[:2])
    extra = {} if maxnreg is None else {"maxnreg": maxnreg}
    return _varlen_attn_fwd[(triton.cdiv(n, bm), 1, H)](
        q, k, v, out, cu, *strides, float(d**-0.5) * _LOG2_E, GROUP_SIZE=1, HEAD_DIM=d, BLOCK_D0=d0,
        BLOCK_D1=d1, BLOCK_M=bm, BLOCK_N=bn, ALIGN=_common_alignment(strides), DOT_PRECISION=None,
        num_warps=w, num_stages=s, **extra)


print(f"{'L':>6} {'d':>3} {'tiles':>16} {'maxnreg':>7} {'regs':>4} {'spills':>6} {'smem KB':>7} {'ms':>7} {'shipped':>7} {'same':>4}")
for n, d in ((12800, 72), (12800, 80), (47376, 72)):
    qkv = torch.randn((n, 3, H, d), device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.unbind(1)
    cu = torch.tensor([0, n], dtype=torch.int32, device="cuda")
    ref = triton_varlen_attention(q, k, v, cu, n, d**-0.5).clone()
    rep = 300 if n > 20000 else 60
    shipped = triton.testing.do_bench(lambda: triton_varlen_attention(q, k, v, cu, n, d**-0.5), warmup=20, rep=rep, return_mode="median")
    out = torch.empty_like(q)
    for cfg in ((128, 64, 8, 3), (128, 32, 8, 3), (128, 32, 8, 4), (128, 32, 8, 2)):
        for maxnreg in (None, 128, 96, 80, 64):
            if cfg == (128, 64, 8, 3) and maxnreg not in (None, 96, 80):
                continue
            try:
                ck = launch(q, k, v, cu, n, out, cfg, maxnreg)
                torch.cuda.synchronize()
                close = torch.allclose(out.float(), ref.float(), atol=2e-3, rtol=2e-2)
                ms = triton.testing.do_bench(lambda: launch(q, k, v, cu, n, out, cfg, maxnreg), warmup=20, rep=rep, return_mode="median")
                print(f"{n:6d} {d:3d} {str(cfg):>16} {str(maxnreg):>7} {ck.n_regs:4d} {ck.n_spills:6d} {ck.metadata.shared / 1024:7.1f} {ms:7.3f} {shipped:7.3f} {int(close):>4}", flush=True)
            except Exception as err:
                print(f"{n:6d} {d:3d} {str(cfg):>16} {str(maxnreg):>7} ERROR {type(err).__name__}: {str(err)[:120]}", flush=True)
    del q, k, v, qkv, out
