"""What does a GEMM's host cost come down to when cuBLASLt is called with its plan kept?

The experiment behind the launch goals after ``tests/gpu_gemm_epilogue_bench.py`` (docs/benchmarks.md,
"GEMM epilogues and GEMM launches"): Triton GEMMs lose 1.2-1.7x of device time to cuBLAS at the 8B
block's shapes, so the block keeps cuBLAS's four GEMMs, and through torch each costs 20-28 µs of host.
torch's ``addmm`` (its cuBLASLt path, ``gemm_and_bias``) builds a matmul descriptor, three layouts and
a preference, and asks cuBLASLt's heuristic for an algorithm at every call. This keeps all of that per
(rows, shape, epilogue) and calls ``cublasLtMatmul`` through ctypes: per call, one attribute set (the
bias pointer) and the matmul.

    python tests/gpu_cublaslt_host_bench.py   # on an NVIDIA GPU: the table prints last

Per shape, host µs a call (200 calls enqueued behind a busy device, median of 3) of:
- ``torch``: ``F.linear`` (``addmm``), or ``torch._addmm_activation(..., use_gelu=True)`` for fc1, as the
  tower calls them;
- ``kept``: the kept plan through ctypes into a fresh ``torch.empty`` output;
- ``kept, out given``: the same into a preallocated output (what a block's own buffers would allow).

Each row also says whether ``kept`` equals torch bit for bit (the same algorithm) and whether a graph
of it replays equal to eager. Prediction: ``kept`` at 6-10 µs against torch's 20-28 (ctypes converts
16 arguments in ~2-3 µs, the matmul enqueues in ~3-5), so ~14 µs saved per GEMM, ~1.5 ms a forward of
108 GEMMs at 1x224; not the 3 ms goal alone. The process exits 1 if any output differs from torch.
Run on an H100 on 2026-12-07: 22.7-42.2 µs against torch's 16.0-31.1, so the prediction failed
(docs/benchmarks.md, "GEMM epilogues and GEMM launches").
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import sys

import torch
import torch.nn.functional as F

# cublasLt.h / library_types.h values (CUDA 12 and 13).
_CUDA_R_32F, _CUDA_R_16F, _CUDA_R_16BF = 0, 2, 14
_COMPUTE_32F = 68
_OP_N, _OP_T = 0, 1
_DESC_TRANSA, _DESC_TRANSB, _DESC_EPILOGUE, _DESC_BIAS_POINTER = 3, 4, 7, 8
_EPILOGUE_BIAS, _EPILOGUE_GELU_BIAS = 4, 36
_PREF_MAX_WORKSPACE_BYTES = 1
_PREF_MIN_ALIGNMENT_BYTES = (5, 6, 7, 8)  # A, B, C, D
_HEURISTIC_RESULT_BYTES = 96  # cublasLtMatmulAlgo_t (64), workspaceSize, state, wavesCount, reserved[4]
_WORKSPACE_BYTES = 32 << 20  # cuBLAS's recommendation from Hopper on

_POINTER, _SIZE = ctypes.c_void_p, ctypes.c_size_t
# Each cuBLASLt entry point's argument types, declared once when the library is loaded.
_ARGTYPES = {
    "cublasLtMatmul": [_POINTER] * 14 + [_SIZE, _POINTER],
    "cublasLtMatmulDescSetAttribute": [_POINTER, ctypes.c_int, _POINTER, _SIZE],
    "cublasLtMatmulPreferenceSetAttribute": [_POINTER, ctypes.c_int, _POINTER, _SIZE],
    "cublasLtMatrixLayoutCreate": [_POINTER, ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64],
    "cublasLtMatmulAlgoGetHeuristic": [_POINTER] * 7 + [ctypes.c_int, _POINTER, _POINTER],
}

HIDDEN, WIDTH = 1152, 4304
SHAPES = {"qkv": (HIDDEN, 3 * HIDDEN), "proj": (HIDDEN, HIDDEN), "fc1": (HIDDEN, WIDTH), "fc2": (WIDTH, HIDDEN)}


def lt_problem(rows: int, depth: int, width: int) -> dict[str, int]:
    """``out [rows, width] = x [rows, depth] @ weight [width, depth]ᵀ + bias``, row-major, as cuBLASLt's
    column-major problem: D ``[width, rows]`` = op(A) · B with A the weight (transposed), B the input."""
    return {"m": width, "n": rows, "k": depth, "lda": depth, "ldb": depth, "ldd": width}


def alignment(address: int) -> int:
    """The largest of 16, 8, 4, 2, 1 bytes dividing ``address``: what torch tells cuBLASLt's heuristic."""
    for size in (16, 8, 4, 2):
        if address % size == 0:
            return size
    return 1


