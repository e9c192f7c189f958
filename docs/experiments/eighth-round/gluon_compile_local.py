"""Compile the Gluon attention variants for sm_90a on a CPU-only box and report ptxas registers /
spills / smem, SASS instruction counts and the warp-specialisation register plan.

Runs under Triton 3.6 and 3.9 (same source):
    /tmp/venv36/bin/python       docs/experiments/eighth-round/gluon_compile_local.py [variant ...] [--dims=64,72,80]
    /work/main/.venv/bin/python  docs/experiments/eighth-round/gluon_compile_local.py [variant ...] [--dims=64,72,80]

ptxas is the one Triton's own backend uses for sm_90 (3.6: bin/ptxas, CUDA 12.8; 3.9: bin/ptxas-blackwell,
CUDA 13.x, with Triton's --regAllocOptLevel=2), and outputs go to build/triton-<version>/.
"""
import collections
import inspect
import os
import re
import subprocess
import sys
import tempfile
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402

import gluon_variants as gluon_attn  # noqa: E402

from triton.backends.nvidia import compiler as _nvc  # noqa: E402

BIN = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin")
# the ptxas Triton itself runs for sm_90 (3.6: "ptxas"; 3.9: "ptxas-blackwell", which is CUDA 13)
PTXAS = _nvc.get_ptxas(90).path
# Triton 3.9 adds --regAllocOptLevel=2 to every ptxas call (ptxas 13.x workaround); mirror what it does
PTXAS_EXTRA = ["--regAllocOptLevel=2"] if "regAllocOptLevel" in inspect.getsource(_nvc.CUDABackend.make_cubin) else []
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "build", f"triton-{triton.__version__}")


def desc_sig(rows, width):
    lay = gl.NVMMASharedLayout.get_default_for([rows, 1, width], gl.bfloat16)
    return f"tensordesc<bf16[{rows}, 1, {width}],{lay!r}>"


