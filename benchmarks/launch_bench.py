"""An eager call's host and device cost, and its replay, per layout: one tree measured, or trees compared.

``measure`` times whichever ``rocm_vit`` is first on the path (``PYTHONPATH=.base`` for a baseline
tree, ``PYTHONPATH=.`` for this checkout) with this checkout's ``rocm_vit/workloads/launch_cost.py``
loaded by path, so a tree whose ``bench`` lacks these columns is measured the same way as this one.
``compare`` prints one table of the JSON files ``measure`` wrote, before against after per mode.

    PYTHONPATH=.base python benchmarks/launch_bench.py measure --label before --out before.json
    PYTHONPATH=. python benchmarks/launch_bench.py measure --label after --out after.json
    python benchmarks/launch_bench.py compare before.json after.json
    PYTHONPATH=. python benchmarks/launch_bench.py host-profile --layouts 1x224,1x1024
    PYTHONPATH=. python benchmarks/launch_bench.py python-profile --layouts 1x224

``launches`` times single kernels' launches (host µs a call behind a busy device) in this tree;
benchmarks/launch_run.sh runs it all, before and after interleaved, on one card. Run on an H100 on
2026-12-07, 27893e6 before and 598453a after: docs/benchmarks.md, "Eager host cost" (the tables at
e510513: the host before and after, where it goes, launch floors), and b33cdca's ``python-profile``:
no Python hotspot.

(A script, run from the repository root of either tree.)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path

# Single images of 196, 784, 2,116, 4,096, 4,900 and 8,100 patches, and a 2048 x 1600 photo (12,800).
DEFAULT_LAYOUTS = "1x224,1x448,1x736,1x1024,1x1120,1x1440,1x2048x1600"
_LAUNCH_COST = Path(__file__).resolve().parents[1] / "rocm_vit" / "workloads" / "launch_cost.py"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    measure_parser = commands.add_parser("measure", help="time the rocm_vit on the path; write JSON")
    measure_parser.add_argument("--label", required=True, help="e.g. before or after")
    measure_parser.add_argument("--out", type=Path, required=True)
    measure_parser.add_argument("--preset", default="qwen3-vl-8b")
    measure_parser.add_argument("--layouts", default=DEFAULT_LAYOUTS)
    measure_parser.add_argument("--repeats", type=int, default=10)
    measure_parser.add_argument(
        "--slow-launches", action="store_true", help="every Triton launch through JITFunction.run (fast_launch off)"
    )
    profile_parser = commands.add_parser("host-profile", help="where one eager call's host time goes, by op")
    profile_parser.add_argument("--preset", default="qwen3-vl-8b")
    profile_parser.add_argument("--layouts", default="1x224,1x1024")
    profile_parser.add_argument("--top", type=int, default=22, help="ops listed per layout")
    python_parser = commands.add_parser("python-profile", help="where one eager call's host time goes, by function")
    python_parser.add_argument("--preset", default="qwen3-vl-8b")
    python_parser.add_argument("--layouts", default="1x224")
    python_parser.add_argument("--top", type=int, default=40, help="functions listed per layout and order")
    launches_parser = commands.add_parser("launches", help="host us per launch of single kernels, this tree")
    launches_parser.add_argument("--out", type=Path, required=True)
    compare_parser = commands.add_parser("compare", help="one table of measure's JSON files")
    compare_parser.add_argument("files", type=Path, nargs="+")
    args = parser.parse_args(argv)
    if args.command == "measure":
        if args.slow_launches:
            _slow_launches()
        report = measure(args.label, args.preset, args.layouts, args.repeats, args.slow_launches)
        args.out.write_text(json.dumps(report, indent=2))
        print(format_comparison([report]))
        return 1 if any(row["check"] != "exact" for row in report["rows"]) else 0
    if args.command == "host-profile":
        print(host_profile(args.preset, args.layouts, args.top))
        return 0
    if args.command == "python-profile":
        print(python_profile(args.preset, args.layouts, args.top))
        return 0
    if args.command == "launches":
        rows = launch_floors()
        args.out.write_text(json.dumps(rows, indent=2))
        print("\n".join(f"{name:>56}  {us:8.1f} us a call" for name, us in rows.items()))
        return 0
    missing = [str(path) for path in args.files if not path.is_file()]
    reports = [json.loads(path.read_text()) for path in args.files if path.is_file()]
    print(format_comparison(reports) + (f"\nmissing (a failed step): {missing}" if missing else ""))
    return 0


def measure(label: str, preset_name: str, layouts: str, repeats: int, slow_launches: bool = False) -> dict:
    """One row per layout: eager wall ms, host ms, device ms, kernels, host us per launch, replay ms, check."""
    import torch

    import rocm_vit
    from rocm_vit.workloads.workload import bench_graph_options, build_tower, median_ms, parse_layouts, random_pixels

    launch_cost = _load_launch_cost()
    # A CPU runs the script's own test (tiny preset, fp32): no graphs or device columns there.
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    tower = build_tower(preset_name, device, dtype, None, seed=0)
    workloads = parse_layouts(layouts, tower.config)
    tower.enable_graphs(**bench_graph_options(32, workloads, device))
    rows = []
    with torch.inference_mode():
        for index, workload in enumerate(workloads):
            pixels = random_pixels(workload, tower.config, device, index).to(dtype)
            grid = list(workload.grid_thw)

            def eager(pixels=pixels, grid=grid):
                return tower(pixels, grid, use_graphs=False)

            eager_out = eager()
            row = {"layout": workload.spec, "patches": workload.patches}
            row["eager_ms"] = median_ms(eager, device, repeats)
            row.update(launch_cost.eager_cost(eager, device, repeats).fields())
            graph_out = tower(pixels, grid)  # captures
            row["replay_ms"] = median_ms(lambda pixels=pixels, grid=grid: tower(pixels, grid), device, repeats)
            row["check"] = "exact" if torch.equal(graph_out, eager_out) else "MISMATCH"
            if device.type == "cuda" and _aiter_standin_serves():
                row["standin_kernels"] = _standin_kernels(tower, workload, device, dtype, launch_cost)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    return {
        "label": label,
        "mode": ("rocm" if os.environ.get("ROCM_VIT_EMULATE") else "native") + ("/slow" if slow_launches else ""),
        "rocm_vit_path": str(Path(rocm_vit.__file__).resolve().parent),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "triton": _triton_version(),
        "attention_backend": tower.attention.name,
        "preset": preset_name,
        "repeats": repeats,
        "rows": rows,
    }


def host_profile(preset_name: str, layouts: str, top: int, repeats: int = 5) -> str:
    """Per layout: the host time of one eager call (median of ``repeats``, the device kept busy ahead so
    the host never waits), then the ``top`` ops by self CPU time of one profiled call (CPU activities:
    aten ops and driver calls; what is left of the host time is Python and Triton's launch path)."""
    import time

    from torch.profiler import ProfilerActivity, profile

    lines = []
    for mode, workload, call, busy_ahead in _eager_calls(preset_name, layouts):

        def eager(call=call, busy_ahead=busy_ahead):
            busy_ahead()
            started = time.perf_counter()
            call()
            return (time.perf_counter() - started) * 1e3

        for _ in range(3):
            eager()
        host_ms = sorted(eager() for _ in range(repeats))[repeats // 2]
        with profile(activities=[ProfilerActivity.CPU]) as profiler:
            profiled_ms = eager()
        events = profiler.key_averages()
        self_ms = sum(event.self_cpu_time_total for event in events) / 1e3
        lines.append(
            f"== {mode} {workload.spec}: host {host_ms:.2f} ms (median of {repeats}); profiled call "
            f"{profiled_ms:.2f} ms, ops' self CPU {self_ms:.2f} ms"
        )
        for event in sorted(events, key=lambda event: -event.self_cpu_time_total)[:top]:
            per_call = event.self_cpu_time_total / max(event.count, 1)
            lines.append(
                f"  {event.key[:60]:60s} {event.count:5d} calls {event.self_cpu_time_total / 1e3:7.2f} ms"
                f" {per_call:7.1f} us a call"
            )
    return "\n".join(lines)


def python_profile(preset_name: str, layouts: str, top: int, calls: int = 20) -> str:
    """Per layout, ``cProfile`` over ``calls`` eager calls, each behind a busy device (so the host never
    waits on a full launch queue): the ``top`` functions by own time and by time including callees.
    The profiler's own cost per function call inflates small functions; rank, do not add up."""
    import cProfile
    import io
    import pstats

    sections = []
    for mode, workload, call, busy_ahead in _eager_calls(preset_name, layouts):
        for _ in range(3):
            call()
        profiler = cProfile.Profile()
        for _ in range(calls):
            busy_ahead()
            profiler.enable()
            call()
            profiler.disable()
        for order in ("tottime", "cumulative"):
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(top)
            body = text.getvalue()
            table = body[body.find("   ncalls") :]
            sections.append(f"== {mode} {workload.spec}, {calls} calls, by {order}\n{table}")
    return "\n".join(sections)


def _eager_calls(preset_name: str, layouts: str):
    """Per layout, under inference mode: ``(mode, workload, call, busy_ahead)``; ``call`` runs the tower
    eagerly on random pixels, ``busy_ahead`` keeps the device busy so the host never waits on it (a CPU
    runs the scripts' own tests: fp32, nothing to wait on)."""
    import torch

    from rocm_vit.workloads.workload import build_tower, parse_layouts, random_pixels

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    tower = build_tower(preset_name, device, dtype, None, seed=0)
    mode = "rocm" if os.environ.get("ROCM_VIT_EMULATE") else "native"

    def busy_ahead() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda._sleep(200_000_000)

    with torch.inference_mode():
        for index, workload in enumerate(parse_layouts(layouts, tower.config)):
            pixels = random_pixels(workload, tower.config, device, index).to(dtype)
            grid = list(workload.grid_thw)
            yield mode, workload, lambda pixels=pixels, grid=grid: tower(pixels, grid, use_graphs=False), busy_ahead


def _aiter_standin_serves() -> bool:
    """Whether attention runs through aiter's stand-in (ROCm emulated): its torch kernels are counted as
    the tower's, where an MI355X runs aiter's one."""
    return getattr(sys.modules.get("aiter"), "ROCM_VIT_STANDIN", False) is True


def _standin_kernels(tower, workload, device, dtype, launch_cost) -> int:
    """Device activities of the stand-in's calls in one forward: one call shaped as a block's, times the
    depth (each block attends once, one segment a frame)."""
    import aiter
    import torch

    from rocm_vit.workloads.workload import segment_lengths

    config = tower.config
    heads, head_dim = config.num_heads, config.head_dim
    lengths = list(segment_lengths(workload.grid_thw))
    tokens = sum(lengths)
    q, k, v = torch.randn(tokens, 3, heads, head_dim, device=device, dtype=dtype).unbind(1)  # as the tower: views
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    longest = max(lengths)

    def call():
        return aiter.flash_attn_varlen_func(
            q, k, v, offsets, offsets, longest, longest, softmax_scale=head_dim**-0.5, causal=False, return_lse=True
        )

    call()
    return launch_cost.count_device_activities(call, device) * config.depth


def launch_floors(calls: int = 200) -> dict[str, float]:
    """Host microseconds per call of single launches and of one 8B block, each enqueued behind a busy
    device: the floor any eager forward built from these launches pays, and what the block's Python adds."""
    import torch
    import torch.nn.functional as F
    from rocm_vit.backends import fast_launch, triton_add_norm
    from rocm_vit.backends.launch_math import next_power_of_2

    from rocm_vit.rotary import apply_rotary
    from rocm_vit.workloads.workload import build_tower

    launch_cost = _load_launch_cost()
    device, dtype = torch.device("cuda"), torch.bfloat16
    tower = build_tower("qwen3-vl-8b", device, dtype, None, seed=0)
    hidden, width = tower.config.hidden_size, tower.config.intermediate_size
    x = torch.randn(196, hidden, device=device, dtype=dtype)
    update, weight, bias = torch.randn_like(x), torch.randn_like(x[0]), torch.randn_like(x[0])
    summed, normed = torch.empty_like(x), torch.empty_like(x)
    block = tower.blocks[0]
    qkv, proj, fc1, fc2 = block.attn.qkv, block.attn.proj, block.mlp.linear_fc1, block.mlp.linear_fc2
    wide = torch.randn(196, width, device=device, dtype=dtype)
    fused_qkv = torch.randn(2116, 3, 16, 72, device=device, dtype=dtype)
    offsets = torch.tensor([0, 2116], dtype=torch.int32, device=device)
    kernel, norm_block = triton_add_norm._add_norm_kernel, next_power_of_2(hidden)
    args = (x, update, weight, bias, summed, normed, 1e-6, hidden, norm_block, True, True, False)
    fast = fast_launch.launcher(kernel, num_warps=triton_add_norm._num_warps(norm_block), enable_fp_fusion=False)
    named = dict(zip(("HIDDEN", "BLOCK", "HAS_UPDATE", "HAS_BIAS", "RMS"), args[7:], strict=True))
    prepared = tower._prepare([[1, 14, 14]], 196)
    layer_args = tower.attention.layout_args(prepared.layout, prepared.layout.cu_seqlens_tensors(device))["full"]
    q196, k196, _ = torch.randn(196, 3, 16, 72, device=device, dtype=dtype).unbind(1)
    cases = {
        "torch add (one kernel)": lambda: torch.add(x, update),
        "torch.empty_like (no kernel)": lambda: torch.empty_like(x),
        "qkv view + unbind (no kernel)": lambda: fused_qkv[:196].view(196, 3, 16, 72).unbind(1),
        "F.linear qkv 196x1152x3456 (cuBLASLt, bias epilogue)": lambda: F.linear(x, qkv.weight, qkv.bias),
        "torch.mm qkv 196x1152x3456 (no bias)": lambda: torch.mm(x, qkv.weight.t()),
        "F.linear proj 196x1152x1152": lambda: F.linear(x, proj.weight, proj.bias),
        "addmm + GELU epilogue fc1 196x1152x4304": lambda: torch._addmm_activation(
            fc1.bias, x, fc1.weight.t(), use_gelu=True
        ),
        "F.linear fc2 196x4304x1152": lambda: F.linear(wide, fc2.weight, fc2.bias),
        "nn.Linear module call qkv": lambda: qkv(x),
        "add_norm kernel[grid] (JITFunction.run)": lambda: kernel[(196,)](
            *args[:7], **named, num_warps=fast._options["num_warps"], enable_fp_fusion=False
        ),
        "add_norm FastLaunch (kept kernel)": lambda: fast((196,), *args),
        "add_norm wrapper (2 allocations + launch)": lambda: triton_add_norm.add_norm(
            x, update, weight, bias, 1e-6, "layer_norm"
        ),
        "rotary: rocm_vit.rotary.apply_rotary 1x196": lambda: apply_rotary(q196, k196, prepared.cos, prepared.sin),
        "attention: the tower's backend 1x196": lambda: tower.attention(q196, k196, q196, layer_args, 72**-0.5),
        _BLOCK_CASE: lambda: block(x, update, layer_args, prepared.cos, prepared.sin, tower.blocks[1].norm1),
    }
    if torch.cuda.get_device_capability() == (9, 0) and torch.version.hip is None:
        from rocm_vit.backends import gluon_attn

        q, k, v = fused_qkv.unbind(1)
        cases["gluon_attn 1x2116 wrapper (3 launches)"] = lambda: gluon_attn.gluon_varlen_attention(
            q, k, v, offsets, 2116, 0.1
        )
    floors = {}
    with torch.inference_mode():
        for name, call in cases.items():
            floors[name] = _host_us(launch_cost, device, call, calls // 8 if name == _BLOCK_CASE else calls)
        previous = torch.backends.cuda.preferred_blas_library()
        torch.backends.cuda.preferred_blas_library("cublaslt")
        floors["torch.mm qkv, cuBLASLt preferred"] = _host_us(
            launch_cost, device, cases["torch.mm qkv 196x1152x3456 (no bias)"], calls
        )
        torch.backends.cuda.preferred_blas_library(previous)
        if "gluon_attn 1x2116 wrapper (3 launches)" in cases:
            _slow_launches()
            call = cases["gluon_attn 1x2116 wrapper (3 launches)"]
            floors["gluon_attn 1x2116 wrapper, fast_launch off"] = _host_us(launch_cost, device, call, calls)
    return floors


# A block is 8 launches, so it repeats an eighth as often: 200 launches stay within the driver's launch
# queue (~1,000 entries), which, once full, holds the host until the device drains it.
_BLOCK_CASE = "one 8B block 1x196 (8 launches, its Python)"


def _host_us(launch_cost, device, call, calls: int) -> float:
    """Host microseconds a call of ``call``, ``calls`` of them enqueued behind a busy device."""

    def repeated():
        for _ in range(calls):
            call()

    return launch_cost.eager_cost(repeated, device, 3).host_ms * 1e3 / calls


def _slow_launches() -> None:
    """Send every Triton launch of this tree through ``JITFunction.run``, as with a launch hook set."""
    try:
        from rocm_vit.backends import fast_launch
    except ImportError:  # a tree from before fast_launch: every launch is slow already
        return
    fast_launch._hooks_set = lambda: True


_COLUMNS = (
    ("eager_ms", "eager ms", "{:.2f}"),
    ("host_ms", "host ms", "{:.2f}"),
    ("device_ms", "device ms", "{:.2f}"),
    ("kernels", "kernels", "{}"),
    ("standin_kernels", "of which aiter stand-in", "{}"),
    ("host_us_per_launch", "us/launch", "{:.1f}"),
    ("replay_ms", "replay ms", "{:.2f}"),
    ("check", "check", "{}"),
)


def format_comparison(reports: list[dict]) -> str:
    """Rows: mode and layout; columns: each measure as ``label1/label2/...`` in the order given."""
    labels = list(dict.fromkeys(report["label"] for report in reports))
    by_key = {(report["mode"], report["label"], row["layout"]): row for report in reports for row in report["rows"]}
    modes = list(dict.fromkeys(report["mode"] for report in reports))
    layouts = list(dict.fromkeys(row["layout"] for report in reports for row in report["rows"]))
    header = ["mode", "layout", "patches", *(f"{title} {'/'.join(labels)}" for _, title, _ in _COLUMNS)]
    lines = []
    for mode in modes:
        for layout in layouts:
            rows = [by_key.get((mode, label, layout)) for label in labels]
            if not any(rows):
                continue
            patches = next(row["patches"] for row in rows if row)
            cells = [mode, layout, str(patches)]
            for key, _, fmt in _COLUMNS:
                cells.append("/".join("-" if not row or row.get(key) is None else fmt.format(row[key]) for row in rows))
            lines.append(cells)
    widths = [max(len(line[i]) for line in [header, *lines]) for i in range(len(header))]
    devices = sorted({f"{report['device']} (torch {report['torch']}, triton {report['triton']})" for report in reports})
    return "\n".join(
        [
            f"eager cost per layout on {', '.join(devices)}; columns {'/'.join(labels)}",
            *(
                "  ".join(cell.rjust(width) for cell, width in zip(line, widths, strict=True))
                for line in [header, *lines]
            ),
        ]
    )


def _load_launch_cost():
    spec = importlib.util.spec_from_file_location("_launch_cost", _LAUNCH_COST)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass resolves annotations through it
    spec.loader.exec_module(module)
    return module


def _triton_version() -> str:
    try:
        import triton
    except ImportError:
        return "none"
    return triton.__version__


if __name__ == "__main__":
    sys.exit(main())
