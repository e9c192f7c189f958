"""Can a Triton GEMM hold cuBLAS's device time at the 8B block's shapes, and does the rotary in its epilogue pay?

The experiment behind the launch goals cuBLAS cannot meet: a block is at least 8 launches while its
GEMMs are cuBLAS's, and ~230 µs of host from Python (docs/benchmarks.md, "Eager host
cost"). Fewer launches need GEMMs with epilogues; this measures whether a Triton GEMM can be that
GEMM before anything in ``backends/`` depends on one. Prototype kernels live here until one wins.

    python benchmarks/gemm_epilogue_bench.py             # on a GPU: the table prints last
    python benchmarks/gemm_epilogue_bench.py --rows 196  # fewer token counts

Per shape and token count, device µs a call, replayed from a CUDA graph of 20 calls that cycle over
weight copies larger than L2 together (in a forward each block's weights arrive cold):
- ``cuBLAS``: ``F.linear`` (cuBLASLt, bias in the epilogue), what the tower runs;
- ``triton``: ``_linear_kernel``, the fastest of ``CONFIGS``;
- qkv only: ``cuBLAS + rotary`` (``F.linear`` then ``backends/triton_rope.py`` on the q and k views,
  the tower's two launches) against ``fused``: ``_qkv_rotary_kernel``, one launch.

Floors, H100 bf16 (3.35 TB/s, ~680 TFLOP/s dense): qkv 196x1152x3456 reads 8.0 MB of weight, 2.4 µs,
and does 1.56 GFLOP, 2.3 µs; cuBLAS ran the block's four GEMMs at 196 rows in ~8 µs each (benchmarks.md,
"Floors"). Prediction: a Triton GEMM within 20 % of cuBLAS at 196-2,116 rows, the fused qkv at or under
cuBLAS + rotary; if the plain GEMM loses by more, epilogues cannot pay on this GPU. Run on an H100 on
2026-12-07: it lost by 21-68 %, the fused qkv by 29-76 % (docs/benchmarks.md, "GEMM epilogues and GEMM
launches"), so no epilogue ships and the prototypes stay here.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

# (BLOCK_M, BLOCK_N or pairs, BLOCK_K, num_warps, num_stages)
CONFIGS = ((64, 64, 64, 4, 4), (64, 128, 64, 4, 4), (128, 64, 64, 4, 3), (128, 128, 64, 8, 3), (64, 64, 128, 4, 3))
# Qwen3-VL-8B's block: hidden 1152, 16 heads of 72, MLP 4304.
HIDDEN, HEADS, HEAD_DIM, WIDTH = 1152, 16, 72, 4304
SHAPES = {"qkv": (HIDDEN, 3 * HIDDEN), "proj": (HIDDEN, HIDDEN), "fc1": (HIDDEN, WIDTH), "fc2": (WIDTH, HIDDEN)}
_L2_BYTES = 64 << 20  # over the H100's 50 MB and the H200's 60 MB
_CALLS_PER_GRAPH = 20


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, config: tuple = CONFIGS[0]) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: fp32 accumulation, the bias added in fp32, one rounding (as cuBLASLt)."""
    rows, depth = x.shape
    width = weight.shape[0]
    out = torch.empty((rows, width), dtype=x.dtype, device=x.device)
    block_m, block_n, block_k, warps, stages = config
    grid = (triton.cdiv(rows, block_m) * triton.cdiv(width, block_n),)
    _linear_kernel[grid](
        x, weight, bias, out, rows, width, depth, block_m, block_n, block_k, num_warps=warps, num_stages=stages
    )
    return out


def qkv_rotary(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    heads: int,
    config: tuple = CONFIGS[0],
) -> torch.Tensor:
    """``[N, 3, heads, D]``: ``F.linear(x, weight, bias)`` with q and k NEOX-rotated by cos/sin ``[N, D]`` fp32.

    Each output column pairs with the one half a head away, so a program accumulates both halves of its
    pairs and rotates them in registers: the linear's rounding, then the rotary's in fp32 and its own
    rounding, as the two launches it replaces.
    """
    rows, depth = x.shape
    head_dim = cos.shape[1]
    out = torch.empty((rows, 3, heads, head_dim), dtype=x.dtype, device=x.device)
    block_m, block_pairs, block_k, warps, stages = config
    pairs = 3 * heads * head_dim // 2
    grid = (triton.cdiv(rows, block_m) * triton.cdiv(pairs, block_pairs),)
    _qkv_rotary_kernel[grid](
        x,
        weight,
        bias,
        cos,
        sin,
        out,
        rows,
        depth,
        head_dim // 2,
        2 * heads * head_dim // 2,
        pairs,
        block_m,
        block_pairs,
        block_k,
        num_warps=warps,
        num_stages=stages,
        enable_fp_fusion=False,  # the rotary's products and sums rounded apart, as triton_rope
    )
    return out


