"""#15, eleventh round: the host work around one graph replay of a small image.

    PYTHONPATH=$PWD python docs/experiments/eleventh-round/replay_profile.py

Per preset at 1x224: synced median ms per call (what `rocm-vit bench` reports), back-to-back host ms
per call, the device time of the replay alone (events around `graph.replay()`), and a cProfile of
200 replays (tottime).
"""

import cProfile
import io
import pstats
import statistics
import time

import torch

from rocm_vit.cli.workload import build_tower, parse_layouts, random_pixels


def main():
    dev = torch.device("cuda")
    for preset in ("qwen3-vl-8b", "qwen2.5-vl-7b"):
        tower = build_tower(preset, dev, torch.bfloat16, None, 0)
        workload = parse_layouts("1x224", tower.config)[0]
        pixels = random_pixels(workload, tower.config, dev, 1).to(torch.bfloat16)
        grid = list(workload.grid_thw)
        tower.enable_graphs(min_sightings=1, max_tokens=100000)
        with torch.inference_mode():
            fn = lambda: tower(pixels, grid)  # noqa: E731
            for _ in range(10):
                fn()
            torch.cuda.synchronize()
            synced = []
            for _ in range(100):
                torch.cuda.synchronize()
                start = time.perf_counter()
                fn()
                torch.cuda.synchronize()
                synced.append((time.perf_counter() - start) * 1e3)
            start = time.perf_counter()
            for _ in range(200):
                fn()
            host = (time.perf_counter() - start) / 200 * 1e3
            torch.cuda.synchronize()
            wall = (time.perf_counter() - start) / 200 * 1e3
            entry = next(iter(tower.graph_runner._graphs.values()))
            device = []
            for _ in range(50):
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                entry.graph.replay()
                end.record()
                end.synchronize()
                device.append(begin.elapsed_time(end))
            print(f"=== {preset} 1x224: synced median {statistics.median(synced):.3f} ms, back-to-back host "
                  f"{host:.3f} ms/call, wall {wall:.3f} ms/call, graph.replay() alone on the device "
                  f"{statistics.median(device):.3f} ms", flush=True)
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(200):
                fn()
            profile.disable()
            torch.cuda.synchronize()
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(30)
            print(text.getvalue()[-6000:], flush=True)
        tower.disable_graphs()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
