"""``rocm-vit bench-attn``: every available attention kernel per image layout, against the matmul rate.

Per layout (bf16, 16 heads, head dims 72, 64, 80, up to a 12 MP photo's 47,376 tokens): median ms,
TFLOP/s against the measured matmul rate, the error against SDPA, the cold first call, and whether the
policy's pick is the fastest measured within 3 %. ``--sweep-triton`` times the Triton configurations
behind ``default_config``.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Callable

import torch

from rocm_vit.layout import GridTHW
from rocm_vit.workloads.workload import KernelTimer, int_list

LAYOUTS: dict[str, list[GridTHW]] = {
    "1x1024": [(1, 32, 32)],
    "1x3072": [(1, 48, 64)],
    "1x4096": [(1, 64, 64)],
    "1x8192": [(1, 64, 128)],
    "1x12800": [(1, 80, 160)],
    "1x16384": [(1, 128, 128)],
    "2x8192": [(1, 64, 128)] * 2,
    "4x1024": [(1, 32, 32)] * 4,
    "8x1024": [(1, 32, 32)] * 8,
    "16x256": [(1, 16, 16)] * 16,
    "ragged4": [(1, 64, 64), (1, 48, 48), (1, 32, 32), (1, 16, 16)],
    "ragged16": [(1, 16 + 2 * (i % 13), 16 + 2 * ((3 * i) % 13)) for i in range(16)],
    # Real photos at Qwen3-VL's default pixel limits (16-pixel patches, merge 2), where attention is
    # most of the tower: a 1920x1080 screenshot, two of them in one call, a 2560x1440 one, and a
    # 12 MP (4032x3024) phone photo. docs/long-sequences.md has the numbers.
    "1x8160": [(1, 68, 120)],
    "2x8160": [(1, 68, 120)] * 2,
    "1x14400": [(1, 90, 160)],
    "1x47376": [(1, 188, 252)],
}
SWEEP_LAYOUTS = ("1x1024", "1x4096", "1x16384", "2x8192", "16x256")
SWEEP_CONFIGS = [
    (block_m, block_n, warps, stages)
    for block_m in (64, 128)
    for block_n in (32, 64, 128)
    for warps in (4, 8)
    for stages in (2, 3)
]
MATMUL_SIZE = 8192


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``rocm-vit bench-attn``."""
    parser.add_argument(
        "--head-dims", type=int_list, default=[72, 64, 80], help="comma-separated head dims (default 72,64,80)"
    )
    parser.add_argument("--heads", type=int, default=16, help="attention heads (default 16, Qwen3-VL)")
    parser.add_argument(
        "--layouts", type=_name_list, default=list(LAYOUTS), help=f"comma-separated subset of {','.join(LAYOUTS)}"
    )
    parser.add_argument("--rep-ms", type=int, default=100, help="timing window per measurement (default 100)")
    parser.add_argument(
        "--timer",
        choices=["graph", "launches"],
        default="graph",
        help="graph: calls replayed from a CUDA/HIP graph, the host left out (default); "
        "launches: one launch at a time, L2 flushed between",
    )
    parser.add_argument(
        "--sweep-triton", action="store_true", help="also time Triton launch configs (adds about a minute per head dim)"
    )
    parser.add_argument(
        "--json", metavar="PATH", help="write every measurement as JSON ('-': stdout, before the tables)"
    )


def run(args: argparse.Namespace) -> int:
    """Benchmark and print the tables; 2 when no GPU is visible."""
    if not torch.cuda.is_available():
        print("rocm-vit bench-attn needs a CUDA or ROCm GPU; torch sees none", file=sys.stderr)
        return 2
    unknown = sorted(set(args.layouts) - set(LAYOUTS))
    if unknown:
        print(f"unknown layouts {unknown}; known: {list(LAYOUTS)}", file=sys.stderr)
        return 2
    import triton

    from rocm_vit.platform import current_platform, platform_info
    from rocm_vit.version import build_info

    started = time.perf_counter()
    platform = current_platform()
    device = torch.device("cuda")
    bench = KernelTimer(device, args.rep_ms, graph=args.timer == "graph")
    matmul_tflops = _matmul_tflops(bench, device)
    variants = _variants(platform)
    results = []
    for head_dim in args.head_dims:
        for layout_name in args.layouts:
            results += _measure_layout(bench, variants, layout_name, head_dim, args.heads, device, matmul_tflops)
            print(f"  measured d{head_dim} {layout_name}", file=sys.stderr, flush=True)
    sweep = _sweep_triton(bench, args, device) if args.sweep_triton and "triton_attn" in variants else []
    rule = _policy_check(results, args.head_dims[0])
    info = platform_info()
    header = {
        **build_info(),
        "device": info.device_name,
        "arch": info.arch,
        "heads": args.heads,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "matmul_bf16_tflops": round(matmul_tflops, 1),
        "timer": args.timer,
        "skipped_backends": {name: why for name, why in _unavailable(platform).items()},
        "seconds": round(time.perf_counter() - started, 1),
    }
    if args.json:
        document = json.dumps({**header, "results": results, "triton_sweep": sweep, "policy_picks": rule}, indent=1)
        if args.json == "-":
            print(document)
        else:
            with open(args.json, "w") as handle:
                handle.write(document + "\n")
    _print_tables(header, results, sweep, rule, list(variants), args.head_dims, args.layouts)
    return 0


