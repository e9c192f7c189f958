"""Correctness + timing of the Gluon FA3-style kernels on an H200 (torch 2.11, triton 3.6).

Run from the repo root:
    PYTHONPATH=$PWD python docs/experiments/eighth-round/gluon_check.py                 # gluon_variants.RECOMMENDED
    PYTHONPATH=$PWD python docs/experiments/eighth-round/gluon_check.py --variants v2_m128n64,v1_m128n64
    PYTHONPATH=$PWD python docs/experiments/eighth-round/gluon_check.py --variants all  # every entry of VARIANTS
    PYTHONPATH=$PWD python docs/experiments/eighth-round/gluon_check.py --no-smoke       # skip the subprocess smoke runs

Each variant first runs in a *subprocess* ("smoke": compile + run every test layout once, with a
timeout), because an mbarrier / setmaxnreg mistake hangs the GPU and an illegal address poisons the
CUDA context; only variants whose smoke run passed are checked and timed in this process.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.getcwd())

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

import gluon_variants as gluon_attn  # noqa: E402

HEADS = 16
# (layout name, segment lengths, head dim): the correctness cases (kept small for GPU time)
CASES = [("1x12800", [12800], 72), ("196+1024+777", [196, 1024, 777], 72),
         ("196+1024+777", [196, 1024, 777], 80), ("1x1000", [1000], 64),
         # single-key-tile segments (n_tiles == 1) and consumer warpgroups whose rows are all past the end
         ("100+7+300", [100, 7, 300], 72)]
BENCH_T = [int(t) for t in os.environ.get('BENCH_T', '12800,47376').split(',')]
BENCH_D = 72


def make_inputs(seqlens, head_dim, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    T = sum(seqlens)
    qkv = torch.randn((T, 3, HEADS, head_dim), device="cuda", dtype=torch.bfloat16, generator=g)
    q, k, v = qkv.unbind(1)  # strided views: token stride 3*H*D, head stride D
    cu = torch.tensor([0] + list(torch.tensor(seqlens).cumsum(0).tolist()), device="cuda", dtype=torch.int32)
    return qkv, q, k, v, cu, max(seqlens)


def reference(q, k, v, seqlens):
    out = torch.empty(q.shape, device=q.device, dtype=torch.float32)
    start = 0
    for L in seqlens:
        sl = slice(start, start + L)
        qs, ks, vs = (x[sl].float().transpose(0, 1).unsqueeze(0) for x in (q, k, v))  # [1, H, L, D]
        o = F.scaled_dot_product_attention(qs, ks, vs, scale=q.shape[-1] ** -0.5)
        out[sl] = o[0].transpose(0, 1)
        start += L
    return out


def run_variant(name, q, k, v, cu, max_seqlen, poison=True):
    out = torch.full(q.shape, float("nan"), device=q.device, dtype=q.dtype) if poison else None
    return gluon_attn.gluon_varlen_attention(q, k, v, cu, max_seqlen, variant=name, out=out)


def run_triton(q, k, v, cu, max_seqlen):
    from backends.triton_attn import triton_varlen_attention

    out = torch.full(q.shape, float("nan"), device=q.device, dtype=q.dtype)
    return triton_varlen_attention(q, k, v, cu, max_seqlen, q.shape[-1] ** -0.5, out=out)


def smoke(name):
    """Subprocess body: run every test layout once; exit 0 when nothing crashed or hung."""
    for lname, seqlens, d in CASES:
        _, q, k, v, cu, ms = make_inputs(seqlens, d)
        run_variant(name, q, k, v, cu, ms)
        torch.cuda.synchronize()
    _, q, k, v, cu, ms = make_inputs([BENCH_T[1]], BENCH_D)
    run_variant(name, q, k, v, cu, ms)
    torch.cuda.synchronize()
    print("SMOKE_OK", name)


def smoke_all(names, timeout):
    ok = []
    for name in names:
        t0 = time.time()
        try:
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--smoke", name], capture_output=True,
                               text=True, timeout=timeout)
            passed = r.returncode == 0 and "SMOKE_OK" in r.stdout
            print(f"[smoke] {name}: {'ok' if passed else 'FAILED rc=%d' % r.returncode} ({time.time() - t0:.1f}s)")
            if not passed:
                print("\n".join((r.stdout + r.stderr).splitlines()[-40:]))
            else:
                ok.append(name)
        except subprocess.TimeoutExpired:
            print(f"[smoke] {name}: TIMEOUT after {timeout}s (likely an mbarrier/setmaxnreg deadlock)")
    return ok


def correctness(names):
    rows = []
    print("\n== correctness: max |out - ref_fp32| over all valid outputs (16 heads) ==")
    hdr = f"{'layout':14s} {'D':>3s} {'triton':>10s} " + " ".join(f"{n:>13s}" for n in names)
    print(hdr)
    for lname, seqlens, d in CASES:
        _, q, k, v, cu, ms = make_inputs(seqlens, d, seed=d)
        ref = reference(q, k, v, seqlens)
        errs = {}
        try:
            errs["triton"] = (run_triton(q, k, v, cu, ms).float() - ref).abs().max().item()
        except Exception:
            traceback.print_exc()
            errs["triton"] = float("nan")
        for n in names:
            try:
                o = run_variant(n, q, k, v, cu, ms)
                torch.cuda.synchronize()
                errs[n] = (o.float() - ref).abs().max().item()  # NaN (poison left unwritten) shows as nan
            except Exception:
                print(f"--- {n} {lname} d{d} failed:")
                traceback.print_exc()
                errs[n] = float("nan")
        print(f"{lname:14s} {d:3d} {errs['triton']:10.2e} " + " ".join(f"{errs[n]:13.2e}" for n in names))
        rows.append((lname, d, errs))
        del ref
    return rows


def bench(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=60)  # ms (median)


def timing(names):
    print(f"\n== timing: 1 segment, {HEADS} heads, head dim {BENCH_D}, non-causal; ms (TFLOP/s) ==")
    table = {}
    for T in BENCH_T:
        _, q, k, v, cu, ms = make_inputs([T], BENCH_D)
        flops = 4 * T * T * HEADS * BENCH_D
        res = {}
        out = torch.empty(q.shape, device="cuda", dtype=torch.bfloat16)
        try:
            from backends.triton_attn import triton_varlen_attention

            res["triton"] = bench(lambda: triton_varlen_attention(q, k, v, cu, ms, BENCH_D ** -0.5, out=out))
        except Exception:
            traceback.print_exc()
        try:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            qh, kh, vh = (x.transpose(0, 1).unsqueeze(0).contiguous() for x in (q, k, v))  # [1, H, T, D]
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                F.scaled_dot_product_attention(qh, kh, vh)
                res["cudnn"] = bench(lambda: F.scaled_dot_product_attention(qh, kh, vh))
        except Exception:
            traceback.print_exc()
        for n in names:
            try:
                gluon_attn.gluon_varlen_attention(q, k, v, cu, ms, variant=n, out=out)
                torch.cuda.synchronize()
                res[n] = bench(lambda n=n: gluon_attn.gluon_varlen_attention(q, k, v, cu, ms, variant=n, out=out))
            except Exception:
                print(f"--- timing {n} T={T} failed:")
                traceback.print_exc()
        for key, t in res.items():
            print(f"T={T:6d} {key:14s} {t:8.3f} ms  {flops / t / 1e9:7.1f} TFLOP/s")
        table[T] = {key: (t, flops / t / 1e9) for key, t in res.items()}
    return table


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--variants", default=",".join(gluon_variants.RECOMMENDED),
                    help="comma-separated names from gluon_attn.VARIANTS, or 'all'")
    ap.add_argument("--no-smoke", action="store_true")
    ap.add_argument("--smoke-timeout", type=int, default=90)
    ap.add_argument("--skip-timing", action="store_true")
    args = ap.parse_args()
    if args.smoke:
        smoke(args.smoke)
        return
    t0 = time.time()
    print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
    names = list(gluon_attn.VARIANTS) if args.variants == "all" else [n for n in args.variants.split(",") if n]
    unknown = [n for n in names if n not in gluon_attn.VARIANTS]
    if unknown:
        sys.exit(f"unknown variants {unknown}; known: {list(gluon_attn.VARIANTS)}")
    if not args.no_smoke:
        names = smoke_all(names, args.smoke_timeout)
    rows = correctness(names)
    table = {} if args.skip_timing else timing(names)

    print("\n== final table ==")
    print(f"{'variant':14s} {'max err (all layouts/dims)':>27s} " + " ".join(f"{'T=%d ms' % T:>12s} {'TFLOP/s':>8s}"
                                                                          for T in BENCH_T))
    for key in ["triton", "cudnn"] + names:
        errs = [r[2].get(key) for r in rows if key in r[2]]
        err = "-" if not errs else ("nan" if any(math.isnan(e) for e in errs) else f"{max(errs):.2e}")
        cells = []
        for T in BENCH_T:
            t = table.get(T, {}).get(key)
            cells.append(f"{t[0]:12.3f} {t[1]:8.1f}" if t else f"{'-':>12s} {'-':>8s}")
        print(f"{key:14s} {err:>27s} " + " ".join(cells))
    print(json.dumps({"rows": [(l, d, e) for l, d, e in rows], "timing": {str(k): v for k, v in table.items()}}))
    print(f"total wall time {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
