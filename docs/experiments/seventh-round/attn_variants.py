"""Issue #16, seventh round (H200): triton_attn variants at long single segments. Table last; JSON under $OUT.

    PYTHONPATH=$PWD python docs/experiments/seventh-round/attn_variants.py softmax   # run 2: variants.py's flags
    PYTHONPATH=$PWD python docs/experiments/seventh-round/attn_variants.py tma       # run 3: TMA q/k/v, 4-warp tiles
    PYTHONPATH=$PWD python docs/experiments/seventh-round/attn_variants.py tmakv     # run 5: TMA k/v only
"""
import json, os, sys, time, traceback
import torch, triton, triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel
sys.path.insert(0, os.path.dirname(__file__))
import variants  # noqa: E402
from rocm_vit.backends.sdpa import sdpa_varlen  # noqa: E402
from rocm_vit.backends.triton_attn import _LOG2_E, _common_alignment, _head_dim_split, triton_varlen_attention  # noqa: E402

OUT = os.environ.get("OUT", "/tmp"); H = 16; T0 = time.time(); ROWS = []
BUDGET = float(os.environ.get("BUDGET_S", "420"))

def log(*a):
    print(f"[{time.time()-T0:6.1f}s]", *a, file=sys.stderr, flush=True)

def bench(fn, rep):
    return float(triton.testing.do_bench(fn, warmup=max(10, rep // 4), rep=rep, return_mode="median"))

def inputs(seq_lens, d, seed=0, q_scale=1.0):
    n = sum(seq_lens); g = torch.Generator(device="cuda").manual_seed(seed)
    qkv = torch.randn((n, 3, H, d), generator=g, device="cuda", dtype=torch.bfloat16)
    if q_scale != 1.0:
        qkv[:, 0] *= q_scale
    q, k, v = qkv.unbind(1)
    cu = torch.tensor([0, *torch.tensor(seq_lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    return q, k, v, cu

def reference64(q, k, v, seq_lens, scale, chunk=4096):
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device); start = 0
    for length in seq_lens:
        for h in range(q.shape[1]):
            kk = k[start:start+length, h].double(); vv = v[start:start+length, h].double()
            for c in range(0, length, chunk):
                qq = q[start+c:start+min(c+chunk, length), h].double()
                out[start+c:start+c+qq.shape[0], h] = torch.softmax((qq @ kk.T) * scale, -1) @ vv
        start += length
    return out

def launch(q, k, v, cu, max_seqlen, out, cfg, flags):
    bm, bn, w, s = cfg; d = q.shape[2]; d0, d1 = _head_dim_split(d)
    strides = (*q.stride()[:2], *k.stride()[:2], *v.stride()[:2], *out.stride()[:2])
    grid = (triton.cdiv(max_seqlen, bm), cu.shape[0] - 1, q.shape[1])
    f = dict(LAZY=0.0, SUM_DOT=False, EXP=0); f.update(flags)
    return variants._varlen_attn_fwd[grid](q, k, v, out, cu, *strides, float(d**-0.5) * _LOG2_E,
        GROUP_SIZE=1, HEAD_DIM=d, BLOCK_D0=d0, BLOCK_D1=d1, BLOCK_M=bm, BLOCK_N=bn,
        ALIGN=_common_alignment(strides), DOT_PRECISION=None, num_warps=w, num_stages=s, **f)

def launch_tma(q, k, v, cu, max_seqlen, out, cfg):
    from triton.tools.tensor_descriptor import TensorDescriptor
    bm, bn, w, s = cfg; d = q.shape[2]; d0, d1 = _head_dim_split(d)
    desc = lambda t, rows, width: TensorDescriptor(t, list(t.shape), list(t.stride()), [rows, 1, width])
    grid = (triton.cdiv(max_seqlen, bm), cu.shape[0] - 1, q.shape[1])
    return variants._varlen_attn_fwd_tma[grid](desc(q, bm, d0), desc(q, bm, d1), desc(k, bn, d0), desc(k, bn, d1),
        desc(v, bn, d0), desc(v, bn, d1), out, cu, out.stride(0), out.stride(1), float(d**-0.5) * _LOG2_E,
        GROUP_SIZE=1, HEAD_DIM=d, BLOCK_D0=d0, BLOCK_D1=d1, BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=s)

def launch_tmakv(q, k, v, cu, max_seqlen, out, cfg):
    from triton.tools.tensor_descriptor import TensorDescriptor
    bm, bn, w, s = cfg; d = q.shape[2]; d0, d1 = _head_dim_split(d)
    desc = lambda t, rows, width: TensorDescriptor(t, list(t.shape), list(t.stride()), [rows, 1, width])
    grid = (triton.cdiv(max_seqlen, bm), cu.shape[0] - 1, q.shape[1])
    return variants._varlen_attn_fwd_tmakv[grid](q, q.stride(0), q.stride(1), desc(k, bn, d0), desc(k, bn, d1),
        desc(v, bn, d0), desc(v, bn, d1), out, cu, out.stride(0), out.stride(1), float(d**-0.5) * _LOG2_E,
        GROUP_SIZE=1, HEAD_DIM=d, BLOCK_D0=d0, BLOCK_D1=d1, BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=s)

def run(seq_lens, d, cands, rep, with_ref=True, q_scale=1.0, extra=True, tag=""):
    if time.time() - T0 > BUDGET:
        log("budget spent, skipping", seq_lens, d); return
    q, k, v, cu = inputs(seq_lens, d, q_scale=q_scale)
    ref = reference64(q, k, v, seq_lens, d**-0.5) if with_ref else None
    fl = sum(4.0 * L * L * H * d for L in seq_lens); out = torch.empty_like(q)
    L = "+".join(map(str, seq_lens)) + tag
    def record(name, fn, info=None):
        row = {"L": L, "d": d, "name": name, **(info or {})}
        try:
            out.fill_(float("nan")); o = fn().clone(); torch.cuda.synchronize()
            if ref is not None:
                diff = o.double() - ref
                row["rel"] = float(diff.norm() / ref.norm()); row["maxabs"] = float(diff.abs().max())
            row["det"] = bool(torch.equal(o, fn()))
            ms = bench(fn, rep); row["ms"] = ms; row["tflops"] = fl / ms / 1e9
        except Exception as err:
            row["error"] = f"{type(err).__name__}: {str(err)[-300:]}"
        ROWS.append(row); log(row)
    if extra:
        def cudnn():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return sdpa_varlen(q, k, v, seq_lens, d**-0.5)
        record("sdpa_cudnn", cudnn)
        record("triton_attn(main)", lambda: triton_varlen_attention(q, k, v, cu, max(seq_lens), d**-0.5, out=out))
    for name, flags, cfg in cands:
        info = {}
        fn = launch_tma if flags == "tma" else launch_tmakv if flags == "tmakv" else (lambda *a, flags=flags: launch(*a, flags))
        try:
            ck = fn(q, k, v, cu, max(seq_lens), out, cfg)
            info = {"regs": ck.n_regs, "spills": ck.n_spills}
        except Exception:
            ROWS.append({"L": L, "d": d, "name": name, "error": traceback.format_exc()[-500:]}); log(ROWS[-1]); continue
        record(name, lambda cfg=cfg, fn=fn: (fn(q, k, v, cu, max(seq_lens), out, cfg), out)[1], info)
    del q, k, v, out, ref; torch.cuda.empty_cache()

def dump():
    with open(os.path.join(OUT, "exp17.json"), "w") as f:
        json.dump(ROWS, f, indent=1)

def table():
    print(f"{'L':>14} {'d':>3} {'variant':>26} {'ms':>8} {'TF/s':>5} {'rel_err':>9} {'maxabs':>8} det regs")
    for r in ROWS:
        if "ms" in r:
            print(f"{r['L']:>14} {r['d']:>3} {r['name']:>26} {r['ms']:8.3f} {r['tflops']:5.0f} "
                  f"{r.get('rel', float('nan')):9.2e} {r.get('maxabs', float('nan')):8.1e} {int(r['det'])} {r.get('regs', '-')}")
        else:
            print(f"{r['L']:>14} {r['d']:>3} {r['name']:>26} ERROR {r.get('error', '')[-200:]!r}")

C = (128, 64, 8, 3)


def sweep_softmax():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
    ms = bench(lambda: a @ b, 200); log(f"matmul {2*8192**3/ms/1e9:.0f} TFLOP/s triton {triton.__version__} torch {torch.__version__}")
    del a, b
    L8S = dict(LAZY=8.0, SUM_DOT=True)
    c72 = [("base", {}, C), ("L8", dict(LAZY=8.0), C), ("S", dict(SUM_DOT=True), C), ("L8S", L8S, C),
           ("L8S E1", {**L8S, "EXP": 1}, C), ("L8S E2", {**L8S, "EXP": 2}, C), ("L8S E3", {**L8S, "EXP": 3}, C),
           ("L8S E4", {**L8S, "EXP": 4}, C), ("L8 E4", dict(LAZY=8.0, EXP=4), C),
           ("L8S 128x64x8x2", L8S, (128, 64, 8, 2)), ("L8S 128x64x8x4", L8S, (128, 64, 8, 4)),
           ("L8S 128x128x8x2", L8S, (128, 128, 8, 2)), ("L8S 64x64x4x3", L8S, (64, 64, 4, 3)),
           ("L8S E4 128x128x8x2", {**L8S, "EXP": 4}, (128, 128, 8, 2))]
    run([12800], 72, c72, 60); dump()
    timed = sorted((r for r in ROWS if r["L"] == "12800" and "ms" in r and r["name"] not in ("sdpa_cudnn", "triton_attn(main)", "base")), key=lambda r: r["ms"])
    best = [next(c for c in c72 if c[0] == r["name"]) for r in timed[:3]]
    log("best", [b[0] for b in best])
    short = [c72[0]] + best
    no_sum = lambda cs: [(n.replace("S", "", 1) if n.startswith("L8S") else n, {**f, "SUM_DOT": False}, c) for n, f, c in cs]
    run([12800], 80, [c72[0], c72[1]] + [x for x in no_sum(best) if x[0] != "L8"], 60); dump()
    run([12800], 72, short, 60, q_scale=4.0, extra=False, tag=" q*4"); dump()
    run([47376], 72, short, 300); dump()
    run([47376], 80, [c72[0], c72[1]] + [x for x in no_sum(best[:1]) if x[0] != "L8"], 300); dump()
    for sl in ([8160], [8160, 8160], [14400], [1024] * 8):
        run(sl, 72, short, 60, with_ref=(sl != [8160, 8160])); dump()


def sweep_tma():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
    ms = bench(lambda: a @ b, 200); log(f"matmul {2*8192**3/ms/1e9:.0f} TFLOP/s triton {triton.__version__} torch {torch.__version__}")
    del a, b
    tma = [(f"tma {c}", "tma", c) for c in [C, (128, 64, 8, 2), (128, 64, 8, 4), (64, 64, 4, 2), (64, 64, 4, 3), (128, 128, 8, 2), (64, 128, 4, 2), (128, 32, 8, 3)]]
    plain = [(f"S {c}", dict(SUM_DOT=True), c) for c in [(64, 64, 4, 2), (64, 64, 4, 3), (64, 32, 4, 3), (64, 32, 4, 4)]]
    run([12800], 72, tma + plain, 60); dump()
    timed = sorted((r for r in ROWS if r["L"] == "12800" and "ms" in r and r["name"].startswith("tma")), key=lambda r: r["ms"])
    best = [next(c for c in tma if c[0] == r["name"]) for r in timed[:2]]
    log("best", [b[0] for b in best])
    run([12800], 80, best, 60)
    run([47376], 72, best, 300); dump()
    run([47376], 80, best[:1], 300); dump()
    for sl in ([8160], [8160, 8160], [14400], [1024] * 8, [196] * 4):
        run(sl, 72, best, 60, with_ref=(sl != [8160, 8160])); dump()


def sweep_tmakv():
    kv = [(f"tmakv {c}", "tmakv", c) for c in [C, (128, 64, 8, 2), (128, 64, 8, 4), (128, 128, 8, 2), (128, 32, 8, 3), (64, 64, 4, 3)]]
    run([12800], 72, kv, 60); dump()
    timed = sorted((r for r in ROWS if r["L"] == "12800" and "ms" in r and r["name"].startswith("tmakv")), key=lambda r: r["ms"])
    best = [next(c for c in kv if c[0] == r["name"]) for r in timed[:2]]
    log("best", [b[0] for b in best])
    run([12800], 80, best, 60)
    run([47376], 72, best[:1], 300); dump()
    run([14400], 72, best[:1], 60); dump()


if __name__ == "__main__":
    {"softmax": sweep_softmax, "tma": sweep_tma, "tmakv": sweep_tmakv}[sys.argv[1]]()
    table()
