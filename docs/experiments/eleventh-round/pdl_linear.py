"""#15, eleventh round: small-M linear layers whose weights are read before the previous kernel ends.

Hypothesis: at 196-256 rows cuBLAS spends 5-12 us per GEMM on a serial chain of weight loads that a
programmatic dependent launch (PDL) can move off the critical path. Each program of `_linear_main`
loads its whole weight slice (BN x KS, one split of K) into registers, then `griddepcontrol.wait`s
for the previous kernel, and only then reads the activations (in L2) and runs its MMAs. Split-K
partials go to an fp32 workspace that `_linear_reduce` sums in split order (deterministic) with the
bias and the GELU. Both kernels trigger their dependents at once, so the next GEMM's weight loads
overlap this GEMM's math.

    PYTHONPATH=$PWD python docs/experiments/eleventh-round/pdl_linear.py [iso|chain|all]

Prints, per GEMM shape and config, us per call in a graph of 27 calls with distinct weights (median
of replays), with and without PDL, against cuBLAS; then whole 27-block chains; then errors against
float64 and bitwise graph-vs-eager checks.
"""

import itertools
import math
import statistics
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def _gelu_tanh(acc):
    z = 0.7978845608028654 * (acc + 0.044715 * acc * acc * acc)
    return 0.5 * acc * (1.0 + (2.0 * tl.sigmoid(2.0 * z) - 1.0))


@triton.jit
def _linear_main(x_ptr, x_stride, w_ptr, b_ptr, out_ptr, part_ptr, M, N, K,
                 BM: tl.constexpr, BN: tl.constexpr, KS: tl.constexpr, SPLITS: tl.constexpr,
                 GELU: tl.constexpr, PDL: tl.constexpr):
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = split * KS + tl.arange(0, KS)
    k_mask = offs_k[None, :] < K
    w = tl.load(w_ptr + offs_n[:, None].to(tl.int64) * K + offs_k[None, :],
                mask=(offs_n[:, None] < N) & k_mask, other=0.0)
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    if SPLITS == 1:
        bias = tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
    for m0 in range(0, M, BM):
        offs_m = m0 + tl.arange(0, BM)
        x = tl.load(x_ptr + offs_m[:, None].to(tl.int64) * x_stride + offs_k[None, :],
                    mask=(offs_m[:, None] < M) & k_mask, other=0.0)
        acc = tl.dot(x, tl.trans(w))
        out_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        if SPLITS == 1:
            acc += bias[None, :]
            if GELU:
                acc = _gelu_tanh(acc)
            tl.store(out_ptr + offs_m[:, None].to(tl.int64) * N + offs_n[None, :],
                     acc.to(out_ptr.dtype.element_ty), mask=out_mask)
        else:
            tl.store(part_ptr + (split * M + offs_m)[:, None].to(tl.int64) * N + offs_n[None, :], acc,
                     mask=out_mask)