def _matmul_tflops(bench: KernelTimer, device: torch.device) -> float:
    a = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device=device, dtype=torch.bfloat16)
    b = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device=device, dtype=torch.bfloat16)
    milliseconds = bench(lambda: a @ b)
    return 2 * MATMUL_SIZE**3 / (milliseconds * 1e-3) / 1e12


def _variants(platform: str) -> dict[str, Callable]:
    """name -> factory of ``(q, k, v, layout, cu_seqlens, scale) -> fn``, for each kernel that can run."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from rocm_vit.attention import BACKENDS, SdpaAttention
    from rocm_vit.backends.sdpa import sdpa_varlen

    def backend_variant(name: str) -> Callable:
        backend = BACKENDS[name]()

        def make(q, k, v, layout, cu_seqlens, scale):
            attn_args = backend.runner_args(layout, cu_seqlens)
            return lambda: backend(q, k, v, attn_args, scale)

        return make

    def sdpa_cudnn(q, k, v, layout, cu_seqlens, scale):
        def run():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return sdpa_varlen(q, k, v, layout.seq_lens, scale)

        return run

    variants: dict[str, Callable] = {"sdpa": backend_variant(SdpaAttention.name)}
    if platform == "cuda":  # measured for reference; the rule does not use it (see rocm_vit.policy)
        variants["sdpa_cudnn"] = sdpa_cudnn
    for name in _VARLEN_NAMES:
        if BACKENDS[name].unavailable_reason(platform) is None:
            variants[name] = backend_variant(name)
    return variants


# The one-launch varlen kernels measured beside SDPA, where each can run.
_VARLEN_NAMES = ("torch_varlen", "triton_attn", "gluon_attn", "fa4", "aiter_attn", "aiter_attn_pad128")


def _unavailable(platform: str) -> dict[str, str]:
    from rocm_vit.attention import BACKENDS

    reasons = {name: BACKENDS[name].unavailable_reason(platform) for name in _VARLEN_NAMES}
    return {name: why for name, why in reasons.items() if why}


def _inputs(layout, heads: int, head_dim: int, device: torch.device):
    """bf16 q, k, v as the tower makes them: views of one packed ``[N, 3, H, D]`` projection."""
    generator = torch.Generator(device=device).manual_seed(0)
    shape = (layout.num_patches, 3, heads, head_dim)
    return torch.randn(shape, generator=generator, device=device, dtype=torch.bfloat16).unbind(1)


def _flops(seq_lens: tuple[int, ...], heads: int, head_dim: int) -> float:
    return sum(4.0 * length * length * heads * head_dim for length in seq_lens)


def _measure_layout(
    bench: KernelTimer,
    variants: dict[str, Callable],
    layout_name: str,
    head_dim: int,
    heads: int,
    device: torch.device,
    matmul_tflops: float,
) -> list[dict]:
    from rocm_vit.backends.sdpa import sdpa_varlen
    from rocm_vit.layout import VisionLayout

    layout = VisionLayout.from_grid_thw(LAYOUTS[layout_name])
    q, k, v = _inputs(layout, heads, head_dim, device)
    cu_seqlens = layout.cu_seqlens_tensor(device)
    scale = head_dim**-0.5
    reference = sdpa_varlen(q.float(), k.float(), v.float(), layout.seq_lens, scale)
    flops = _flops(layout.seq_lens, heads, head_dim)
    rows = []
    for name, make in variants.items():
        row = {
            "head_dim": head_dim,
            "layout": layout_name,
            "tokens": layout.num_patches,
            "segments": len(layout.seq_lens),
            "backend": name,
        }
        try:
            fn = make(q, k, v, layout, cu_seqlens, scale)
            torch.cuda.synchronize()
            cold_start = time.perf_counter()
            out = fn()  # Triton compiles per head dim and dtype, cuDNN builds a plan per new shape
            torch.cuda.synchronize()
            row["first_call_ms"] = (time.perf_counter() - cold_start) * 1e3
            row["rel_err"] = float((out.float() - reference).norm() / reference.norm())
            milliseconds = bench(fn)
        except Exception as err:  # a kernel that cannot run this shape is a result, not a crash
            rows.append({**row, "error": f"{type(err).__name__}: {err}"[:200]})
            continue
        tflops = flops / (milliseconds * 1e-3) / 1e12
        rows.append({**row, "ms": milliseconds, "tflops": tflops, "pct_matmul": 100 * tflops / matmul_tflops})
    return rows


def _sweep_triton(bench: KernelTimer, args: argparse.Namespace, device: torch.device) -> list[dict]:
    from rocm_vit.backends.triton_attn import TritonAttnConfig, default_config, triton_varlen_attention
    from rocm_vit.layout import VisionLayout
    from rocm_vit.platform import platform_info

    rows = []
    for head_dim in args.head_dims:
        default = default_config(head_dim, torch.bfloat16, arch=platform_info().arch)
        for layout_name in SWEEP_LAYOUTS:
            layout = VisionLayout.from_grid_thw(LAYOUTS[layout_name])
            q, k, v = _inputs(layout, args.heads, head_dim, device)
            cu_seqlens = layout.cu_seqlens_tensor(device)
            out = torch.empty(q.shape, dtype=q.dtype, device=device)
            flops = _flops(layout.seq_lens, args.heads, head_dim)
            for values in SWEEP_CONFIGS:
                config = TritonAttnConfig(*values)
                row = {"head_dim": head_dim, "layout": layout_name, "config": values, "default": config == default}

                fn = functools.partial(
                    triton_varlen_attention,
                    q, k, v, cu_seqlens, layout.max_seqlen, head_dim**-0.5, out=out, config=config,
                )  # fmt: skip
                try:
                    fn()
                    milliseconds = bench(fn, rep_ms=25)
                except Exception as err:  # e.g. out of shared memory for this tile shape
                    rows.append({**row, "error": f"{type(err).__name__}: {err}"[:120]})
                    continue
                rows.append({**row, "ms": milliseconds, "tflops": flops / (milliseconds * 1e-3) / 1e12})
            print(f"  swept d{head_dim} {layout_name}", file=sys.stderr, flush=True)
    return rows


def _policy_check(results: list[dict], head_dim: int) -> list[dict]:
    """Per layout: the policy's pick and the fastest measured kernel ``auto`` could pick here."""
    from rocm_vit.layout import VisionLayout
    from rocm_vit.policy import AUTO_CANDIDATES, active_policy

    policy = active_policy()
    attention = policy.attention
    rows = []
    for layout_name in dict.fromkeys(row["layout"] for row in results if row["head_dim"] == head_dim):
        times = {
            row["backend"]: row["ms"]
            for row in results
            if row["head_dim"] == head_dim and row["layout"] == layout_name and "ms" in row
        }
        candidates = {name: times[name] for name in AUTO_CANDIDATES[policy.facts.platform] if name in times}
        seq_lens = VisionLayout.from_grid_thw(LAYOUTS[layout_name]).seq_lens
        picked, why = attention.pick(seq_lens, head_dim)
        fastest = min(candidates, key=candidates.get) if candidates else None
        rows.append(
            {
                "layout": layout_name,
                "head_dim": head_dim,
                "picked": picked,
                "why": why,
                "picked_ms": candidates.get(picked),
                "fastest": fastest,
                "fastest_ms": candidates.get(fastest),
            }
        )
    return rows


