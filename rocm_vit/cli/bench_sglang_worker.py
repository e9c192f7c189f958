"""One configuration of ``rocm-vit bench-sglang`` in a process of its own; writes one JSON report.

A process of its own: the plugin patches SGLang for the life of a process, and SGLang reads its
environment (``SGLANG_VIT_ENABLE_CUDA_GRAPH``, ``ROCM_VIT_EMULATE``, ``SGLANG_USE_AITER``) as it
imports, so the parent sets it per configuration. Every call goes through a tower's ``forward``, as
a server's would: SGLang's tower (graphs off, SGLang's runner, or the plugin's adapter), or with
``--own`` rocm-vit's own tower on SGLang's weights and attention kernel, which tells the cost of
SGLang's block from that of the runner. One eager call of a layout no phase uses comes first, so what
a process compiles once is charged to no layout. Per layout: first call, warm median, graphs against
their own eager bit for bit, the graph memory held, with ``--breakdown`` one eager forward's kernels
by class. A stream's calls are timed alone; a failure (out of memory, most likely) ends it, recorded.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import importlib.util
import json
import logging
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

GRAPHS_ENV = "SGLANG_VIT_ENABLE_CUDA_GRAPH"
_STARTED = time.monotonic()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", required=True, help="a key of bench_sglang.CONFIGS")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--preset", default="qwen3-vl-8b")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--attention", required=True, help="SGLang's --mm-attention-backend")
    parser.add_argument("--graphs", action="store_true", help="serve through SGLang's graph path")
    parser.add_argument("--plugin", action="store_true", help="load rocm-vit's SGLang plugin first")
    parser.add_argument("--own", action="store_true", help="time rocm-vit's own tower on the SGLang tower's weights")
    parser.add_argument("--breakdown", action="store_true", help="profile one eager forward's kernels per layout")
    parser.add_argument("--layouts", default="", help="bench layout specs (rocm_vit.workloads.workload)")
    parser.add_argument("--warm", type=int, default=20, help="warm calls per layout")
    parser.add_argument("--stream-calls", type=int, default=0, help="calls of the chat stream (0: none)")
    parser.add_argument("--stream-max-pixels", type=int, default=None, help="pixel cap per image (default 1.3 MP)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sgl-kernel-standin", type=Path, help="put this on sys.path where sgl_kernel is missing")
    parser.add_argument("--path", type=Path, action="append", default=[], help="append to sys.path")
    parser.add_argument("--stream-deadline", type=float, default=None, help="seconds after start the stream stops")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    report: dict[str, Any] = {"config": args.config}
    try:
        _measure(args, report)
    except Exception as error:  # the parent prints it in the table and goes on with the next configuration
        report["error"] = f"{type(error).__name__}: {error}"
        report["traceback"] = traceback.format_exc()[-6000:]
        if isinstance(error, ModuleNotFoundError):
            report["missing_module"] = error.name
    _write(args.out, report)
    return 0


def _write(path: Path, report: dict[str, Any]) -> None:
    """The report, replaced whole (the parent may kill this process between two writes)."""
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(report, indent=1))
    partial.replace(path)


def _measure(args: argparse.Namespace, report: dict[str, Any]) -> None:
    import torch

    sys.path.extend(str(path) for path in args.path)  # after every installed package
    report["sgl_kernel"] = _sgl_kernel(args.sgl_kernel_standin, torch)
    from rocm_vit.integrations.sglang import standalone

    try:
        standalone.import_tower_module()
    except ImportError as error:
        report["import_error"] = f"{type(error).__name__}: {error}"
        report["missing_module"] = getattr(error, "name", None)
        return

    from rocm_vit.tower_config import preset
    from rocm_vit.workloads.traffic import OPERATOR_CAP_PIXELS, chat_stream
    from rocm_vit.workloads.workload import parse_layouts

    config = preset(args.preset)
    device = torch.device(args.device)
    standalone.init_world(args.device)
    if args.plugin:
        report["plugin_by_entry_point"] = standalone.load_plugin()
    os.environ[GRAPHS_ENV] = "1" if args.graphs else "0"  # as the server was started
    tower = standalone.build_tower(config, args.device, getattr(torch, args.dtype), args.attention)
    report["device_name"] = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    report["torch"] = torch.__version__
    if args.own:
        from rocm_vit.graphs import ViTGraphRunner
        from rocm_vit.integrations.sglang.own_tower import own_tower

        own = own_tower(tower, config, args.attention)
        report["backend"] = own.attention.name
        report["runner"] = standalone.qualified_name(ViTGraphRunner) if args.graphs else "none (eager)"
        bench: _Bench = _OwnBench(own, tower, device, _patch_width(config), args.graphs)
    else:
        report["backend"] = tower.blocks[0].attn.qkv_backend_name
        report["runner"] = standalone.qualified_name(tower.graph_runners)
        bench = _Bench(tower, device, _patch_width(config), args.graphs, args.plugin)
    report["warm_up_seconds"] = bench.warm_up()
    if args.layouts:
        workloads = parse_layouts(args.layouts, config)
        layouts = [(w.spec, w.grid_thw) for w in workloads]
        report["layouts"] = bench.layouts(layouts, args.warm, args.seed, args.breakdown)
        _write(args.out, report)  # kept if the stream runs past the parent's timeout
    if args.stream_calls:
        stream = chat_stream(args.stream_calls, args.seed, args.stream_max_pixels or OPERATOR_CAP_PIXELS)
        deadline = None if args.stream_deadline is None else _STARTED + args.stream_deadline
        report["stream"] = {"name": stream.name, **bench.stream(stream.calls, args.seed, deadline)}


def _sgl_kernel(standin: Path | None, torch: Any) -> str:
    """Whether SGLang gets the real ``sgl_kernel``, the test stand-in, or none (a CPU torch needs none)."""
    if importlib.util.find_spec("sgl_kernel") is not None:
        return "installed"
    if standin is not None and torch.version.cuda:
        sys.path.append(str(standin))
        return f"stand-in ({standin})"
    return "absent"


class _Bench:
    """Times one tower's calls through SGLang's ``forward``, graphs on or off per call."""

    def __init__(self, tower: Any, device: Any, patch_width: int, graphs: bool, plugin: bool) -> None:
        import torch

        self.torch = torch
        self.tower, self.device, self.patch_width, self.graphs, self.plugin = tower, device, patch_width, graphs, plugin
        self.sglang_tower = tower  # what "max difference from SGLang's eager forward" runs
        self.rocm_vit_runner = plugin  # whose graphs: rocm-vit's runner, or SGLang's
        self.capture_seconds = 0.0  # SGLang's runner: its create_graph, timed here
        self.start: dict[str, Any] = {}

    # Phases ---------------------------------------------------------------------------------------

    def warm_up(self) -> float:
        """One eager call of a layout no phase uses, before any is timed: what a process compiles
        once (SGLang's torch.compile'd rotary, Triton's kernels) is left out of every first call.
        Returns its seconds, which the report shows."""
        grid = ((1, 4, 4),)
        with _environ(**{GRAPHS_ENV: "0"}):
            return self._timed(self._pixels(grid, self._generator(1 << 20)), grid)[0] / 1e3

    def layouts(
        self, layouts: list[tuple[str, tuple]], warm: int, seed: int, breakdown: bool = False
    ) -> dict[str, Any]:
        inputs = [(spec, grid, self._pixels(grid, self._generator(seed + i))) for i, (spec, grid) in enumerate(layouts)]
        base = self._fresh_runner()
        rows = []
        for spec, grid, pixels in _progress(inputs, "layouts"):
            first_ms, output, _ = self._timed(pixels, grid)
            kept = output.cpu()  # off the device: the memory held after the layouts is the runner's
            del output
            warm_ms, host_ms = [], []
            for _ in range(warm):
                wall, _, host = self._timed(pixels, grid)
                warm_ms.append(wall)
                host_ms.append(host)
            rows.append(
                {
                    "layout": spec,
                    "patches": sum(t * h * w for t, h, w in grid),
                    "first_ms": first_ms,
                    "warm_ms": statistics.median(warm_ms) if warm_ms else None,
                    "warm_host_ms": statistics.median(host_ms) if host_ms else None,
                    "output": kept,
                }
            )
        result: dict[str, Any] = {"graph_bytes": self._held_since(base), **self._runner_counts()}
        for row, (_, grid, pixels) in zip(rows, inputs, strict=True):
            if self.graphs:
                reference = self._own_eager(pixels, grid).cpu()
                row["bitwise_equal"] = bool(self.torch.equal(row["output"], reference))
                row["max_difference"] = _max_difference(row["output"], reference)
            if self.rocm_vit_runner:  # and how far rocm-vit's serving is from SGLang's own eager forward
                with _environ(**{GRAPHS_ENV: "0"}):
                    sglang_eager = self._timed(pixels, grid, self.sglang_tower)[1].cpu()
                row["max_difference_from_sglang_eager"] = _max_difference(row["output"], sglang_eager)
            del row["output"]
            if breakdown:
                row["breakdown"] = self._breakdown(pixels, grid)
        result["rows"] = rows
        return result

    def stream(self, calls: tuple[tuple, ...], seed: int, deadline: float | None = None) -> dict[str, Any]:
        """The calls one after another; stops at ``deadline`` (``time.monotonic()``), recorded."""
        base = self._fresh_runner()
        times: list[float] = []
        result: dict[str, Any] = {"calls": len(calls)}
        generator = self._generator(seed)
        try:
            for grid in _progress(list(calls), "stream"):
                if deadline is not None and time.monotonic() > deadline:
                    result["stopped"] = {"at_call": len(times), "error": "time budget (--worker-timeout) spent"}
                    break
                times.append(self._timed(self._pixels(grid, generator), grid)[0])
        except Exception as error:  # out of memory, most likely: a server's request would fail here
            out_of_memory = isinstance(error, self.torch.OutOfMemoryError) or "out of memory" in str(error)
            result["stopped"] = {
                "at_call": len(times),
                "out_of_memory": out_of_memory,
                "error": f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}",
                "reserved_bytes": self.torch.cuda.memory_reserved(self.device) if self.device.type == "cuda" else None,
            }
            logger.warning("the stream stopped at call %d: %s", len(times), error)
        from rocm_vit.workloads.traffic import latency_summary

        result["served"] = len(times)
        result["times_ms"] = [round(ms, 3) for ms in times]  # for figures over the calls every configuration served
        if times:
            result.update(latency_summary(times))
        try:
            result["graph_bytes"] = self._held_since(base)
            result.update(self._runner_counts())
        except Exception as error:  # a device left unusable by the failure above
            result["counts_error"] = f"{type(error).__name__}: {error}"
        return result

    # One call -------------------------------------------------------------------------------------

    def _timed(self, pixels: Any, grid: tuple, forward: Callable[..., Any] | None = None) -> tuple[float, Any, float]:
        """Wall ms of one call of ``forward`` (the tower's), the device idle before and after, under
        ``inference_mode`` as SGLang's scheduler serves requests (its ``DynamicGradMode``); its output;
        and the host ms until the call returned, before the device finished (a replay's host work)."""
        grid_thw = self.torch.tensor(grid, dtype=self.torch.int32)
        self._synchronize()
        started = time.perf_counter()
        with self.torch.inference_mode():
            output = (forward or self.tower)(pixels, grid_thw)
        returned = time.perf_counter()
        self._synchronize()
        return (time.perf_counter() - started) * 1e3, output, (returned - started) * 1e3

    def _own_eager(self, pixels: Any, grid: tuple) -> Any:
        """What the graph path is held to: its eager twin (``_eager_path``)."""
        with self._eager_path() as forward:
            return self._timed(pixels, grid, forward)[1]

    def _breakdown(self, pixels: Any, grid: tuple) -> dict[str, float]:
        """Device time by kernel class and kernels of one eager forward with the graph path's kernels."""
        from rocm_vit.cli.breakdown import kernel_breakdown

        grid_thw = self.torch.tensor(grid, dtype=self.torch.int32)
        with self._eager_path() as forward, self.torch.inference_mode():
            return kernel_breakdown(lambda: forward(pixels, grid_thw), self.device)

    @contextlib.contextmanager
    def _eager_path(self) -> Iterator[Callable[..., Any]]:
        """The tower's eager forward with the kernels its graphs run: SGLang's eager ``forward``
        where SGLang's runner serves; where rocm-vit's does, its runner with no graphs (capacity 0),
        padded as its graphs are."""
        if not self.plugin:
            with _environ(**{GRAPHS_ENV: "0"}):
                yield self.tower
            return
        runner = self.tower.graph_runners
        with _environ(SGLANG_VIT_CUDA_GRAPH_CACHE_CAPACITY="0", SGLANG_VIT_CUDA_GRAPH_CAPTURE_BUCKETS="0"):
            self.tower.graph_runners = type(runner)(self.tower)
        try:
            yield self.tower
        finally:
            self.tower.graph_runners = runner

    def _generator(self, seed: int) -> Any:
        return self.torch.Generator(device=self.device).manual_seed(seed)

    def _pixels(self, grid: tuple, generator: Any) -> Any:
        """Random patches for ``grid``, made on the device from ``generator`` (the same in every configuration)."""
        patches = sum(t * h * w for t, h, w in grid)
        return self.torch.randn(
            patches, self.patch_width, generator=generator, device=self.device, dtype=self.tower.dtype
        )

    # Runners and memory ---------------------------------------------------------------------------

    def _fresh_runner(self) -> int | None:
        """New runners of the tower's kind, as a server starts (rocm-vit's captures its padded buckets
        then, timed as ``start_seconds``); returns the reserved bytes before any graph of them."""
        runner_class = type(self.tower.graph_runners)  # rocm-vit's adapter where the plugin is loaded
        self.tower.graph_runners = None
        gc.collect()
        base = self._reserved()
        self.tower.graph_runners = fresh = runner_class(self.tower)
        self.capture_seconds = 0.0
        self.start = {}
        if self.plugin and self.graphs:
            from torch import nn

            from rocm_vit.integrations.sglang.startup import capture_vit_buckets

            self._synchronize()
            started = time.perf_counter()
            with self.torch.no_grad():  # as SGLang's scheduler runs init_cuda_graphs, where the hook runs
                self.start["captured"] = capture_vit_buckets(nn.ModuleDict({"visual": self.tower}))
            self._synchronize()
            self.start["seconds"] = time.perf_counter() - started
            self.start["stats"] = fresh.stats()
        elif self.graphs:
            self._time_sglang_captures(fresh)
        return base

    def _time_sglang_captures(self, runner: Any) -> None:
        create_graph = runner.create_graph

        def timed(*args: Any, **kwargs: Any) -> Any:
            self._synchronize()
            started = time.perf_counter()
            try:
                return create_graph(*args, **kwargs)
            finally:
                self._synchronize()
                self.capture_seconds += time.perf_counter() - started

        runner.create_graph = timed

    def _runner_counts(self) -> dict[str, Any]:
        if not self.graphs:
            return {"graphs": 0, "captures": 0, "capture_seconds": 0.0}
        if self.rocm_vit_runner:
            stats = self._runner_stats()
            counts = {key: stats.get(key) for key in ("graphs", "captures", "replays", "capture_seconds")}
            counts["eager_runs"] = stats.get("eager_runs")
            counts["plugin_bytes_held"] = stats.get("bytes_held")
            counts["budget_bytes"] = stats.get("budget_bytes")
            counts["failures"], counts["stopped"] = stats.get("failures"), stats.get("stopped")
            start = self.start.get("stats", {})
            counts["start"] = {"captured": self.start.get("captured"), "seconds": self.start.get("seconds")}
            counts["captures_in_calls"] = (stats.get("captures") or 0) - (start.get("captures") or 0)
            counts["capture_seconds_in_calls"] = (stats.get("capture_seconds") or 0.0) - (
                start.get("capture_seconds") or 0.0
            )
            return counts
        graphs = len(self.tower.graph_runners.block_graphs)
        return {
            "graphs": graphs,
            "captures": graphs,
            "capture_seconds": self.capture_seconds,
            "captures_in_calls": graphs,
            "capture_seconds_in_calls": self.capture_seconds,
        }

    def _runner_stats(self) -> dict[str, Any]:
        return self.tower.graph_runners.stats()

    def _held_since(self, base: int | None) -> int | None:
        reserved = self._reserved()
        return None if base is None or reserved is None else reserved - base

    def _reserved(self) -> int | None:
        if self.device.type != "cuda":
            return None
        self._synchronize()
        self.torch.cuda.empty_cache()
        return self.torch.cuda.memory_reserved(self.device)

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)


class _OwnBench(_Bench):
    """Times rocm-vit's own tower as the plugin serves SGLang's: its runner at the serving defaults,
    the padded buckets captured before the first call; ``sglang_tower`` (same weights) is the reference."""

    def __init__(self, tower: Any, sglang_tower: Any, device: Any, patch_width: int, graphs: bool) -> None:
        super().__init__(tower, device, patch_width, graphs, plugin=False)
        self.sglang_tower = sglang_tower
        self.rocm_vit_runner = True

    def _fresh_runner(self) -> int | None:
        self.tower.disable_graphs()
        gc.collect()
        base = self._reserved()
        self.capture_seconds = 0.0
        self.start = {}
        if self.graphs:
            runner = self.tower.enable_graphs()
            self._synchronize()
            started = time.perf_counter()
            with self.torch.no_grad():  # as the plugin captures at a server's start
                self.start["captured"] = self.tower.capture_padded_buckets()
            self._synchronize()
            self.start["seconds"] = time.perf_counter() - started
            self.start["stats"] = runner.stats()
        return base

    @contextlib.contextmanager
    def _eager_path(self) -> Iterator[Callable[..., Any]]:
        yield functools.partial(self.tower, use_graphs=False)

    def _runner_stats(self) -> dict[str, Any]:
        return self.tower.graph_runner.stats()


def _max_difference(left: Any, right: Any) -> float:
    return float((left.float() - right.float()).abs().max())


def _patch_width(config: Any) -> int:
    return config.in_channels * config.temporal_patch_size * config.patch_size**2


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    """The process environment with ``values`` set, restored after."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


def _progress(items: list, desc: str) -> Any:
    from rocm_vit.workloads.workload import progress

    return progress(items, desc, "call")


if __name__ == "__main__":
    sys.exit(main())