class KeptLinear:
    """``F.linear`` through cuBLASLt with its descriptors and algorithm kept per (rows, shape, epilogue)."""

    def __init__(self, library: ctypes.CDLL, device: torch.device) -> None:
        self._lib = library
        self._handle = ctypes.c_void_p()
        self._check(library.cublasLtCreate(ctypes.byref(self._handle)), "cublasLtCreate")
        self._workspace = torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self._alpha, self._beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self._plans: dict[tuple, tuple] = {}
        self._bias = ctypes.c_uint64()
        self._matmul = library.cublasLtMatmul
        self._set_attribute = library.cublasLtMatmulDescSetAttribute

    def __call__(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, gelu: bool = False, out=None
    ) -> torch.Tensor:
        rows, depth = x.shape
        width = weight.shape[0]
        if out is None:
            out = torch.empty((rows, width), dtype=x.dtype, device=x.device)
        pointers = (weight.data_ptr(), x.data_ptr(), out.data_ptr(), bias.data_ptr())
        key = (rows, depth, width, gelu, x.dtype, *map(alignment, pointers))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._plan(x, weight, bias, out, gelu)
        desc, a_layout, b_layout, d_layout, algo = plan
        self._bias.value = bias.data_ptr()
        self._set_attribute(desc, _DESC_BIAS_POINTER, ctypes.addressof(self._bias), 8)
        status = self._matmul(
            self._handle, desc, ctypes.addressof(self._alpha), weight.data_ptr(), a_layout, x.data_ptr(),
            b_layout, ctypes.addressof(self._beta), out.data_ptr(), d_layout, out.data_ptr(), d_layout,
            ctypes.addressof(algo), self._workspace.data_ptr(), _WORKSPACE_BYTES,
            torch.cuda.current_stream().cuda_stream,
        )  # fmt: skip
        if status:
            self._check(status, "cublasLtMatmul")
        return out

    def _plan(self, x, weight, bias, out, gelu: bool) -> tuple:
        lib, problem = self._lib, lt_problem(x.shape[0], x.shape[1], weight.shape[0])
        data_type = {torch.bfloat16: _CUDA_R_16BF, torch.float16: _CUDA_R_16F}[x.dtype]
        desc = ctypes.c_void_p()
        self._check(lib.cublasLtMatmulDescCreate(ctypes.byref(desc), _COMPUTE_32F, _CUDA_R_32F), "DescCreate")
        for attribute, value in (
            (_DESC_TRANSA, ctypes.c_int32(_OP_T)),
            (_DESC_TRANSB, ctypes.c_int32(_OP_N)),
            (_DESC_EPILOGUE, ctypes.c_uint32(_EPILOGUE_GELU_BIAS if gelu else _EPILOGUE_BIAS)),
            (_DESC_BIAS_POINTER, ctypes.c_uint64(bias.data_ptr())),
        ):
            self._check(self._set_attribute(desc, attribute, ctypes.addressof(value), ctypes.sizeof(value)), "Desc")
        layouts = []
        for rows, cols, ld in (
            (problem["k"], problem["m"], problem["lda"]),
            (problem["k"], problem["n"], problem["ldb"]),
            (problem["m"], problem["n"], problem["ldd"]),
        ):
            layout = ctypes.c_void_p()
            self._check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), data_type, rows, cols, ld), "Layout")
            layouts.append(layout)
        preference = ctypes.c_void_p()
        self._check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(preference)), "PreferenceCreate")
        set_preference = lib.cublasLtMatmulPreferenceSetAttribute
        workspace = ctypes.c_uint64(_WORKSPACE_BYTES)
        self._check(set_preference(preference, _PREF_MAX_WORKSPACE_BYTES, ctypes.addressof(workspace), 8), "Pref")
        # torch passes the bias's alignment as D's (``gemm_and_bias``); kept here so the heuristic answers alike.
        for attribute, tensor in zip(_PREF_MIN_ALIGNMENT_BYTES, (weight, x, out, bias), strict=True):
            value = ctypes.c_uint32(alignment(tensor.data_ptr()))
            self._check(set_preference(preference, attribute, ctypes.addressof(value), 4), "Pref")
        result = ctypes.create_string_buffer(_HEURISTIC_RESULT_BYTES)
        found = ctypes.c_int()
        status = lib.cublasLtMatmulAlgoGetHeuristic(
            self._handle, desc, layouts[0], layouts[1], layouts[2], layouts[2], preference, 1, result,
            ctypes.byref(found),
        )  # fmt: skip
        self._check(status, "AlgoGetHeuristic")
        if found.value == 0:
            raise RuntimeError(f"cuBLASLt has no algorithm for {problem}")
        algo = ctypes.create_string_buffer(result.raw[:64], 64)
        return desc, layouts[0], layouts[1], layouts[2], algo

    @staticmethod
    def _check(status: int, what: str) -> None:
        if status:
            raise RuntimeError(f"cuBLASLt {what} failed with status {status}")