def _print_tables(
    header: dict,
    results: list[dict],
    sweep: list[dict],
    rule: list[dict],
    backends: list[str],
    head_dims: list[int],
    layouts: list[str],
) -> None:
    print(
        f"\nrocm-vit {header['rocm_vit']} commit {header['commit']}\n"
        f"{header['device']} ({header['arch']}), torch {header['torch']}, triton {header['triton']}: "
        f"bf16 matmul {MATMUL_SIZE}^3 = {header['matmul_bf16_tflops']} TFLOP/s; {header['seconds']} s"
    )
    for name, why in header["skipped_backends"].items():
        print(f"  not measured: {name}: {why}")
    if sweep:
        print("\nTriton launch configs (block_m, block_n, warps, stages), best per layout; * = default_config")
        for head_dim in head_dims:
            for layout_name in SWEEP_LAYOUTS:
                timed = [r for r in sweep if r["head_dim"] == head_dim and r["layout"] == layout_name and "ms" in r]
                if not timed:
                    continue
                best = min(timed, key=lambda r: r["ms"])
                default = next((r for r in timed if r["default"]), None)
                default_text = f"{default['ms']:.3f} ms" if default else "failed"
                print(
                    f"  d{head_dim} {layout_name:>8}: best {best['config']} {best['ms']:.3f} ms "
                    f"{best['tflops']:.0f} TFLOP/s; default* {default_text}"
                )
    cell = 22
    by_key = {(r["head_dim"], r["layout"], r["backend"]): r for r in results}
    # triton_attn's target: within 1.5x of the vendor varlen kernel.
    vendor = next((name for name in ("torch_varlen", "aiter_attn") if name in backends), None)
    ratio = f"triton/{vendor}" if vendor and "triton_attn" in backends else ""
    for head_dim in head_dims:
        print(f"\nhead dim {head_dim}, {header['heads']} heads, bf16; per backend: ms, TFLOP/s, % of matmul")
        print(f"{'layout':>9} {'tokens':>6} " + " ".join(f"{b:>{cell}}" for b in backends) + f" {ratio:>19}")
        for layout_name in layouts:
            cells = []
            for backend in backends:
                row = by_key.get((head_dim, layout_name, backend))
                if row is None or "ms" not in row:
                    cells.append(f"{'error':>{cell}}")
                    continue
                flag = "!" if row["rel_err"] > 2e-2 else ""
                cells.append(f"{row['ms']:7.3f} {row['tflops']:5.0f} {row['pct_matmul']:4.0f}%{flag:1}".rjust(cell))
            triton_row = by_key.get((head_dim, layout_name, "triton_attn"), {})
            vendor_row = by_key.get((head_dim, layout_name, vendor), {})
            both = "ms" in triton_row and "ms" in vendor_row
            ratio_text = f"{triton_row['ms'] / vendor_row['ms']:.2f}x" if both else ""
            tokens = next((r["tokens"] for r in results if r["layout"] == layout_name), 0)
            print(f"{layout_name:>9} {tokens:>6} " + " ".join(cells) + f" {ratio_text:>19}")
    print(f"\nfirst call per new layout, head dim {head_dims[0]} (ms, host included: compilation, plans)")
    print(f"{'layout':>9} " + " ".join(f"{b:>{cell}}" for b in backends))
    for layout_name in layouts:
        cold = [by_key.get((head_dims[0], layout_name, backend), {}).get("first_call_ms") for backend in backends]
        print(f"{layout_name:>9} " + " ".join(f"{'-' if ms is None else f'{ms:.1f}':>{cell}}" for ms in cold))
    errors = [r for r in results if "error" in r]
    for row in errors:
        print(f"  error: d{row['head_dim']} {row['layout']} {row['backend']}: {row['error']}")
    if any(r.get("rel_err", 0) > 2e-2 for r in results):
        print("  ! = relative error against torch's default SDPA (fp32) above 2e-2")
    if rule:
        within = sum(row["picked_ms"] is not None and row["picked_ms"] <= 1.03 * row["fastest_ms"] for row in rule)
        print(
            f"\npolicy's attention pick, head dim {rule[0]['head_dim']}, against the fastest it may pick: "
            f"within 3 % on {within} of {len(rule)} layouts"
        )
        for row in rule:
            picked_ms, fastest_ms = row["picked_ms"], row["fastest_ms"]
            if picked_ms is None or fastest_ms is None:
                verdict = "not measured"
            elif picked_ms <= fastest_ms:
                verdict = "fastest"
            else:
                verdict = f"{picked_ms / fastest_ms:.2f}x slower than {row['fastest']} ({fastest_ms:.3f} ms)"
            picked_text = f"{picked_ms:.3f} ms" if picked_ms is not None else "-"
            print(f"{row['layout']:>9}: {row['picked']:>12} {picked_text:>10}  {verdict}  ({row['why']})")


def _name_list(text: str) -> list[str]:
    return [part for part in text.split(",") if part]
