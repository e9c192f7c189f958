"""#15, eleventh round: triton_attn's tiles for the short segments of small images.

At 1x224 (196 tokens) the 8B's attention takes ~7 us per block, 0.19 ms per forward: a chain of four
dependent 64-key tiles on 64 programs. Smaller query tiles give more programs; one key tile holding
the whole segment gives one load round trip instead of four. Graph-timed (20 calls per graph, median
of 30 replays), errors against float64, per layout and config.

    for i in $(seq 0 11); do PYTHONPATH=$PWD python docs/experiments/eleventh-round/small_attn.py $i; done

One config per process (argument: its index in CONFIGS): a config that faults leaves the CUDA context
unusable, and one did (see docs/benchmarks.md).
"""

import statistics
import sys

import torch
import triton

from rocm_vit.backends.triton_attn import TritonAttnConfig, default_config, triton_varlen_attention

LAYOUTS = {  # name: segment lengths
    "1x196 (8B 224²)": [196],
    "1x256 (7B 224², full blocks)": [256],
    "4x64 (7B 224², window blocks)": [64] * 4,
    "1x576 (8B 384²)": [576],
    "4x196": [196] * 4,
    "1x1024": [1024],
    "16x64 (7B 512², window blocks)": [64] * 16,
}
CONFIGS = [(64, 64, 4, 3), (128, 64, 8, 3), (64, 128, 4, 2), (64, 256, 4, 1), (32, 64, 4, 3), (32, 128, 4, 2),
           (32, 256, 4, 1), (16, 64, 4, 3), (16, 128, 4, 2), (16, 256, 4, 1), (16, 256, 2, 1), (32, 256, 2, 1)]
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


def main():
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    heads = 16
    rows = []
    for head_dim in (72, 80):
        for name, lens in LAYOUTS.items():
            tokens = sum(lens)
            qkv = torch.randn(tokens, 3, heads, head_dim, device="cuda", dtype=torch.bfloat16)
            q, k, v = qkv.unbind(1)
            cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
            ref = torch.empty(tokens, heads, head_dim, dtype=torch.float64, device="cuda")
            for start, length in zip(cu[:-1].tolist(), lens):
                sl = slice(start, start + length)
                ref[sl] = torch.nn.functional.scaled_dot_product_attention(
                    q[sl].double().transpose(0, 1), k[sl].double().transpose(0, 1), v[sl].double().transpose(0, 1)
                ).transpose(0, 1)
            default = default_config(head_dim, torch.bfloat16, -(-max(lens) // 128) * len(lens) * heads, arch="sm_90")
            out = torch.full_like(q, float("nan"))
            for values in [CONFIGS[int(sys.argv[1])]] if len(sys.argv) > 1 else CONFIGS:
                config = TritonAttnConfig(*values)
                fn = lambda config=config: triton_varlen_attention(  # noqa: E731
                    q, k, v, cu, max(lens), head_dim**-0.5, out=out, config=config)
                try:
                    out.fill_(float("nan"))
                    fn()
                    err = (out.double() - ref).abs().max().item()
                    us = graph_us(fn)
                except Exception as error:  # noqa: BLE001
                    print(f"| {head_dim} | {name} | {values} | | FAILED | {type(error).__name__} |", flush=True)
                    raise
                rows.append((head_dim, name, values, config == default, us, f"{err:.2e}"))
    for head_dim, name, values, is_default, us, note in rows:
        print(f"| {head_dim} | {name} | {values} | {'*' if is_default else ''} | {us:.2f} | {note} |")


if __name__ == "__main__":
    main()