@triton.jit
def _tile(rows, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's row and column indices. Row tiles innermost: the programs that read one weight tile
    run together, so it is read from HBM once."""
    pid = tl.program_id(0)
    row_tiles = tl.cdiv(rows, BLOCK_M)
    row = (pid % row_tiles) * BLOCK_M + tl.arange(0, BLOCK_M)
    return row, (pid // row_tiles) * BLOCK_N + tl.arange(0, BLOCK_N)


@triton.jit
def _linear_kernel(
    x_ptr, w_ptr, b_ptr, out_ptr, rows, WIDTH: tl.constexpr, DEPTH: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    row, col = _tile(rows, BLOCK_M, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, DEPTH, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(x_ptr + row[:, None] * DEPTH + ks[None, :], mask=(row[:, None] < rows) & (ks[None, :] < DEPTH))
        b = tl.load(w_ptr + col[None, :] * DEPTH + ks[:, None], mask=(col[None, :] < WIDTH) & (ks[:, None] < DEPTH))
        acc = tl.dot(a, b, acc)
    acc += tl.load(b_ptr + col, mask=col < WIDTH).to(tl.float32)[None, :]
    mask = (row[:, None] < rows) & (col[None, :] < WIDTH)
    tl.store(out_ptr + row[:, None] * WIDTH + col[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _qkv_rotary_kernel(
    x_ptr, w_ptr, b_ptr, cos_ptr, sin_ptr, out_ptr, rows, DEPTH: tl.constexpr, HALF: tl.constexpr,
    ROTATED_PAIRS: tl.constexpr, PAIRS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_PAIRS: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    row, pair = _tile(rows, BLOCK_M, BLOCK_PAIRS)
    # Pair p: head p // HALF of q, k, v in turn, dimension p % HALF and its partner HALF later.
    head = pair // HALF
    dim = pair - head * HALF
    first_col = head * (2 * HALF) + dim
    second_col = first_col + HALF
    pair_ok = pair < PAIRS
    row_ok = row < rows
    acc_first = tl.zeros((BLOCK_M, BLOCK_PAIRS), dtype=tl.float32)
    acc_second = tl.zeros((BLOCK_M, BLOCK_PAIRS), dtype=tl.float32)
    for k0 in range(0, DEPTH, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < DEPTH
        a = tl.load(x_ptr + row[:, None] * DEPTH + ks[None, :], mask=row_ok[:, None] & k_ok[None, :])
        w_mask = pair_ok[None, :] & k_ok[:, None]
        w_first = tl.load(w_ptr + first_col[None, :] * DEPTH + ks[:, None], mask=w_mask)
        w_second = tl.load(w_ptr + second_col[None, :] * DEPTH + ks[:, None], mask=w_mask)
        acc_first = tl.dot(a, w_first, acc_first)
        acc_second = tl.dot(a, w_second, acc_second)
    dtype = out_ptr.dtype.element_ty
    # The linear's one rounding.
    first = (acc_first + tl.load(b_ptr + first_col, mask=pair_ok).to(tl.float32)[None, :]).to(dtype)
    second = (acc_second + tl.load(b_ptr + second_col, mask=pair_ok).to(tl.float32)[None, :]).to(dtype)
    # The rotary on q's and k's pairs, as backends/triton_rope.py: fp32, one rounding.
    rotate = pair < ROTATED_PAIRS
    trig = row[:, None] * (2 * HALF) + dim[None, :]
    trig_mask = row_ok[:, None] & rotate[None, :]
    cos_first = tl.load(cos_ptr + trig, mask=trig_mask, other=1.0)
    cos_second = tl.load(cos_ptr + trig + HALF, mask=trig_mask, other=1.0)
    sin_first = tl.load(sin_ptr + trig, mask=trig_mask, other=0.0)
    sin_second = tl.load(sin_ptr + trig + HALF, mask=trig_mask, other=0.0)
    first32 = first.to(tl.float32)
    second32 = second.to(tl.float32)
    rotated_first = (first32 * cos_first - second32 * sin_first).to(dtype)
    rotated_second = (second32 * cos_second + first32 * sin_second).to(dtype)
    first = tl.where(rotate[None, :], rotated_first, first)
    second = tl.where(rotate[None, :], rotated_second, second)
    out_mask = row_ok[:, None] & pair_ok[None, :]
    out_row = row[:, None] * (PAIRS * 2)
    tl.store(out_ptr + out_row + first_col[None, :], first, mask=out_mask)
    tl.store(out_ptr + out_row + second_col[None, :], second, mask=out_mask)


def replayed_us(make_call, copies: int) -> float:
    """Device µs a call: ``make_call(i)`` returns call ``i``'s closure (on weight copy ``i % copies``);
    20 calls captured in one CUDA graph, the median of 10 replays."""
    calls = [make_call(i % copies) for i in range(_CALLS_PER_GRAPH)]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls:  # compiles and warms outside the capture
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    samples = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / _CALLS_PER_GRAPH)
    return statistics.median(samples)


def rotary_tables(rows: int, head_dim: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """NEOX cos/sin ``[rows, head_dim]`` fp32 for random positions, as the tower's rotary embedding makes."""
    angles = torch.rand(rows, head_dim // 2, device=device) * 40.0
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def measure(row_counts: list[int]) -> list[dict]:
    """One row per (shape, token count): device µs of each path and the outputs' agreement."""
    device, dtype = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    results = []
    for name, (depth, width) in SHAPES.items():
        copies = max(1, -(-_L2_BYTES // (depth * width * 2)))
        weights = [torch.randn(width, depth, device=device, dtype=dtype) / depth**0.5 for _ in range(copies)]
        biases = [torch.randn(width, device=device, dtype=dtype) for _ in range(copies)]
        for rows in row_counts:
            x = torch.randn(rows, depth, device=device, dtype=dtype)
            row = {"shape": f"{name} {rows}x{depth}x{width}", "copies": copies, **_time_linear(x, weights, biases)}
            if name == "qkv":
                row |= _time_qkv_rotary(x, weights, biases, *rotary_tables(rows, HEAD_DIM, device))
            results.append(row)
            print(row, file=sys.stderr, flush=True)
    return results


def _time_linear(x: torch.Tensor, weights: list[torch.Tensor], biases: list[torch.Tensor]) -> dict:
    """cuBLAS against the fastest of ``CONFIGS``, and each one's largest error against fp64."""
    copies = len(weights)
    row = {"cuBLAS": replayed_us(lambda i: lambda: F.linear(x, weights[i], biases[i]), copies)}
    timed = {
        config: replayed_us(lambda i, c=config: lambda: linear(x, weights[i], biases[i], c), copies)
        for config in CONFIGS
    }
    best = min(timed, key=timed.get)
    row["triton"], row["triton config"] = timed[best], best
    reference = F.linear(x.double(), weights[0].double(), biases[0].double())
    row["cuBLAS err"] = (F.linear(x, weights[0], biases[0]).double() - reference).abs().max().item()
    row["triton err"] = (linear(x, weights[0], biases[0], best).double() - reference).abs().max().item()
    return row


def _time_qkv_rotary(
    x: torch.Tensor, weights: list[torch.Tensor], biases: list[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor
) -> dict:
    """The tower's two launches against the fused one; the fused output against the Triton GEMM + rotary."""
    from rocm_vit.backends.triton_rope import triton_rotary_

    rows, copies = x.shape[0], len(weights)

    def unfused(i: int):
        def call() -> None:
            q, k, _ = F.linear(x, weights[i], biases[i]).view(rows, 3, HEADS, HEAD_DIM).unbind(1)
            triton_rotary_(q, k, cos, sin)

        return call

    row = {"cuBLAS + rotary": replayed_us(unfused, copies)}
    timed = {
        config: replayed_us(
            lambda i, c=config: lambda: qkv_rotary(x, weights[i], biases[i], cos, sin, HEADS, c), copies
        )
        for config in CONFIGS
    }
    best = min(timed, key=timed.get)
    row["fused"], row["fused config"] = timed[best], best
    # Against the same two steps on the Triton GEMM's output: only where the rotary runs differs.
    plain = linear(x, weights[0], biases[0], CONFIGS[0]).view(rows, 3, HEADS, HEAD_DIM)
    q, k, _ = plain.unbind(1)
    triton_rotary_(q, k, cos, sin)
    row["fused == triton + rotary"] = torch.equal(
        qkv_rotary(x, weights[0], biases[0], cos, sin, HEADS, CONFIGS[0]), plain
    )
    return row


def format_table(results: list[dict]) -> str:
    header = ["shape", "cuBLAS µs", "triton µs", "triton/cuBLAS", "cuBLAS + rotary µs", "fused µs", "fused/(c+r)"]
    lines = [header]
    for row in results:
        fused = "fused" in row
        lines.append(
            [
                row["shape"],
                f"{row['cuBLAS']:.2f}",
                f"{row['triton']:.2f}",
                f"{row['triton'] / row['cuBLAS']:.2f}x",
                f"{row['cuBLAS + rotary']:.2f}" if fused else "",
                f"{row['fused']:.2f}" if fused else "",
                f"{row['fused'] / row['cuBLAS + rotary']:.2f}x" if fused else "",
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    table = ["  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True)) for line in lines]
    notes = [
        f"{row['shape']}: best triton {row['triton config']}, max err vs fp64 cuBLAS {row['cuBLAS err']:.3g} "
        f"triton {row['triton err']:.3g}"
        + (
            f"; fused {row['fused config']}, equal to triton + rotary: {row['fused == triton + rotary']}"
            if "fused" in row
            else ""
        )
        for row in results
    ]
    return "\n".join(
        [
            *notes,
            f"device µs a call on {torch.cuda.get_device_name()}, torch {torch.__version__}, "
            f"triton {triton.__version__}",
            *table,
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="196,784,2116", help="token counts, comma-separated")
    args = parser.parse_args(argv)
    results = measure([int(rows) for rows in args.rows.split(",")])
    print(format_table(results))
    return 0 if all(row.get("fused == triton + rotary", True) for row in results) else 1


if __name__ == "__main__":
    sys.exit(main())
