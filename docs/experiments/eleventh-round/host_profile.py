"""#15, eleventh round: where an uncaptured 8B 1x224 forward spends its host time.

    PYTHONPATH=$PWD python docs/experiments/eleventh-round/host_profile.py [preset] [layout]

Prints eager ms per forward (back to back and synced), host us per call of each block-level op
(3000 calls without a sync), and cProfile tables (tottime and cumtime) over 20 forwards.
"""

import cProfile
import io
import pstats
import sys
import time

import torch

from rocm_vit.cli.workload import build_tower, parse_layouts, random_pixels
from rocm_vit.fusion import add_norm
from rocm_vit.rotary import apply_rotary


def per_call_ms(fn, n):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - start) / n * 1e3
    torch.cuda.synchronize()
    return host, (time.perf_counter() - start) / n * 1e3


def synced_ms(fn, n):
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[n // 2]


def host_us(fn, n=3000):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    elapsed = (time.perf_counter() - start) / n * 1e6
    torch.cuda.synchronize()
    return elapsed


def main():
    preset = sys.argv[1] if len(sys.argv) > 1 else "qwen3-vl-8b"
    layout_text = sys.argv[2] if len(sys.argv) > 2 else "1x224"
    dev = torch.device("cuda")
    tower = build_tower(preset, dev, torch.bfloat16, None, 0)
    workload = parse_layouts(layout_text, tower.config)[0]
    pixels = random_pixels(workload, tower.config, dev, 1).to(torch.bfloat16)
    grid = list(workload.grid_thw)
    with torch.inference_mode():
        fn = lambda: tower(pixels, grid, use_graphs=False)  # noqa: E731
        host, wall = per_call_ms(fn, 50)
        print(f"=== eager {preset} {layout_text}: back-to-back host {host:.3f} ms/call, wall {wall:.3f} ms/call, "
              f"synced median {synced_ms(fn, 50):.3f} ms", flush=True)

        block = tower.blocks[0]
        hidden = tower.config.hidden_size
        x = torch.randn(pixels.shape[0], hidden, device=dev, dtype=torch.bfloat16)
        prepared = tower._prepare(grid, pixels.shape[0])
        layout = prepared.layout
        attn_args = tower.attention.layout_args(layout, layout.cu_seqlens_tensors(dev))["full"]
        cos, sin = prepared.cos, prepared.sin
        qkv = block.attn.qkv(x)
        q, k, v = qkv.view(x.shape[0], 3, block.attn.num_heads, block.attn.head_dim).unbind(1)
        rows = [
            ("torch.empty", lambda: torch.empty(x.shape, device=dev, dtype=x.dtype)),
            ("F.linear qkv (module call)", lambda: block.attn.qkv(x)),
            ("view + unbind", lambda: qkv.view(x.shape[0], 3, block.attn.num_heads, block.attn.head_dim).unbind(1)),
            ("apply_rotary", lambda: apply_rotary(q, k, cos, sin)),
            ("add_norm", lambda: add_norm(x, x, block.norm2)),
            ("mlp", lambda: block.mlp(x)),
        ]
        rows.append(("attention backend", lambda: block.attn.backend(q, k, v, attn_args, block.attn.scale)))
        rows.append(("attention module (qkv, rotary, attention, proj)", lambda: block.attn(x, attn_args, cos, sin)))
        rows.append(("whole block", lambda: block(x, x, attn_args, cos, sin, block.norm1)))
        print("\n| op | host us per call |\n|---|---:|")
        for label, op in rows:
            print(f"| {label} | {host_us(op):.1f} |", flush=True)

        profile = cProfile.Profile()
        profile.enable()
        for _ in range(20):
            fn()
        profile.disable()
        torch.cuda.synchronize()
        for key in ("tottime", "cumtime"):
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats(key).print_stats(45)
            print(text.getvalue()[-9000:])


if __name__ == "__main__":
    main()
