"""Session 6 probe 3: host time of eager and replay after the launch-math change, with profiles."""
import cProfile, io, pstats, time, sys
import torch
from rocm_vit.cli.workload import build_tower, parse_layouts, random_pixels
dev = torch.device("cuda")
tower = build_tower("qwen3-vl-8b", dev, torch.bfloat16, None, 0)
w = parse_layouts("1x224", tower.config)[0]
px = random_pixels(w, tower.config, dev, 1).to(torch.bfloat16)
grid = list(w.grid_thw)
tower.enable_graphs(min_sightings=1, max_tokens=100000)

def per_call(fn, n):
    for _ in range(5): fn()
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(n): fn()
    host = (time.perf_counter() - t0) / n * 1e3
    torch.cuda.synchronize(); wall = (time.perf_counter() - t0) / n * 1e3
    return host, wall

def synced(fn, n):
    ts = []
    for _ in range(n):
        torch.cuda.synchronize(); t0 = time.perf_counter(); fn(); torch.cuda.synchronize(); ts.append((time.perf_counter() - t0) * 1e3)
    return sorted(ts)[n // 2]

with torch.inference_mode():
    for label, fn in [("eager", lambda: tower(px, grid, use_graphs=False)), ("replay", lambda: tower(px, grid))]:
        host, wall = per_call(fn, 50)
        print(f"=== {label} 8B 1x224: back-to-back host {host:.3f} ms/call, wall {wall:.3f} ms/call, synced median {synced(fn, 50):.3f} ms", flush=True)
        pr = cProfile.Profile(); pr.enable()
        for _ in range(20): fn()
        pr.disable(); torch.cuda.synchronize()
        s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(28); print(s.getvalue()[-7000:])
