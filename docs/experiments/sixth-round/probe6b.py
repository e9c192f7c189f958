"""Session 6 probe 2: cuBLAS alignment, host cost per launch kind, Triton direct launch."""
import math, sys, time
import torch, torch.nn.functional as F
import triton, triton.testing
dev = torch.device("cuda")
which = sys.argv[1:] or ["align", "host"]

def timed(fn, reps):
    fn(); torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(fn, rep=30, return_mode="median") / reps * 1e3

if "align" in which:
    print("=== cuBLAS: unpadded vs padded widths (us per call, weights rotated past L2)")
    for name, M, N, K, gelu in [("8b fc1", 196, 4304, 1152, True), ("8b fc1 pad", 196, 4352, 1152, True),
                                ("8b fc2", 196, 1152, 4304, False), ("8b fc2 pad", 196, 1152, 4352, False),
                                ("8b fc1", 1024, 4304, 1152, True), ("8b fc1 pad", 1024, 4352, 1152, True),
                                ("8b fc2", 1024, 1152, 4304, False), ("8b fc2 pad", 1024, 1152, 4352, False),
                                ("7b gate", 256, 3420, 1280, False), ("7b gateup pad", 256, 6912, 1280, False),
                                ("7b down", 256, 1280, 3420, False), ("7b down pad", 256, 1280, 3456, False),
                                ("7b down", 4096, 1280, 3420, False), ("7b down pad", 4096, 1280, 3456, False),
                                ("7b gateup pad", 4096, 6912, 1280, False)]:
        R = max(4, math.ceil(150e6 / (N * K * 2)))
        ws = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) / K**.5 for _ in range(R)]
        bs = [torch.randn(N, device=dev, dtype=torch.bfloat16) for _ in range(R)]
        x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        if gelu:
            t = timed(lambda: [torch._addmm_activation(b, x, w.t(), use_gelu=True) for w, b in zip(ws, bs)], R)
        else:
            t = timed(lambda: [F.linear(x, w, b) for w, b in zip(ws, bs)], R)
        print(f"{name:14} M={M:5} N={N:5} K={K:5}  {t:7.2f} us", flush=True)

def host_us(fn, n=3000):
    for _ in range(50): fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n): fn()
    t = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return t

if "host" in which:
    from rocm_vit.backends import triton_add_norm, triton_rope, triton_attn
    from rocm_vit import fusion
    from torch import nn
    x = torch.randn(196, 1152, device=dev, dtype=torch.bfloat16)
    w = torch.randn(3456, 1152, device=dev, dtype=torch.bfloat16); b = torch.randn(3456, device=dev, dtype=torch.bfloat16)
    norm = nn.LayerNorm(1152, eps=1e-6).to(dev, torch.bfloat16)
    qkv = torch.randn(196, 3, 16, 72, device=dev, dtype=torch.bfloat16)
    q, k, v = qkv.unbind(1)
    cos = torch.randn(196, 72, device=dev); sin = torch.randn(196, 72, device=dev)
    cu = torch.tensor([0, 196], device=dev, dtype=torch.int32)
    lin = nn.Linear(1152, 3456).to(dev, torch.bfloat16)
    rows = [
        ("torch.empty", lambda: torch.empty(196, 1152, device=dev, dtype=torch.bfloat16)),
        ("x + x", lambda: x + x),
        ("F.linear", lambda: F.linear(x, w, b)),
        ("nn.Linear module", lambda: lin(x)),
        ("triton add_norm (wrapper)", lambda: triton_add_norm.add_norm(x, x, norm.weight, norm.bias, 1e-6, "layer_norm")),
        ("fusion.add_norm (dispatch)", lambda: fusion.add_norm(x, x, norm)),
        ("triton rotary (wrapper)", lambda: triton_rope.triton_rotary_(q, k, cos, sin)),
        ("triton attn (wrapper)", lambda: triton_attn.triton_varlen_attention(q, k, v, cu, 196, 72**-0.5)),
    ]
    # Triton's own launch path against calling the compiled kernel's launcher directly.
    jit = triton_add_norm._add_norm_kernel
    summed = torch.empty_like(x); normed = torch.empty_like(x)
    args = (x, x, norm.weight, norm.bias, summed, normed, 1e-6)
    kw = dict(HIDDEN=1152, BLOCK=2048, HAS_UPDATE=True, HAS_BIAS=True, RMS=False, num_warps=8, enable_fp_fusion=False)
    rows.append(("jit[grid](...) add_norm", lambda: jit[(196,)](*args, **kw)))
    try:
        from triton.runtime.driver import driver
        from triton import knobs
        device = driver.active.get_current_device()
        kernel_cache, kernel_key_cache, target, backend, binder = jit.device_caches[device]
        jit[(196,)](*args, **kw); torch.cuda.synchronize()
        bound_args, specialization, options = binder(*args, **kw)
        compiled = list(kernel_cache.values())[0]
        vals = tuple(bound_args.values())
        def direct():
            stream = driver.active.get_current_stream(device)
            compiled.run(196, 1, 1, stream, compiled.function, compiled.packed_metadata, None,
                         knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *vals)
        direct(); torch.cuda.synchronize()
        ref = triton_add_norm.add_norm(x, x, norm.weight, norm.bias, 1e-6, "layer_norm")[1]
        print("direct launch equal:", torch.equal(normed, ref))
        rows.append(("compiled.run(...) add_norm", direct))
        rows.append(("binder(...) alone", lambda: binder(*args, **kw)))
        rows.append(("get_current_stream", lambda: driver.active.get_current_stream(device)))
        rows.append(("torch.cuda.current_stream().cuda_stream", lambda: torch.cuda.current_stream().cuda_stream))
    except Exception as e:
        print("direct launch failed:", type(e).__name__, e)
    import cProfile, pstats, io
    for name, fn in rows:
        if "wrapper" in name:
            pr = cProfile.Profile(); pr.enable()
            for _ in range(1000): fn()
            pr.disable(); torch.cuda.synchronize()
            s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(14); print("PROFILE", name); print(s.getvalue()[-3500:])
    print("=== host microseconds per call (no sync, 3000 calls)")
    for name, fn in rows:
        print(f"  {name:42} {host_us(fn):7.2f} us", flush=True)
