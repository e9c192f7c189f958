"""#15, eleventh round: where a synced 1x224 replay's time goes beyond the graph itself.

    PYTHONPATH=$PWD python docs/experiments/eleventh-round/replay_split.py

Synced medians (device synchronised before and after each call, 400 calls) of: the whole tower call;
the runner's `run` alone; staging fill + replay; `graph.replay()` alone; and the host time from the
call's start to the moment the replay is launched (the prologue), read by wrapping the mechanism.
(Its first run, at commit 28b7dc9, also timed `on_stream` + fill + replay; the runner no longer
switches streams.)
"""

import inspect
import statistics
import time

import torch

from rocm_vit.cli.workload import build_tower, parse_layouts, random_pixels


def synced_ms(fn, n=400):
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


def main():
    dev = torch.device("cuda")
    for preset in ("qwen3-vl-8b", "qwen2.5-vl-7b"):
        tower = build_tower(preset, dev, torch.bfloat16, None, 0)
        workload = parse_layouts("1x224", tower.config)[0]
        pixels = random_pixels(workload, tower.config, dev, 1).to(torch.bfloat16)
        grid = list(workload.grid_thw)
        runner = tower.enable_graphs(min_sightings=1, max_tokens=100000)
        with torch.inference_mode():
            tower(pixels, grid)
            prepared = tower._prepare(grid, pixels.shape[0])
            layout = prepared.layout
            tensors = (pixels, prepared.cos, prepared.sin, *prepared.embed_inputs)
            entry = next(iter(runner._graphs.values()))
            mechanism = runner._mechanism
            marks = []
            original_replay = mechanism.replay

            def marked_replay(graph):
                marks.append(time.perf_counter())
                original_replay(graph)

            rows = {}
            rows["tower call"] = synced_ms(lambda: tower(pixels, grid))
            rows["runner.run"] = synced_ms(lambda: runner.run(*tensors[:1], layout.attention, *tensors[1:]))

            # fill's signature changed in this round (the immutable flag); time it either way.
            fill_args = (True,) if len(inspect.signature(entry.fill).parameters) == 2 else ()
            rows["fill + replay (current stream)"] = synced_ms(
                lambda: (entry.fill(tensors, *fill_args), entry.graph.replay()))
            rows["graph.replay()"] = synced_ms(entry.graph.replay)
            mechanism.replay = marked_replay
            prologue = []
            for _ in range(200):
                torch.cuda.synchronize()
                start = time.perf_counter()
                tower(pixels, grid)
                prologue.append((marks[-1] - start) * 1e3)
                torch.cuda.synchronize()
            mechanism.replay = original_replay
            rows["host prologue of a tower call (start to replay launch)"] = statistics.median(prologue)
            print(f"\n{preset} 1x224\n| what | synced median ms |\n|---|---:|")
            for label, ms in rows.items():
                print(f"| {label} | {ms:.3f} |", flush=True)
        tower.disable_graphs()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