def load_cublaslt() -> ctypes.CDLL:
    """The libcublasLt torch loaded (after one GEMM), so the handle and kernels are torch's own library's."""
    a = torch.randn(8, 8, device="cuda", dtype=torch.bfloat16)
    F.linear(a, a, a[0])
    torch.cuda.synchronize()
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "libcublasLt.so" in line}
    if not paths:
        raise RuntimeError("torch loaded no libcublasLt")
    library = ctypes.CDLL(sorted(paths)[0])
    for name, argtypes in _ARGTYPES.items():
        getattr(library, name).argtypes = argtypes
    return library


def measure(kept: KeptLinear, row_counts: list[int], calls: int) -> list[dict]:
    device, dtype = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    results = []
    with torch.inference_mode():
        for name, (depth, width) in SHAPES.items():
            weight = torch.randn(width, depth, device=device, dtype=dtype) / depth**0.5
            bias = torch.randn(width, device=device, dtype=dtype)
            for rows in row_counts:
                x = torch.randn(rows, depth, device=device, dtype=dtype)
                row = _measure_shape(kept, x, weight, bias, gelu=name == "fc1", calls=calls)
                row["shape"] = f"{name} {rows}x{depth}x{width}" + (" +gelu" if name == "fc1" else "")
                results.append(row)
                print(row, file=sys.stderr, flush=True)
    return results


def _measure_shape(kept: KeptLinear, x, weight, bias, gelu: bool, calls: int) -> dict:
    """Host µs of torch's call and the kept plan's, and whether the kept plan matches torch and replays."""
    from rocm_vit.workloads.launch_cost import eager_cost

    out = torch.empty(x.shape[0], weight.shape[0], device=x.device, dtype=x.dtype)

    def torch_call() -> torch.Tensor:
        if gelu:  # as the tower's MLP: cuBLASLt's GELU epilogue
            return torch._addmm_activation(bias, x, weight.t(), use_gelu=True)
        return F.linear(x, weight, bias)

    def host_us(call) -> float:
        def repeated():
            for _ in range(calls):
                call()

        return eager_cost(repeated, x.device, 3).host_ms * 1e3 / calls

    return {
        "torch": host_us(torch_call),
        "kept": host_us(lambda: kept(x, weight, bias, gelu)),
        "kept, out given": host_us(lambda: kept(x, weight, bias, gelu, out)),
        "equal to torch": torch.equal(kept(x, weight, bias, gelu), torch_call()),
        "replay equal": _replay_equal(lambda: kept(x, weight, bias, gelu, out), out),
    }


