"""Compile the variants for sm_90a on this CPU (Triton 3.9); report regs, spills, ptxas C7515, SASS op counts."""
import os, re, subprocess, sys, tempfile, collections
sys.path.insert(0, os.path.dirname(__file__))
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import variants

BIN = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin")

def compile_variant(d=72, bm=128, bn=64, warps=8, stages=3, dt="bf16", **flags):
    d0 = 1 << (d.bit_length() - 1); rest = d - d0; d1 = max(16, triton.next_power_of_2(rest)) if rest else 0
    sig = {"Q": f"*{dt}", "K": f"*{dt}", "V": f"*{dt}", "Out": f"*{dt}", "cu_seqlens": "*i32"}
    for n in ["stride_qn","stride_qh","stride_kn","stride_kh","stride_vn","stride_vh","stride_on","stride_oh"]:
        sig[n] = "i32"
    sig["qk_scale_log2"] = "fp32"
    const = dict(GROUP_SIZE=1, HEAD_DIM=d, BLOCK_D0=d0, BLOCK_D1=d1, BLOCK_M=bm, BLOCK_N=bn, ALIGN=8, DOT_PRECISION=None)
    const.update(dict(LAZY=0.0, SUM_DOT=False, EXP=0)); const.update(flags)
    for k in const: sig[k] = "constexpr"
    src = ASTSource(fn=variants._varlen_attn_fwd, signature=sig, constexprs=const)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})

def report(k):
    ptx = k.asm["ptx"]
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(re.sub(r"\.version \d+\.\d+", ".version 8.7", ptx))
    r = subprocess.run([f"{BIN}/ptxas", "-arch=sm_90a", "-v", f.name, "-o", f.name + ".o"], capture_output=True, text=True)
    t = r.stderr + r.stdout
    used = [l.split(":",1)[1].strip() for l in t.splitlines() if "Used" in l]
    sass = subprocess.run([f"{BIN}/cuobjdump", "--dump-sass", f.name + ".o"], capture_output=True, text=True).stdout
    ops = collections.Counter(m.group(1).split(".")[0] for m in re.finditer(r"/\*[0-9a-f]{4}\*/\s+(?:@!?P\d\s+)?([A-Z][A-Z0-9_.]+)", sass))
    return ("C7515" in t), used[0] if used else t[-300:], ops, sass

if __name__ == "__main__":
    for spec in sys.argv[1:]:
        kw = eval(spec)
        k = compile_variant(**kw)
        c, used, ops, sass = report(k)
        key = ["MUFU","FFMA","FMUL","FADD","FMNMX","F2FP","HGMMA","BAR","SHFL","F2F","HADD2","HMUL2","PRMT","FSEL","FSETP"]
        print(spec, "C7515" if c else "ok", used, {o: ops[o] for o in key if ops[o]})
        open(f"/tmp/sass_{abs(hash(spec))}.txt","w").write(sass)