@triton.jit
def _linear_reduce(part_ptr, b_ptr, out_ptr, M, N, SPLITS: tl.constexpr, BLOCK: tl.constexpr,
                   GELU: tl.constexpr, PDL: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    bias = tl.load(b_ptr + offs % N, mask=mask, other=0.0).to(tl.float32)
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    acc = tl.load(part_ptr + offs, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLITS):
        acc += tl.load(part_ptr + s * M * N + offs, mask=mask, other=0.0)
    acc += bias
    if GELU:
        acc = _gelu_tanh(acc)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


REDUCE_BLOCK = 1024
WORKSPACE = None


def preload_linear(x, w, b, out, bn, ks, warps, gelu, pdl, bm=64, stages=2, reduce=True):
    M, K = x.shape
    N = w.shape[0]
    splits = math.ceil(K / ks)
    grid = (math.ceil(N / bn), splits)
    _linear_main[grid](x, x.stride(0), w, b, out, WORKSPACE, M, N, K, BM=bm, BN=bn, KS=ks, SPLITS=splits,
                       GELU=gelu, PDL=pdl, num_warps=warps, num_stages=stages, launch_pdl=pdl)
    if splits > 1 and reduce:
        _linear_reduce[(math.ceil(M * N / REDUCE_BLOCK),)](WORKSPACE, b, out, M, N, SPLITS=splits,
                                                          BLOCK=REDUCE_BLOCK, GELU=gelu, PDL=pdl, num_warps=4,
                                                          launch_pdl=pdl)
    return out


def cublas_linear(x, w, b, out, gelu):
    if gelu:
        torch._addmm_activation(b, x, w.t(), use_gelu=True, out=out)
    else:
        torch.addmm(b, x, w.t(), out=out)
    return out


def graph_us(calls, replays=30):
    """Median us per call of a graph holding `calls`, replayed back to back."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(2):
            for call in calls:
                call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for call in calls:
            call()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    return statistics.median(times), graph


# name, M, N, K, gelu, configs (BN, KS, warps)
SHAPES = [
    ("8B qkv", 196, 3456, 1152, False, [(128, 128, 4), (128, 256, 4), (64, 256, 4), (64, 512, 4), (256, 128, 8)]),
    ("8B proj", 196, 1152, 1152, False, [(128, 128, 4), (64, 128, 4), (64, 256, 4), (32, 256, 4), (32, 512, 4)]),
    ("8B fc1+gelu", 196, 4304, 1152, True, [(128, 128, 4), (128, 256, 4), (64, 512, 4), (256, 128, 8)]),
    ("8B fc2", 196, 1152, 4304, False, [(128, 256, 4), (64, 512, 4), (128, 512, 8), (64, 256, 4), (32, 512, 4)]),
    ("7B qkv", 256, 3840, 1280, False, [(128, 128, 4), (128, 256, 4), (64, 512, 4)]),
    ("7B proj", 256, 1280, 1280, False, [(64, 128, 4), (64, 256, 4), (32, 512, 4)]),
    ("7B gate+up", 256, 6848, 1280, False, [(128, 256, 4), (128, 128, 4), (64, 512, 4)]),
    ("7B down", 256, 1280, 3424, False, [(64, 512, 4), (128, 256, 4), (32, 512, 4)]),
]
BLOCKS = 27


def make_weights(N, K, copies):
    return [(torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * K**-0.5,
             torch.randn(N, device="cuda", dtype=torch.bfloat16) * 0.1) for _ in range(copies)]


def isolated():
    rows = []
    best = {}
    for name, M, N, K, gelu, configs in SHAPES:
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        weights = make_weights(N, K, BLOCKS)
        outs = [torch.empty(M, N, device="cuda", dtype=torch.bfloat16) for _ in range(BLOCKS)]
        cub, _ = graph_us([lambda w=w, b=b, o=o: cublas_linear(x, w, b, o, gelu) for (w, b), o in zip(weights, outs)])
        rows.append((name, "cuBLAS", "", cub, ""))
        for (bn, ks, warps), stages, pdl in itertools.product(configs, (1, 2), (False, True)):
            label = f"{bn}x{ks} w{warps} st{stages} splits {math.ceil(K / ks)} grid {math.ceil(N / bn) * math.ceil(K / ks)}"
            try:
                us, _ = graph_us([lambda w=w, b=b, o=o: preload_linear(x, w, b, o, bn, ks, warps, gelu, pdl,
                                                                       stages=stages)
                                  for (w, b), o in zip(weights, outs)])
            except Exception as error:  # noqa: BLE001 - report and go on
                rows.append((name, label, pdl, float("nan"), type(error).__name__))
                torch.cuda.synchronize()
                continue
            rows.append((name, label, pdl, us, f"{cub / us:.2f}x"))
            if pdl and (name not in best or us < best[name][0]):
                best[name] = (us, (bn, ks, warps, stages))
        del weights, outs
        torch.cuda.empty_cache()
    print("\n| GEMM | config | PDL | us per call | vs cuBLAS |\n|---|---|---|---:|---:|")
    for name, cfg, pdl, us, note in rows:
        print(f"| {name} | {cfg} | {pdl} | {us:.2f} | {note} |")
    return best


def chain(best):
    """27 blocks of qkv -> proj -> fc1 -> fc2, each GEMM reading the previous one's output."""
    rows = []
    for model, names in (("8B", ["8B qkv", "8B proj", "8B fc1+gelu", "8B fc2"]),
                         ("7B", ["7B qkv", "7B proj", "7B gate+up", "7B down"])):
        shapes = {s[0]: s for s in SHAPES}
        M = shapes[names[0]][1]
        layers = []
        for _ in range(BLOCKS if model == "8B" else 32):
            layers.append([(shapes[n], *make_weights(shapes[n][2], shapes[n][3], 1)[0]) for n in names])
        x0 = torch.randn(M, shapes[names[0]][3], device="cuda", dtype=torch.bfloat16)
        bufs = {n: torch.empty(M, shapes[n][2], device="cuda", dtype=torch.bfloat16) for n in names}

        def run(kind, pdl=False):
            x = x0
            for block in layers:
                qkv, proj, fc1, fc2 = block
                ins = [x, bufs[names[0]][:, : proj[0][3]], bufs[names[1]], bufs[names[2]][:, : fc2[0][3]]]
                for (shape, w, b), inp, n in zip(block, ins, names):
                    out = bufs[n]
                    if kind == "cublas":
                        cublas_linear(inp, w, b, out, shape[4])
                    else:
                        bn, ks, warps, stages = best[n][1]
                        preload_linear(inp, w, b, out, bn, ks, warps, shape[4], pdl, stages=stages)
                x = bufs[names[3]]
            return x

        results = {}
        for kind, pdl in (("cublas", False), ("preload", False), ("preload", True), ("cublas", False), ("preload", True)):
            us, graph = graph_us([lambda kind=kind, pdl=pdl: run(kind, pdl)], replays=20)
            results.setdefault((kind, pdl), []).append(us)
            rows.append((model, kind, pdl, us / 1e3))
        # graph vs eager, bitwise, on fresh input
        x0.copy_(torch.randn_like(x0))
        graph.replay()
        torch.cuda.synchronize()
        replayed = bufs[names[3]].clone()
        eager = run("preload", True).clone()
        rows.append((model, "graph == eager (PDL)", torch.equal(replayed, eager), float("nan")))
    print("\n| model | GEMM chain | PDL | ms per chain |\n|---|---|---|---:|")
    for model, kind, pdl, ms in rows:
        print(f"| {model} | {kind} | {pdl} | {ms:.3f} |")


def errors(best):
    print("\n| GEMM | config | max abs err vs fp64: preload / cuBLAS | deterministic |\n|---|---|---|---|")
    for name, M, N, K, gelu, _ in SHAPES:
        bn, ks, warps, stages = best[name][1]
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        w, b = make_weights(N, K, 1)[0]
        ref = x.double() @ w.double().t() + b.double()
        if gelu:
            ref = F.gelu(ref, approximate="tanh")
        ours = preload_linear(x, w, b, torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16),
                              bn, ks, warps, gelu, True, stages=stages)
        again = preload_linear(x, w, b, torch.empty(M, N, device="cuda", dtype=torch.bfloat16), bn, ks, warps, gelu,
                               True, stages=stages)
        cub = cublas_linear(x, w, b, torch.empty(M, N, device="cuda", dtype=torch.bfloat16), gelu)
        print(f"| {name} | {bn}x{ks} w{warps} st{stages} | {(ours.double() - ref).abs().max().item():.3e} / "
              f"{(cub.double() - ref).abs().max().item():.3e} | {torch.equal(ours, again)} |")


