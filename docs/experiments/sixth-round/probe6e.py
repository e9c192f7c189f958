"""Session 6 probe 5: Qwen2.5-VL MLP width padded to 8 (3424, SGLang's) vs 64 (3456), cuBLAS."""
import math
import torch, torch.nn.functional as F
import triton.testing
dev = torch.device("cuda")
def timed(fn, reps):
    fn(); torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(fn, rep=40, return_mode="median") / reps * 1e3
print(f"{'M':>6} {'gateup 3424':>11} {'gateup 3456':>11} {'down 3424':>9} {'down 3456':>9} (us)")
for M in (256, 1024, 4096, 16644):
    row = []
    for N, K in ((2 * 3424, 1280), (2 * 3456, 1280), (1280, 3424), (1280, 3456)):
        R = max(3, math.ceil(150e6 / (N * K * 2)))
        ws = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) / K**.5 for _ in range(R)]
        bs = [torch.randn(N, device=dev, dtype=torch.bfloat16) for _ in range(R)]
        x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        row.append(timed(lambda: [F.linear(x, w, b) for w, b in zip(ws, bs)], R))
    print(f"{M:6} {row[0]:11.2f} {row[1]:11.2f} {row[2]:9.2f} {row[3]:9.2f}", flush=True)
