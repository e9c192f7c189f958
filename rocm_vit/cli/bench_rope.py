"""``rocm-vit bench-rope``: the vision RoPE against a device copy and the upstream implementations.

Bandwidth: q and k read and written, cos/sin read, against a device copy in the same run.
Device times: median graph replay over input sets totalling twice the L2, divided by the sets.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
from collections.abc import Callable
from datetime import datetime, timezone

import torch

from rocm_vit.workloads.workload import table_lines

logger = logging.getLogger(__name__)

RotaryFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], object]

# Tokens per program x warps tried by --sweep; configurations above _SWEEP_MAX_ELEMENTS padded
# elements per program would spill registers and are not tried.
_SWEEP_BLOCK_TOKENS = (1, 2, 4, 8, 16)
_SWEEP_NUM_WARPS = (2, 4, 8, 16)
_SWEEP_MAX_ELEMENTS = 32768


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tokens", type=int, nargs="+", default=[1024, 4096, 16384, 65536], help="default 1024 4096 16384 65536"
    )
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 72, 80, 128], help="default 64 72 80 128")
    parser.add_argument("--heads", type=int, default=16, help="q heads (default 16)")
    parser.add_argument("--kv-heads", type=int, help="k heads (default: --heads)")
    parser.add_argument("--copy-mib", type=int, default=1024, help="size of the reference copy (default 1024)")
    parser.add_argument(
        "--no-compiled", action="store_true", help="skip the torch.compile column (one compile per shape)"
    )
    parser.add_argument(
        "--sweep", action="store_true", help="also time the Triton kernel at each tokens-per-program x warps"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")


def run(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        logger.error("bench-rope needs a CUDA or ROCm GPU (torch.cuda.is_available() is False)")
        return 2
    import triton

    from rocm_vit.backends import triton_rope
    from rocm_vit.version import build_info

    kv_heads = args.kv_heads or args.heads
    copy_bytes_per_s = _copy_bytes_per_s(args.copy_mib)
    baselines, skipped = _baselines(args.no_compiled)
    rows, sweep = [], []
    for num_tokens in args.tokens:
        for head_dim in args.head_dims:
            logger.info("timing %d tokens, head dim %d", num_tokens, head_dim)
            input_sets = _input_sets(num_tokens, args.heads, kv_heads, head_dim)
            q, k, cos, sin = input_sets[0]
            moved_bytes = 2 * (q.nbytes + k.nbytes) + cos.nbytes + sin.nbytes
            row = {"tokens": num_tokens, "head_dim": head_dim, "bytes": moved_bytes, "us": {}, "pct_copy": {}}
            impls = {"rocm-vit": triton_rope.triton_rotary_, **{n: make() for n, make in baselines.items()}}
            for name, fn in impls.items():
                seconds = _median_seconds(name, fn, input_sets)
                row["us"][name] = None if seconds is None else seconds * 1e6
                row["pct_copy"][name] = None if seconds is None else 100 * moved_bytes / seconds / copy_bytes_per_s
            rows.append(row)
            if args.sweep:
                sweep.append(_sweep(triton_rope, input_sets))
    report = {
        **build_info(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "dtype": "bf16 q/k, fp32 cos/sin",
        "heads": args.heads,
        "kv_heads": kv_heads,
        "copy_tb_per_s": copy_bytes_per_s / 1e12,
        "skipped": skipped,
        "rows": rows,
        "sweep": sweep,
    }
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


def format_report(report: dict) -> str:
    """Sweep first (when run), then the table of implementations, which is printed last."""
    lines = []
    if report["sweep"]:
        lines.append("Triton kernel sweep (tokens per program x warps), median us")
        for entry in report["sweep"]:
            default, best = entry["default"], entry["best"]
            lines.append(
                f"  {entry['tokens']:>6} tokens  D {entry['head_dim']:>3}  "
                f"default {default['block_tokens']}x{default['num_warps']} {default['us']:.1f}  "
                f"best {best['block_tokens']}x{best['num_warps']} {best['us']:.1f}"
            )
        lines.append("")
    names = list(report["rows"][0]["us"]) if report["rows"] else []
    header = ["tokens", "head_dim", *(f"{name} us (% copy)" for name in names)]
    cells = [
        [str(row["tokens"]), str(row["head_dim"]), *(_cell(row, name) for name in names)] for row in report["rows"]
    ]
    lines += [
        f"rocm-vit bench-rope  {report['date']}  {report['device']}  torch {report['torch']}  "
        f"triton {report['triton']}",
        f"{report['dtype']}, {report['heads']} q heads, {report['kv_heads']} k heads; "
        f"copy {report['copy_tb_per_s']:.2f} TB/s (read + write); median device time under CUDA graphs",
        *table_lines(header, cells),
    ]
    lines += [f"skipped {name}: {reason}" for name, reason in report["skipped"].items()]
    return "\n".join(lines)


def _cell(row: dict, name: str) -> str:
    if row["us"][name] is None:
        return "failed"
    return f"{row['us'][name]:.1f} ({row['pct_copy'][name]:.0f}%)"


def _copy_bytes_per_s(size_mib: int) -> float:
    import triton.testing

    source = torch.empty(size_mib << 20, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    seconds = triton.testing.do_bench(lambda: target.copy_(source), return_mode="median") * 1e-3
    return 2 * source.nbytes / seconds


def _input_sets(num_tokens: int, heads: int, kv_heads: int, head_dim: int) -> list[tuple]:
    """Input sets covering twice the L2 (at most 64); real cos/sin keep norms over repeated in-place use."""
    generator = torch.Generator(device="cuda").manual_seed(0)
    per_set_bytes = num_tokens * head_dim * (2 * (heads + kv_heads) + 8)
    l2_bytes = torch.cuda.get_device_properties(0).L2_cache_size
    sets = []
    for _ in range(min(64, max(1, -(-2 * l2_bytes // per_set_bytes)))):
        q = torch.randn(num_tokens, heads, head_dim, device="cuda", generator=generator).bfloat16()
        k = torch.randn(num_tokens, kv_heads, head_dim, device="cuda", generator=generator).bfloat16()
        angles = torch.rand(num_tokens, head_dim // 2, device="cuda", generator=generator) * (2 * math.pi)
        sets.append((q, k, torch.cat([angles.cos()] * 2, dim=-1), torch.cat([angles.sin()] * 2, dim=-1)))
    return sets


def _median_seconds(name: str, fn: RotaryFn, input_sets: list[tuple], replays: int = 30) -> float | None:
    """Median device seconds of one ``fn`` call from graph replays; ``None`` where it fails."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for args in input_sets:  # compile (Triton JIT, torch.compile) outside the capture
                fn(*args)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for args in input_sets:
                fn(*args)
        samples = []
        for _ in range(replays):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e-3 / len(input_sets))
    except Exception:
        q, k = input_sets[0][:2]
        logger.exception("%s failed at q %s, k %s", name, tuple(q.shape), tuple(k.shape))
        return None
    return statistics.median(samples)