def main_only():
    """The main kernel alone (partials left unreduced), PDL on: what a GEMM costs if the next kernel sums."""
    print("\n| GEMM | config | cuBLAS us | main kernel alone us | + reduce kernel us |\n|---|---|---:|---:|---:|")
    for name, M, N, K, gelu, configs in SHAPES:
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        weights = make_weights(N, K, BLOCKS)
        outs = [torch.empty(M, N, device="cuda", dtype=torch.bfloat16) for _ in range(BLOCKS)]
        cub, _ = graph_us([lambda w=w, b=b, o=o: cublas_linear(x, w, b, o, gelu) for (w, b), o in zip(weights, outs)])
        extra = {"8B qkv": [(64, 128, 4), (32, 256, 4), (128, 64, 4)], "8B proj": [(32, 128, 4), (64, 64, 4)],
                 "8B fc1+gelu": [(64, 256, 4), (32, 512, 4)], "8B fc2": [(64, 1024, 4), (32, 1024, 4), (64, 128, 4)]}
        for bn, ks, warps in configs + extra.get(name, []):
            for stages in (1, 2):
                times = []
                for reduce in (False, True):
                    try:
                        us, _ = graph_us([lambda w=w, b=b, o=o: preload_linear(x, w, b, o, bn, ks, warps, gelu, True,
                                                                               stages=stages, reduce=reduce)
                                          for (w, b), o in zip(weights, outs)])
                    except Exception as error:  # noqa: BLE001 - report and go on
                        us = type(error).__name__
                        torch.cuda.synchronize()
                    times.append(us)
                label = f"{bn}x{ks} w{warps} st{stages} splits {math.ceil(K / ks)} grid {math.ceil(N / bn) * math.ceil(K / ks)}"
                print(f"| {name} | {label} | {cub:.2f} | {times[0] if isinstance(times[0], str) else f'{times[0]:.2f}'} | "
                      f"{times[1] if isinstance(times[1], str) else f'{times[1]:.2f}'} |", flush=True)
        torch.cuda.empty_cache()


def main():
    global WORKSPACE
    torch.manual_seed(0)
    WORKSPACE = torch.empty(32 << 20, device="cuda", dtype=torch.float32)
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    if sys.argv[1:] == ["main-only"]:
        main_only()
        return
    best = isolated()
    print("\nbest with PDL:", best)
    errors(best)
    chain(best)


if __name__ == "__main__":
    main()
