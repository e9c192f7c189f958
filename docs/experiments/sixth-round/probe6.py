"""Session 6 probe: GEMM sweep vs cuBLAS, kernel breakdown of small-image towers, host profile of eager."""
import cProfile, io, itertools, math, pstats, sys, time, os
import torch, torch.nn.functional as F
import triton, triton.testing
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__))); import triton_linear as tlin
from rocm_vit.cli.workload import build_tower, parse_layouts, random_pixels, median_ms

dev = torch.device("cuda")
torch.manual_seed(0)
which = sys.argv[1:] or ["gemm", "kernels", "host"]

def timed(fn, reps):
    fn(); torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(fn, rep=30, return_mode="median") / reps

if "gemm" in which:
    shapes = [  # name, M, N, K, act
        ("8b qkv", 196, 3456, 1152, "none"), ("8b proj", 196, 1152, 1152, "none"),
        ("8b fc1", 196, 4304, 1152, "gelu_tanh"), ("8b fc2", 196, 1152, 4304, "none"),
        ("8b mfc1", 49, 4608, 4608, "gelu_tanh"), ("8b mfc2", 49, 4096, 4608, "none"),
        ("8b qkv", 1024, 3456, 1152, "none"), ("8b proj", 1024, 1152, 1152, "none"),
        ("8b fc1", 1024, 4304, 1152, "gelu_tanh"), ("8b fc2", 1024, 1152, 4304, "none"),
        ("7b qkv", 256, 3840, 1280, "none"), ("7b proj", 256, 1280, 1280, "none"),
        ("7b gateup", 256, 6840, 1280, "none"), ("7b down", 256, 1280, 3420, "none"),
    ]
    rows = []
    for name, M, N, K, act in shapes:
        wbytes = N * K * 2
        R = max(4, math.ceil(150e6 / wbytes))
        ws = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) / K**.5 for _ in range(R)]
        bs = [torch.randn(N, device=dev, dtype=torch.bfloat16) for _ in range(R)]
        x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        ref = F.linear(x.double(), ws[0].double(), bs[0].double())
        if act == "gelu_tanh":
            ref = F.gelu(ref, approximate="tanh")
            cub = lambda: [torch._addmm_activation(b, x, w.t(), use_gelu=True) for w, b in zip(ws, bs)]
            cub_err = (torch._addmm_activation(bs[0], x, ws[0].t(), use_gelu=True).double() - ref).abs().max().item()
        else:
            cub = lambda: [F.linear(x, w, b) for w, b in zip(ws, bs)]
            cub_err = (F.linear(x, ws[0], bs[0]).double() - ref).abs().max().item()
        t_cub = timed(cub, R)
        floor_bw = wbytes / 4.8e12 * 1e6
        floor_fl = 2 * M * N * K / 800e12 * 1e6
        results = []
        for bm, bn, bk, s, st, nw in itertools.product([64, 128], [64, 128], [64, 128], [1, 2, 4, 8], [3, 4], [4, 8]):
            if bm == 128 and M <= 64: continue
            if K / s < 2 * bk: continue
            if bk == 128 and st == 4: continue
            if nw == 8 and bm * bn < 128 * 128: continue
            cfg = tlin.LinearConfig(bm, bn, bk, s, nw, st)
            try:
                y = tlin.linear(x, ws[0], bs[0], act, cfg)
                err = (y.double() - ref).abs().max().item()
                t = timed(lambda: [tlin.linear(x, w, b, act, cfg) for w, b in zip(ws, bs)], R)
            except Exception as e:
                print("FAIL", name, M, cfg, type(e).__name__, str(e)[:100]); continue
            results.append((t, cfg, err))
        results.sort(key=lambda r: r[0])
        best = results[0]
        print(f"{name:10} M={M:5} N={N:5} K={K:5} floor bw {floor_bw:5.2f} fl {floor_fl:5.2f} us | cuBLAS {t_cub*1e3:6.2f} us err {cub_err:.2e}", flush=True)
        for t, cfg, err in results[:4]:
            print(f"      triton {t*1e3:6.2f} us err {err:.2e} {cfg}", flush=True)
        rows.append((name, M, t_cub * 1e3, best[0] * 1e3, best[1]))
        del ws, bs
    print("\n=== GEMM summary (us per call, weights rotated past L2)")
    for name, M, c, t, cfg in rows:
        print(f"{name:10} M={M:5} cuBLAS {c:7.2f} triton {t:7.2f}  x{c/t:4.2f}  {cfg}")

def tower_case(preset, spec):
    tower = build_tower(preset, dev, torch.bfloat16, None, 0)
    w = parse_layouts(spec, tower.config)[0]
    px = random_pixels(w, tower.config, dev, 1).to(torch.bfloat16)
    return tower, list(w.grid_thw), px

if "kernels" in which:
    from torch.profiler import profile, ProfilerActivity
    for preset, spec in [("qwen3-vl-8b", "1x224"), ("qwen3-vl-8b", "1x512"), ("qwen2.5-vl-7b", "1x224")]:
        tower, grid, px = tower_case(preset, spec)
        with torch.inference_mode():
            tower.enable_graphs(min_sightings=1, max_tokens=100000)
            out = tower(px, grid); eager = tower(px, grid, use_graphs=False)
            g_ms = median_ms(lambda: tower(px, grid), dev, 50)
            e_ms = median_ms(lambda: tower(px, grid, use_graphs=False), dev, 20)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(5): tower(px, grid, use_graphs=False)
                torch.cuda.synchronize()
        print(f"\n=== {preset} {spec}: graph {g_ms:.3f} ms eager {e_ms:.3f} ms exact={torch.equal(out, eager)}")
        tot = 0; agg = {}
        for evt in prof.key_averages():
            t = evt.device_time_total if hasattr(evt, "device_time_total") else evt.cuda_time_total
            if t > 0 and evt.device_type.name == "CUDA":
                agg[evt.key] = (t / 5, evt.count // 5)
                tot += t / 5
        print(f"device kernel time per forward {tot/1e3:.3f} ms")
        for k, (t, n) in sorted(agg.items(), key=lambda kv: -kv[1][0])[:18]:
            print(f"  {t:8.1f} us  x{n:4}  {k[:110]}")
        del tower

if "host" in which:
    tower, grid, px = tower_case("qwen3-vl-8b", "1x224")
    with torch.inference_mode():
        for _ in range(3): tower(px, grid, use_graphs=False)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20): tower(px, grid, use_graphs=False)
        host = (time.perf_counter() - t0) / 20 * 1e3
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / 20 * 1e3
        print(f"\n=== eager 8B 1x224: host {host:.2f} ms per forward (launch returns), wall {wall:.2f} ms")
        pr = cProfile.Profile(); pr.enable()
        for _ in range(10): tower(px, grid, use_graphs=False)
        pr.disable(); torch.cuda.synchronize()
        s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30); print(s.getvalue()[:9000])
        s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(40); print(s.getvalue()[:9000])