def _baselines(no_compiled: bool) -> tuple[dict[str, Callable[[], RotaryFn]], dict[str, str]]:
    """name -> factory of a fresh callable per shape, and name -> why a column is missing."""
    baselines: dict[str, Callable[[], RotaryFn]] = {}
    skipped: dict[str, str] = {}
    try:
        from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb_vision
    except ImportError as err:
        skipped["hf eager"] = skipped["hf compiled"] = f"transformers not importable ({err})"
    else:
        baselines["hf eager"] = lambda: apply_rotary_pos_emb_vision
        if no_compiled:
            skipped["hf compiled"] = "--no-compiled"
        else:
            baselines["hf compiled"] = lambda: _compiled_per_shape(apply_rotary_pos_emb_vision)
    try:
        from liger_kernel.transformers.rope import liger_rotary_pos_emb_vision
    except ImportError as err:
        skipped["liger"] = f"liger_kernel's vision rope not importable ({err})"
    else:
        baselines["liger"] = lambda: liger_rotary_pos_emb_vision
    return baselines, skipped


def _compiled_per_shape(fn: RotaryFn) -> RotaryFn:
    # A fresh static compile per shape: 16 shapes would pass dynamo's recompile limit.
    torch.compiler.reset()
    return torch.compile(fn, dynamic=False)


def _sweep(triton_rope, input_sets: list[tuple]) -> dict:
    """Time the kernel at every configuration that fits; report the default and the best."""
    q, k = input_sets[0][:2]
    num_tokens, heads, head_dim = q.shape
    per_token = triton_rope._elements_per_token(heads, k.shape[1], head_dim)
    default_tokens, default_warps = triton_rope._launch_config(heads, k.shape[1], head_dim)
    timings = []
    for block_tokens in _SWEEP_BLOCK_TOKENS:
        if block_tokens * per_token > _SWEEP_MAX_ELEMENTS:
            continue
        for num_warps in _SWEEP_NUM_WARPS:

            def launch(q, k, cos, sin, block_tokens=block_tokens, num_warps=num_warps):
                triton_rope._launch(q, k, cos, sin, block_tokens, num_warps)

            name = f"triton {block_tokens} tokens x {num_warps} warps"
            seconds = _median_seconds(name, launch, input_sets)
            if seconds is not None:
                timings.append({"block_tokens": block_tokens, "num_warps": num_warps, "us": seconds * 1e6})
    default = next(t for t in timings if (t["block_tokens"], t["num_warps"]) == (default_tokens, default_warps))
    return {
        "tokens": num_tokens,
        "head_dim": head_dim,
        "default": default,
        "best": min(timings, key=lambda t: t["us"]),
        "all": timings,
    }
