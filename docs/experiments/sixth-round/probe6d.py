"""Session 6 probe 4: Qwen3-VL 8B MLP widths 4304 vs padded 4352, cuBLAS, over M."""
import math
import torch, torch.nn.functional as F
import triton.testing
dev = torch.device("cuda")
def timed(fn, reps):
    fn(); torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(fn, rep=40, return_mode="median") / reps * 1e3
print(f"{'M':>6} {'fc1 4304':>9} {'fc1 4352':>9} {'fc2 4304':>9} {'fc2 4352':>9} {'block 4304':>10} {'block 4352':>10} (us)")
for M in (196, 1024, 3072, 12800):
    row = []
    for gelu, width in ((True, 4304), (True, 4352), (False, 4304), (False, 4352)):
        N, K = (width, 1152) if gelu else (1152, width)
        R = max(3, math.ceil(150e6 / (N * K * 2)))
        ws = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) / K**.5 for _ in range(R)]
        bs = [torch.randn(N, device=dev, dtype=torch.bfloat16) for _ in range(R)]
        x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        if gelu:
            row.append(timed(lambda: [torch._addmm_activation(b, x, w.t(), use_gelu=True) for w, b in zip(ws, bs)], R))
        else:
            row.append(timed(lambda: [F.linear(x, w, b) for w, b in zip(ws, bs)], R))
    print(f"{M:6} {row[0]:9.2f} {row[1]:9.2f} {row[2]:9.2f} {row[3]:9.2f} {row[0]+row[2]:10.2f} {row[1]+row[3]:10.2f}", flush=True)
