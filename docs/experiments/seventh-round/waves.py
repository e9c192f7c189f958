"""Wave quantisation of triton_attn on one long segment: time against length around 12,800 tokens.

1600 programs of 128 query rows (100 tiles x 16 heads) on 132 SMs x 2 resident programs is 6.06
waves; 99 tiles is exactly 6. If the last, nearly empty wave costs a whole program's time, 12,672
tokens runs ~6/7 of 12,800's time instead of (99/100)**2 of it.

    PYTHONPATH=$PWD python docs/experiments/seventh-round/waves.py
"""
import torch
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

from rocm_vit.backends.sdpa import sdpa_varlen
from rocm_vit.backends.triton_attn import triton_varlen_attention

H, D = 16, 72
print(f"{'tokens':>7} {'tiles':>5} {'waves':>6} {'triton ms':>9} {'ms/L^2 rel':>10} {'cuDNN ms':>8} {'ms/L^2 rel':>10}")
base = {}
for n in (8448, 8576, 10496, 10560, 12544, 12672, 12800, 12928, 13056, 13184, 13312, 13440, 13568):
    qkv = torch.randn((n, 3, H, D), device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.unbind(1)
    cu = torch.tensor([0, n], dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    t = triton.testing.do_bench(lambda: triton_varlen_attention(q, k, v, cu, n, D**-0.5, out=out), warmup=20, rep=100, return_mode="median")

    def cudnn():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return sdpa_varlen(q, k, v, [n], D**-0.5)

    c = triton.testing.do_bench(cudnn, warmup=20, rep=100, return_mode="median")
    tiles = -(-n // 128)
    base.setdefault("t", t / n**2); base.setdefault("c", c / n**2)
    print(f"{n:7d} {tiles:5d} {tiles * H / 264:6.2f} {t:9.3f} {t / n**2 / base['t']:10.3f} {c:8.3f} {c / n**2 / base['c']:10.3f}")