def measure_forwards(kept: KeptLinear, layouts: str, repeats: int) -> list[dict]:
    """The 8B tower's eager host and device ms per layout with torch's GEMMs and with the kept plans in
    every ``nn.Linear`` and GELU epilogue, interleaved twice; each kept output against torch's."""
    from rocm_vit.workloads.launch_cost import eager_cost
    from rocm_vit.workloads.workload import build_tower, parse_layouts, random_pixels

    device, dtype = torch.device("cuda"), torch.bfloat16
    tower = build_tower("qwen3-vl-8b", device, dtype, None, seed=0)
    rows = []
    with torch.inference_mode():
        for index, workload in enumerate(parse_layouts(layouts, tower.config)):
            pixels = random_pixels(workload, tower.config, device, index).to(dtype)
            grid = list(workload.grid_thw)
            eager = lambda pixels=pixels, grid=grid: tower(pixels, grid, use_graphs=False)  # noqa: E731
            reference = eager()
            eager_cost(eager, device, repeats)  # discarded: a process's first timings read the host slow
            for label in ("torch", "kept", "torch", "kept"):
                with _kept_gemms(tower, kept) if label == "kept" else contextlib.nullcontext():
                    cost = eager_cost(eager, device, repeats)
                    same = torch.equal(eager(), reference)
                row = {"layout": workload.spec, "gemms": label, "host_ms": cost.host_ms, "device_ms": cost.device_ms}
                row |= {"kernels": cost.kernels, "equal": same}
                rows.append(row)
                print(row, file=sys.stderr, flush=True)
    return rows


@contextlib.contextmanager
def _kept_gemms(tower: torch.nn.Module, kept: KeptLinear):
    """Every 2-D ``nn.Linear`` call with a bias and ``torch._addmm_activation``'s GELU through ``kept``."""
    addmm_activation = torch._addmm_activation

    def linear_forward(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and x.is_contiguous() and module.bias is not None:
            return kept(x, module.weight, module.bias)
        return F.linear(x, module.weight, module.bias)

    def gelu_epilogue(bias, x, weight_t, use_gelu=False, **kwargs):
        if use_gelu and x.dim() == 2 and x.is_contiguous() and weight_t.t().is_contiguous() and not kwargs:
            return kept(x, weight_t.t(), bias, gelu=True)
        return addmm_activation(bias, x, weight_t, use_gelu=use_gelu, **kwargs)

    linears = [module for module in tower.modules() if isinstance(module, torch.nn.Linear)]
    for module in linears:
        module.forward = functools.partial(linear_forward, module)
    torch._addmm_activation = gelu_epilogue
    try:
        yield
    finally:
        torch._addmm_activation = addmm_activation
        for module in linears:
            del module.forward


def _replay_equal(call, out: torch.Tensor) -> bool:
    """A CUDA graph of ``call`` replays into ``out`` what an eager call wrote (poisoned in between)."""
    call()
    eager = out.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        call()
    torch.cuda.current_stream().wait_stream(stream)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    return torch.equal(out, eager)


def format_table(results: list[dict]) -> str:
    header = ["shape", "torch µs", "kept µs", "kept, out given µs", "saved µs", "equal to torch", "replay equal"]
    lines = [header] + [
        [
            row["shape"],
            f"{row['torch']:.1f}",
            f"{row['kept']:.1f}",
            f"{row['kept, out given']:.1f}",
            f"{row['torch'] - row['kept']:.1f}",
            str(row["equal to torch"]),
            str(row["replay equal"]),
        ]
        for row in results
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    table = ["  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True)) for line in lines]
    return "\n".join(
        [f"host µs a call behind a busy device on {torch.cuda.get_device_name()}, torch {torch.__version__}", *table]
    )


def format_forwards(rows: list[dict]) -> str:
    lines = ["8B tower eager, ms: layout, GEMMs, host, device, kernels, output equal to torch's GEMMs'"]
    lines += [
        f"{row['layout']:>8}  {row['gemms']:>5}  {row['host_ms']:7.2f}  {row['device_ms']:6.2f}  "
        f"{row['kernels']}  {row['equal']}"
        for row in rows
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="196,2116", help="token counts, comma-separated")
    parser.add_argument("--calls", type=int, default=200, help="calls enqueued per timing")
    parser.add_argument("--layouts", default="1x224,1x736", help="the tower's layouts, before and after")
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    kept = KeptLinear(load_cublaslt(), device)
    results = measure(kept, [int(rows) for rows in args.rows.split(",")], args.calls)
    forwards = measure_forwards(kept, args.layouts, repeats=5) if args.layouts else []
    print(format_table(results))
    print(format_forwards(forwards))
    exact = all(row["equal to torch"] and row["replay equal"] for row in results)
    return 0 if exact and all(row["equal"] for row in forwards) else 1


if __name__ == "__main__":
    sys.exit(main())
