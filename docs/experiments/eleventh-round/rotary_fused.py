"""#15, eleventh round: RoPE applied as triton_attn loads q and k, against the separate rotary launch.

    PYTHONPATH=$PWD python docs/experiments/eleventh-round/rotary_fused.py

Part 1, the kernels: graph-timed us per call (20 calls per graph, median of 30 replays) of
`apply_rotary` + `triton_varlen_attention` against `triton_varlen_attention(..., rotary=...)` per
segment layout, d72/d80, bf16, 16 heads; max error of each against float64 (rotation and attention
in float64). Part 2, the towers at 1x224 and 1x512 (random weights, bf16): synced median ms per call,
graphs and eager, with the fusion on and off (`_rotary_max_tokens` forced to 0 on the tower's
triton_attn), three interleaved rounds; graph replay against eager, bitwise.
"""

import statistics
import time

import torch

from rocm_vit.backends.triton_attn import triton_varlen_attention
from rocm_vit.cli.workload import build_tower, parse_layouts, random_pixels
from rocm_vit.rotary import apply_rotary

CALLS = 20


def graph_us(fn):
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(CALLS):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(30):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / CALLS)
    return statistics.median(times)


def rotate64(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos[:, None] + rotated * sin[:, None]


def kernels():
    heads = 16
    print("\n| d | segments | separate us | fused us | fused/separate | err separate | err fused |\n"
          "|---|---|---:|---:|---:|---:|---:|")
    for head_dim in (72, 80):
        for lens in ([196], [256], [64] * 4, [576], [1024], [2048], [4096], [196] * 4):
            tokens = sum(lens)
            qkv = torch.randn(tokens, 3, heads, head_dim, device="cuda", dtype=torch.bfloat16)
            q, k, v = qkv.unbind(1)
            angles = torch.rand(tokens, head_dim // 2, device="cuda") * 40
            cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
            cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
            scale = head_dim**-0.5
            ref = torch.empty(tokens, heads, head_dim, dtype=torch.float64, device="cuda")
            q64, k64 = rotate64(q.double(), cos.double(), sin.double()), rotate64(k.double(), cos.double(), sin.double())
            for start, length in zip(cu[:-1].tolist(), lens):
                rows = slice(start, start + length)
                ref[rows] = torch.nn.functional.scaled_dot_product_attention(
                    q64[rows].transpose(0, 1), k64[rows].transpose(0, 1), v[rows].double().transpose(0, 1), scale=scale
                ).transpose(0, 1)
            fused_out = triton_varlen_attention(q, k, v, cu, max(lens), scale, rotary=(cos, sin))
            qs, ks = q.clone(), k.clone()
            apply_rotary(qs, ks, cos, sin)
            separate_out = triton_varlen_attention(qs, ks, v, cu, max(lens), scale)
            err_fused = (fused_out.double() - ref).abs().max().item()
            err_separate = (separate_out.double() - ref).abs().max().item()
            out = torch.empty_like(q)

            def separate():
                apply_rotary(qs, ks, cos, sin)
                triton_varlen_attention(qs, ks, v, cu, max(lens), scale, out=out)

            def fused():
                triton_varlen_attention(q, k, v, cu, max(lens), scale, out=out, rotary=(cos, sin))

            t_separate, t_fused = graph_us(separate), graph_us(fused)
            label = f"{len(lens)}x{lens[0]}"
            print(f"| {head_dim} | {label} | {t_separate:.2f} | {t_fused:.2f} | {t_fused / t_separate:.2f} | "
                  f"{err_separate:.2e} | {err_fused:.2e} |", flush=True)


def synced_ms(fn, n=300):
    for _ in range(10):
        fn()
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def triton_backends(tower):
    attention = tower.attention
    backends = getattr(attention, "_backends", {attention.name: attention})
    return [b for b in backends.values() if type(b).__name__ == "TritonAttention"]


def towers():
    dev = torch.device("cuda")
    rows = []
    for preset in ("qwen3-vl-8b", "qwen2.5-vl-7b"):
        tower = build_tower(preset, dev, torch.bfloat16, None, 0)
        limit = triton_backends(tower)[0]._rotary_max_tokens
        for layout_text in ("1x224", "1x512"):
            workload = parse_layouts(layout_text, tower.config)[0]
            pixels = random_pixels(workload, tower.config, dev, 1).to(torch.bfloat16)
            grid = list(workload.grid_thw)
            results = {}
            with torch.inference_mode():
                for _ in range(3):
                    for fused in (True, False):
                        for backend in triton_backends(tower):
                            backend._rotary_max_tokens = limit if fused else 0
                        tower.enable_graphs(min_sightings=1, max_tokens=100000)
                        graph = synced_ms(lambda: tower(pixels, grid))
                        eager = synced_ms(lambda: tower(pixels, grid, use_graphs=False), n=30)
                        exact = torch.equal(tower(pixels, grid), tower(pixels, grid, use_graphs=False))
                        results.setdefault(fused, []).append((graph, eager, exact))
                        tower.disable_graphs()
                        torch.cuda.empty_cache()
            for fused in (True, False):
                graphs = [r[0] for r in results[fused]]
                eagers = [r[1] for r in results[fused]]
                rows.append((preset, layout_text, "fused" if fused else "separate", min(graphs), max(graphs),
                             statistics.median(eagers), all(r[2] for r in results[fused])))
        print(f"  {preset} done (fusion limit {limit} tokens)", flush=True)
    print("\n| preset | layout | rotary | graph ms (min-max of 3 rounds) | eager ms (median of 3) | graph == eager |\n"
          "|---|---|---|---|---:|---|")
    for preset, layout, mode, low, high, eager, exact in rows:
        print(f"| {preset} | {layout} | {mode} | {low:.3f}-{high:.3f} | {eager:.2f} | {exact} |")


def main():
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), torch.__version__)
    kernels()
    towers()


if __name__ == "__main__":
    main()