def compile_variant(name, head_dim):
    cfg = gluon_attn.variant_config(name)
    bn, qrows, warps = cfg["block_n"], cfg["qrows"], cfg["warps"]
    sig = {
        "q_desc0": desc_sig(qrows, 64), "q_desc1": desc_sig(qrows, 16),
        "k_desc0": desc_sig(bn, 64), "k_desc1": desc_sig(bn, 16),
        "v_desc0": desc_sig(bn, 64), "v_desc1": desc_sig(bn, 16),
        "out_ptr": "*bf16", "cu_seqlens": "*i32", "stride_on": "i32", "stride_oh": "i32", "qk_scale": "fp32",
    }
    const = dict(HEAD_DIM=head_dim, **cfg["const"])
    for k in const:
        sig[k] = "constexpr"
    # out_ptr and cu_seqlens are 16-byte aligned, strides divisible by 16 (what the JIT would specialise)
    # (16 heads: stride_on = 16 * D is always a multiple of 16; stride_oh = D only for D = 64 / 80)
    attrs = {(6,): [["tt.divisibility", 16]], (7,): [["tt.divisibility", 16]], (8,): [["tt.divisibility", 16]]}
    if head_dim % 16 == 0:
        attrs[(9,)] = [["tt.divisibility", 16]]
    src = GluonASTSource(fn=cfg["kernel"], signature=sig, constexprs=const, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": 1})


def reg_plan(ptx, cfg):
    """The setmaxnreg plan of a warp-specialised kernel and whether it fits the CTA's register pool.

    Triton sets .maxnreg M and .reqntid N (all warps, the loader warp padded to a warpgroup); the pool
    is M * N. At run time the default partition (consumer 0) does setmaxnreg to D (the first
    setmaxnreg in the PTX), each worker warpgroup to its request. If D + sum(requests) > M * N / 128 a
    setmaxnreg.inc never returns: the GPU hangs.
    """
    mx = re.search(r"\.maxnreg (\d+)", ptx)
    nt = re.search(r"\.reqntid (\d+)", ptx)
    regs = re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx)
    if not regs:
        return ""
    maxnreg, nthreads = int(mx.group(1)), int(nt.group(1))
    # the default partition's level inside the warp_specialize region: "barrier.sync 1; setmaxnreg X;
    # barrier.sync 1" (before the region it runs at the first setmaxnreg of the PTX, while the idle
    # workers sit at a lower level)
    m = re.search(r"barrier\.sync\s+1;\s*setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32\s+(\d+);\s*barrier\.sync\s+1;", ptx)
    default = int(m.group(1)) if m else int(regs[0][1])
    c = cfg["const"]
    ncons = cfg["block_m"] // 64
    workers = [c["CONSUMER_REGS"]] * (ncons - 1) + [c["LOADER_REGS"]]
    workers = [(w + 7) // 8 * 8 for w in workers]
    total = default + sum(workers)
    pool = maxnreg * nthreads // 128
    missing = [w for w in workers if str(w) not in {v for _, v in regs}]
    ok = total <= pool and not missing and nthreads == 128 * (1 + len(workers))
    return (f"maxnreg={maxnreg} reqntid={nthreads} plan: default {default} + workers {workers} = {total} "
            f"{'<=' if total <= pool else '>'} pool {pool} per-thread-of-a-warpgroup -> "
            f"{'FITS' if ok else 'DOES NOT FIT (setmaxnreg would hang!)'}"
            f"{'' if not missing else ' (requests missing from PTX: %s)' % missing}"
            f"  [all setmaxnreg: {sorted(set(regs))}]")


def report(kernel, tag, cfg=None):
    os.makedirs(OUT, exist_ok=True)
    ptx = kernel.asm["ptx"]
    path = os.path.join(OUT, tag)
    open(path + ".ttgir", "w").write(kernel.asm["ttgir"])
    open(path + ".ptx", "w").write(ptx)
    if os.path.exists(path + ".o"):
        os.remove(path + ".o")
    r = subprocess.run([PTXAS, "-lineinfo", "-v", *PTXAS_EXTRA, "--gpu-name=sm_90a", path + ".ptx", "-o", path + ".o"],
                       capture_output=True, text=True)
    if r.returncode != 0 or not os.path.exists(path + ".o"):
        raise RuntimeError(f"ptxas failed:\n{r.stderr}{r.stdout}")
    # Triton's own cubin (same ptxas + flags) is what runs; dump its SASS
    open(path + ".cubin", "wb").write(kernel.asm["cubin"])
    t = r.stderr + r.stdout
    used = [l.split(":", 1)[1].strip() for l in t.splitlines() if "Used" in l]
    spill = [l.strip() for l in t.splitlines() if "spill" in l]
    sass = subprocess.run([f"{BIN}/cuobjdump", "--dump-sass", path + ".cubin"], capture_output=True, text=True).stdout
    open(path + ".sass", "w").write(sass)
    ops = collections.Counter(
        m.group(1).split(".")[0]
        for m in re.finditer(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", sass))
    # warp specialisation: setmaxnreg requests must fit in the CTA's register pool (maxnreg * threads)
    ws = reg_plan(ptx, cfg) if cfg is not None else ""
    return used[0] if used else t[-400:], spill, ops, ("C75" in t or "Performance Loss" in t or "warning" in t.lower()), t, ws


KEY = ["HGMMA", "WARPGROUP", "BAR", "SYNCS", "UTMALDG", "MUFU", "FFMA", "FMUL", "SHFL", "F2FP", "LDS", "STS",
       "LDL", "STL", "STG", "USETMAXREG"]

if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    dims = [72, 80, 64]
    for a in sys.argv[1:]:
        if a.startswith("--dims"):
            dims = [int(x) for x in a.split("=", 1)[1].split(",")]
    names = args or list(gluon_attn.VARIANTS)
    print(f"triton {triton.__version__}  ptxas {PTXAS} {' '.join(PTXAS_EXTRA)}  -> {OUT}")
    for name in names:
        for d in dims:
            tag = f"{name}_d{d}"
            try:
                k = compile_variant(name, d)
                used, spill, ops, warn, t, ws = report(k, tag, gluon_attn.variant_config(name))
                print(f"{tag:18s} smem={k.metadata.shared:6d} {used}")
                print(f"{'':18s} {'; '.join(spill)}")
                print(f"{'':18s} " + " ".join(f"{o}={ops[o]}" for o in KEY if ops[o]))
                if ws:
                    print(f"{'':18s} {ws}")
                if warn:
                    print(f"{'':18s} ptxas: " + " | ".join(l for l in t.splitlines() if "arning" in l or "C75" in l))
            except Exception:
                print(f"{tag}: FAILED")
                traceback.print_exc()
