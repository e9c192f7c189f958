"""What a kernel costs in a graph when it does nothing, and cuBLAS vs cuBLASLt on the 8B GEMM chain at 196 rows."""
import torch, triton, triton.language as tl
import torch.nn.functional as F

@triton.jit
def _nop(p):
    pass

@triton.jit
def _touch(p, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(p + o, tl.load(p + o, mask=o < n) + 1, mask=o < n)

def graph_ms(fn, reps=30):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(); fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(5): g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b))
    ts.sort(); return ts[len(ts) // 2]

dev = "cuda"
buf = torch.randn(196 * 1152, device=dev)
n = 250
rows = []
rows.append(("empty Triton kernel, 1 program", graph_ms(lambda: [_nop[(1,)](buf) for _ in range(n)]) / n * 1e3))
rows.append(("Triton read+write 196x1152 fp32, 226 programs", graph_ms(lambda: [_touch[(triton.cdiv(buf.numel(), 1024),)](buf, buf.numel(), BLOCK=1024) for _ in range(n)]) / n * 1e3))
rows.append(("torch add_ 196x1152 fp32", graph_ms(lambda: [buf.add_(1) for _ in range(n)]) / n * 1e3))

H, I, NB = 1152, 4304, 27
torch.manual_seed(0)
W = [dict(qkv=(torch.randn(3 * H, H, device=dev, dtype=torch.bfloat16) * .02, torch.randn(3 * H, device=dev, dtype=torch.bfloat16)),
          proj=(torch.randn(H, H, device=dev, dtype=torch.bfloat16) * .02, torch.randn(H, device=dev, dtype=torch.bfloat16)),
          fc1=(torch.randn(I, H, device=dev, dtype=torch.bfloat16) * .02, torch.randn(I, device=dev, dtype=torch.bfloat16)),
          fc2=(torch.randn(H, I, device=dev, dtype=torch.bfloat16) * .02, torch.randn(H, device=dev, dtype=torch.bfloat16))) for _ in range(NB)]
x = torch.randn(196, H, device=dev, dtype=torch.bfloat16)
def chain():
    h = x
    for b in W:
        F.linear(h, *b["qkv"])
        a = F.linear(h, *b["proj"])
        f = torch._addmm_activation(b["fc1"][1], a, b["fc1"][0].t(), use_gelu=True)
        h = h + F.linear(f, *b["fc2"])
    return h
for lib in ("cublas", "cublaslt", "cublas"):
    torch.backends.cuda.preferred_blas_library(lib)
    ms = graph_ms(chain)
    rows.append((f"8B GEMM chain 27 blocks (bias, GELU fc1), {lib}", ms * 1e3))
print("| case | us (per kernel, or per chain) |\n|---|---:|")
for r in rows: print(f"| {r[0]} | {r[1]:.2f} |")
