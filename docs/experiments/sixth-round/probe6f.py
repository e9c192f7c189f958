"""Session 6 probe 6: Qwen2.5-VL-7B tower with the MLP padded to 8 vs 64, same process, interleaved."""
import torch
import rocm_vit.models.qwen2_5_vl as q25
from rocm_vit.cli.workload import build_tower, parse_layouts, random_pixels, median_ms
dev = torch.device("cuda")
towers = {}
for multiple in (8, 64):
    q25.padded_intermediate_size = lambda size, m=multiple: -(-size // m) * m
    towers[multiple] = build_tower("qwen2.5-vl-7b", dev, torch.bfloat16, None, 0)
    towers[multiple].enable_graphs(min_sightings=1, max_tokens=100000, budget_bytes=8 << 30)
    print(multiple, towers[multiple].blocks[0].mlp.padded_size)
specs = ["1x224", "4x512", "1x768x1024", "1x2048x1600"]
results = {(m, s): [] for m in towers for s in specs}
with torch.inference_mode():
    for spec in specs:
        w = parse_layouts(spec, towers[8].config)[0]
        px = random_pixels(w, towers[8].config, dev, 1).to(torch.bfloat16)
        grid = list(w.grid_thw)
        for rnd in range(3):
            for m, tower in towers.items():
                results[(m, spec)].append(median_ms(lambda: tower(px, grid), dev, 15))
for spec in specs:
    a, b = results[(8, spec)], results[(64, spec)]
    print(f"{spec:12} pad8 {' '.join(f'{v:7.3f}' for v in a)} | pad64 {' '.join(f'{v:7.3f}' for v in b)} | min ratio {min(a)/min(b):.3f}")
