"""How much of an eager forward's host time goes when its launches are issued from compiled code?

The experiment behind the launch goals after ``tests/gpu_cublaslt_host_bench.py`` (docs/benchmarks.md,
"GEMM epilogues and GEMM launches"): from Python a GEMM costs ≥ 16 µs of host however it is called, so
the 8B tower's ~236 launches cannot be enqueued in 3 ms from Python. ``torch.compile`` is the compiled
launcher a pure-Python package can reach: Inductor writes the forward as a wrapper that launches
every kernel, in Python by default or in C++ with ``cpp_wrapper``. This times the 8B tower's blocks
and merger (``run_blocks`` and ``merger.project``: the deepstack mergers' side stream stays out) for one
layout, each variant behind a busy device, interleaved twice after a warm-up:

- ``product``: rocm-vit's eager path as it serves (its policy: Triton add+norm, rotary and attention);
- ``plain``: the same blocks on torch ops alone (``sdpa`` attention, native rotary, fused ops off),
  what Dynamo can trace;
- ``compiled-py``: ``plain`` under ``torch.compile`` (static shapes), Inductor's Python wrapper;
- ``compiled-cpp``: the same with ``cpp_wrapper``, its launches issued from C++.

    python tests/gpu_compiled_launch_bench.py --layout 1x224   # on a GPU: the table prints last

Each process resolves one policy, so ``product`` runs in a child process of its own. Prediction,
1x224 on an H100: product ~9 ms of host, plain ~10, compiled-py ~4 (~250 launches through Triton's
Python launcher, ~12 µs each), compiled-cpp ~1.5 (~4 µs a launch); device time within 10 % of plain's;
outputs within bf16 rounding of plain's (Inductor fuses, so not bit for bit). If compiled-cpp
holds the host under 3 ms, compiled launches are the route to a 3 ms host. Run on an H100 on
2026-12-07: 5.1-7.3 ms, its kernels 24-25 % longer (docs/benchmarks.md, "GEMM epilogues and GEMM
launches"); the prediction failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

_PLAIN_POLICY = {"ROCM_VIT_ATTENTION_BACKEND": "sdpa", "ROCM_VIT_ROTARY": "native", "ROCM_VIT_FUSED_OPS": "0"}
_ROUNDS = ("warm-up", "1", "2")
# Inductor's options per compiled variant: its Python wrapper, and its C++ one.
COMPILED = {"compiled-py": {}, "compiled-cpp": {"cpp_wrapper": True}}


def measure(variants: list[str], preset: str, layout: str, repeats: int) -> list[dict]:
    """One row per variant and round (the warm-up's dropped): host, device ms, kernels, compile s. A CPU
    runs the script's own test (fp32; no device columns)."""
    import torch

    from rocm_vit.models.tower import run_blocks
    from rocm_vit.policy import active_policy, use_policy
    from rocm_vit.workloads.launch_cost import eager_cost
    from rocm_vit.workloads.workload import build_tower, parse_layouts

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    tower = build_tower(preset, device, dtype, None, seed=0)
    (workload,) = parse_layouts(layout, tower.config)
    prepared = tower._prepare(list(workload.grid_thw), workload.patches)
    args = tower.attention.layout_args(prepared.layout, prepared.layout.cu_seqlens_tensors(device))["full"]
    layer_args = [args] * len(tower.blocks)
    x = torch.randn(workload.patches, tower.config.hidden_size, device=device, dtype=dtype)

    def stack(x: torch.Tensor) -> torch.Tensor:
        normed, _ = run_blocks(tower.blocks, x, layer_args, prepared.cos, prepared.sin, tower.merger.norm)
        return tower.merger.project(normed)

    rows = []
    # The policy held as a constant: Dynamo would otherwise trace into its resolution.
    with torch.inference_mode(), use_policy(active_policy()):
        reference = stack(x)
        # One function for both eager variants: this process's policy (product's, or _PLAIN_POLICY) decides.
        calls = dict.fromkeys(("product", "plain"), stack)
        compile_s = {}
        for name, options in COMPILED.items():
            if name in variants:
                started = time.perf_counter()
                try:
                    compiled = torch.compile(stack, dynamic=False, options=options)
                    compiled(x)
                except Exception as error:  # an experiment: report what failed, go on with the rest
                    print(f"{name}: {type(error).__name__}: {str(error)[:300]}", file=sys.stderr, flush=True)
                    continue
                calls[name], compile_s[name] = compiled, time.perf_counter() - started
        for round_name in _ROUNDS:
            for name in variants:
                if name not in calls:
                    continue
                cost = eager_cost(lambda call=calls[name]: call(x), device, repeats)
                error = (calls[name](x).float() - reference.float()).abs().max().item()
                row = {"variant": name, "round": round_name, "host_ms": cost.host_ms, "device_ms": cost.device_ms}
                row |= {"kernels": cost.kernels, "max_diff": error, "compile_s": compile_s.get(name)}
                print(json.dumps(row), file=sys.stderr, flush=True)
                if round_name != "warm-up":
                    rows.append(row)
    return rows


def format_table(rows: list[dict], preset: str, layout: str) -> str:
    import torch

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    lines = [
        f"{preset} blocks + merger, {layout}, {device}, torch {torch.__version__}: host and "
        "device ms a call, kernels, max |diff| against the eager call of its process, compile s",
        f"{'variant':>22}  {'round':>5}  {'host':>7}  {'device':>7}  {'kernels':>7}  {'max diff':>9}  compile",
    ]
    for row in rows:
        compile_s = "" if row["compile_s"] is None else f"{row['compile_s']:.1f}"
        device_ms = "" if row["device_ms"] is None else f"{row['device_ms']:.2f}"
        lines.append(
            f"{row['variant']:>22}  {row['round']:>5}  {row['host_ms']:7.2f}  {device_ms:>7}  "
            f"{row['kernels']!s:>7}  {row['max_diff']:9.3g}  {compile_s}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen3-vl-8b")
    parser.add_argument("--layout", default="1x224")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--compiled", default=",".join(COMPILED), help="the compiled variants run beside plain")
    parser.add_argument("--variants", default=None, help="this process's variants only, as JSON (the child)")
    args = parser.parse_args(argv)
    common = ["--preset", args.preset, "--layout", args.layout, "--repeats", str(args.repeats)]
    if args.variants is not None:
        print(json.dumps(measure(args.variants.split(","), args.preset, args.layout, args.repeats)))
        return 0
    child = subprocess.run(
        [sys.executable, __file__, *common, "--variants", "product"], capture_output=True, text=True, check=False
    )
    sys.stderr.write(child.stderr)
    os.environ.update(_PLAIN_POLICY)
    compiled = [name for name in args.compiled.split(",") if name]
    rows = _rows(child.stdout) + measure(["plain", *compiled], args.preset, args.layout, args.repeats)
    print(format_table(rows, args.preset, args.layout))
    return child.returncode


def _rows(stdout: str) -> list[dict]:
    """The child's rows: the last line of its standard output."""
    lines = stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else []


if __name__ == "__main__":
    sys.exit(main())
