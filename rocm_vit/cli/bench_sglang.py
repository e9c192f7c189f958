"""``rocm-vit bench-sglang``: SGLang's own Qwen3-VL tower with and without rocm-vit, side by side.

What a SGLang user compares before installing rocm-vit (``CONFIGS``): SGLang 0.5.23's
``Qwen3VLMoeVisionModel`` at a preset's sizes, random weights, bf16, eager, under SGLang's ViT graphs
and under the plugin; and rocm-vit's own tower on the same weights and attention kernel, which tells
how much of what is left is SGLang's block rather than the runner. Each configuration runs in a
process of its own (``bench_sglang_worker``: the plugin patches SGLang for the life of a process),
back to back on one GPU. Tables last (``--json``: one JSON object on stdout, the tables on stderr).

In a checkout the workers see tests/sglang_support: its ``sgl_kernel`` stand-in where the package is
missing (every call of it raises, so SGLang's own code runs or fails) and its CPU torchvision
stand-in. Without a GPU only the eager configuration runs, with ``sdpa``: plumbing, not a measurement.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import rocm_vit

# One call each: 1 x 224², 1 x 512², 4 x 512², one 1.3 MP image (1280 x 1024), 2048 x 1600,
# 6 x 640x360 in one call, a 4-frame 720p video (HxW, as rocm-vit bench writes layouts).
DEFAULT_LAYOUTS = "1x224,1x512,4x512,1x1024x1280,1x1600x2048,6x360x640,1x720x1280f4"
DEFAULT_CONFIGS = "abcd"
SLOWER_LIMIT = 1.02  # the plugin against SGLang's own graphs on a warm layout
OWN_LIMIT = 1.10  # SGLang's tower under the plugin against rocm-vit's own tower on a warm layout
_REPORT_MARGIN_S = 20  # a worker's stream stops this long before --worker-timeout
_FROM_SGLANG = "max_difference_from_sglang_eager"  # a plugin configuration's graphs against SGLang's eager


@dataclass(frozen=True)
class Configuration:
    """How one worker serves: SGLang's graph path or not, rocm-vit's plugin or not, the attention backend.

    ``twin``: for rocm-vit's own tower (``own``), the configuration of SGLang's tower it is timed
    against, whose process it repeats (plugin, attention kernel, environment).
    """

    label: str
    graphs: bool
    plugin: bool
    attention: str
    environ: dict[str, str] = field(default_factory=dict)
    stream: bool = True
    twin: str | None = None

    @property
    def own(self) -> bool:
        return self.twin is not None


CONFIGS: dict[str, Configuration] = {
    "a": Configuration("SGLang eager", graphs=False, plugin=False, attention="triton_attn"),
    "b": Configuration("SGLang graphs", graphs=True, plugin=False, attention="triton_attn"),
    "c": Configuration("rocm-vit", graphs=True, plugin=True, attention="triton_attn"),
    "d": Configuration(
        "rocm-vit, ROCm decisions",
        graphs=True,
        plugin=True,
        attention="aiter_attn",
        environ={"ROCM_VIT_EMULATE": "rocm", "SGLANG_USE_AITER": "1"},
        stream=False,
    ),
}
# The plugin keeping SGLang's blocks (ROCM_VIT_SGLANG_BLOCKS=sglang): what c was before the fused glue.
CONFIGS["s"] = dataclasses.replace(
    CONFIGS["c"], label="rocm-vit, SGLang's blocks", environ={"ROCM_VIT_SGLANG_BLOCKS": "sglang"}
)
# rocm-vit's own tower on SGLang's weights, each in its twin's process: SGLang's Triton kernel for c's
# triton_attn, the plugin's pick for d's aiter_attn slot; served as the plugin serves (padded buckets first).
CONFIGS["o"] = dataclasses.replace(CONFIGS["c"], label="rocm-vit's own tower", twin="c")
CONFIGS["r"] = dataclasses.replace(CONFIGS["d"], label="rocm-vit's own tower, ROCm decisions", twin="d")
# What a worker's environment never inherits: each configuration sets its own.
_CONTROLLED = (
    "SGLANG_VIT_ENABLE_CUDA_GRAPH",
    "ROCM_VIT_EMULATE",
    "SGLANG_USE_AITER",
    "ROCM_VIT_DISABLE",
    "ROCM_VIT_SGLANG_BLOCKS",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default="qwen3-vl-8b", help="the tower's sizes (default qwen3-vl-8b)")
    parser.add_argument(
        "--configs",
        default=None,
        help="which of a b c d s o r to run, in order (default abcd; s: c on SGLang's blocks; o, r: rocm-vit's "
        "tower); with --from-json, which of the saved ones to report and plot (default all)",
    )
    parser.add_argument("--layouts", default=DEFAULT_LAYOUTS, help="layout specs, as rocm-vit bench takes them")
    parser.add_argument("--warm", type=int, default=None, help="warm calls per layout (default 20; --quick 5)")
    parser.add_argument(
        "--calls", type=int, default=None, help="chat stream calls (default 1000; --quick 300; 0: none)"
    )
    parser.add_argument("--quick", action="store_true", help="fewer calls: 5 warm per layout, a 300-call stream")
    parser.add_argument("--seed", type=int, default=0, help="the chat stream's seed (bench-traffic's default)")
    parser.add_argument(
        "--stream-max-pixels", type=int, default=None, help="the stream's pixel cap per image (default 1.3 MP)"
    )
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda where a GPU is seen")
    parser.add_argument("--worker-timeout", type=int, default=600, help="seconds one configuration may take at most")
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds for every configuration together, shared by those left (a stream ends where its share does)",
    )
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="per layout, one eager forward's kernel time by class (as rocm-vit bench --breakdown) and kernels",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout; the tables go to stderr")
    parser.add_argument(
        "--save", type=Path, default=None, help="write the JSON report here after each configuration (kept if cut off)"
    )
    parser.add_argument(
        "--plot", type=Path, default=None, help="write warm latency against patches, one line a configuration, as a PNG"
    )
    parser.add_argument(
        "--from-json", type=Path, default=None, help="report (and --plot) a saved --json/--save report; runs nothing"
    )


def run(args: argparse.Namespace) -> int:
    if args.from_json is not None:
        return _report_saved(args)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    warm = args.warm if args.warm is not None else (5 if args.quick else 20)
    calls = args.calls if args.calls is not None else (300 if args.quick else 1000)
    keys = args.configs or DEFAULT_CONFIGS
    unknown = sorted(set(keys) - set(CONFIGS))
    if unknown:
        print(
            f"rocm-vit bench-sglang: unknown configurations {unknown}; choose from {sorted(CONFIGS)}", file=sys.stderr
        )
        return 2
    report: dict[str, Any] = {
        "preset": args.preset,
        "device": device,
        "layouts": args.layouts,
        "warm": warm,
        "stream_calls": calls,
        "seed": args.seed,
        "breakdown": args.breakdown,
        "rocm_vit": rocm_vit.__version__,
        "configs": {},
    }
    began = time.perf_counter()
    to_run = [key for key in keys if skip_reason(CONFIGS[key], device) is None]
    for key in keys:
        config = CONFIGS[key]
        print(f"== bench-sglang {key}: {config.label}", file=sys.stderr, flush=True)
        skipped = skip_reason(config, device)
        if skipped:
            report["configs"][key] = {"label": config.label, "skipped": skipped}
            continue
        started = time.perf_counter()
        left = to_run[to_run.index(key) :]
        timeout_s = worker_timeout(args.worker_timeout, args.budget, started - began, [CONFIGS[k] for k in left])
        result = _run_worker(key, config, device, args, warm, calls, timeout_s)
        result.update(label=config.label, wall_seconds=round(time.perf_counter() - started, 1))
        report["configs"][key] = result
        if args.save:
            args.save.write_text(json.dumps(report, indent=1))
    return _print_report(report, args)


def _report_saved(args: argparse.Namespace) -> int:
    try:
        report = json.loads(args.from_json.read_text())
    except (OSError, ValueError) as error:
        print(f"rocm-vit bench-sglang: --from-json {args.from_json}: {error}", file=sys.stderr)
        return 2
    if args.configs:  # a subset of the saved configurations, in the order named
        missing = sorted(set(args.configs) - set(report["configs"]))
        if missing:
            saved = "".join(report["configs"])
            print(
                f"rocm-vit bench-sglang: {args.from_json} holds no configuration {missing} (it has {saved})",
                file=sys.stderr,
            )
            return 2
        report["configs"] = {key: report["configs"][key] for key in args.configs}
    return _print_report(report, args)


def _print_report(report: dict[str, Any], args: argparse.Namespace) -> int:
    lines = format_report(report)
    if args.json:
        print("\n".join(lines), file=sys.stderr)
        print(json.dumps(report, indent=1))
    else:
        print("\n".join(lines))
    if args.plot is not None and not plot_report(report, args.plot):
        return 1
    failed = [key for key, result in report["configs"].items() if result.get("error") or result.get("import_error")]
    return 1 if failed else 0


def skip_reason(config: Configuration, device: str) -> str | None:
    """Why ``config`` cannot run on ``device``, or ``None``."""
    if device == "cpu" and config.graphs:
        return "needs a GPU: SGLang's and rocm-vit's ViT graphs are CUDA/HIP graphs"
    return None


def worker_timeout(limit_s: float, budget_s: float | None, spent_s: float, left: list[Configuration]) -> float:
    """Seconds the first of ``left`` may take: ``limit_s``, or under a budget its share of what is
    left of it, a configuration without a stream weighing half one with."""
    if budget_s is None:
        return limit_s
    weights = [1.0 if config.stream else 0.5 for config in left]
    share = (budget_s - spent_s) * weights[0] / sum(weights)
    return max(_REPORT_MARGIN_S + 10.0, min(limit_s, share))


def worker_command(
    key: str,
    config: Configuration,
    device: str,
    args: argparse.Namespace,
    warm: int,
    calls: int,
    out: Path,
    timeout_s: float,
) -> list[str]:
    """The worker's command line for one configuration (``sdpa`` on a CPU: SGLang's Triton needs a GPU)."""
    attention = config.attention if device == "cuda" else "sdpa"
    command = [sys.executable, "-m", "rocm_vit.cli.bench_sglang_worker", "--config", key, "--out", str(out)]
    command += ["--preset", args.preset, "--device", device, "--attention", attention]
    command += ["--dtype", "bfloat16" if device == "cuda" else "float32"]
    command += ["--layouts", args.layouts, "--warm", str(warm), "--seed", str(args.seed)]
    command += ["--stream-calls", str(calls if config.stream else 0)]
    # The stream stops in time for the report: start-up and the layouts take the rest.
    command += ["--stream-deadline", f"{timeout_s - _REPORT_MARGIN_S:.0f}"]
    if args.stream_max_pixels:
        command += ["--stream-max-pixels", str(args.stream_max_pixels)]
    command += ["--graphs"] if config.graphs else []
    command += ["--plugin"] if config.plugin else []
    command += ["--own"] if config.own else []
    command += ["--breakdown"] if args.breakdown else []
    support = _checkout_support()
    if support is not None:
        command += ["--path", str(support), "--sgl-kernel-standin", str(support / "sgl_kernel_standin")]
    return command


def worker_environ(config: Configuration) -> dict[str, str]:
    """This environment less what the configurations control, plus ``config``'s; the checkout first
    on ``PYTHONPATH`` so the worker runs this rocm-vit."""
    environ = {name: value for name, value in os.environ.items() if name not in _CONTROLLED}
    environ.update(config.environ)
    package_parent = str(Path(rocm_vit.__file__).resolve().parents[1])
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [package_parent, environ.get("PYTHONPATH")]))
    return environ


def _run_worker(
    key: str, config: Configuration, device: str, args: argparse.Namespace, warm: int, calls: int, timeout_s: float
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "report.json"
        command = worker_command(key, config, device, args, warm, calls, out, timeout_s)
        try:
            done = subprocess.run(command, env=worker_environ(config), timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            kept = json.loads(out.read_text()) if out.exists() else {}  # the layouts, where they were done
            return {**kept, "error": f"the worker ran past its {timeout_s:.0f} s (--worker-timeout, --budget)"}
        if not out.exists():
            return {"error": f"the worker exited {done.returncode} without a report (its stderr is above)"}
        return json.loads(out.read_text())


def _checkout_support() -> Path | None:
    """tests/sglang_support of the checkout this rocm-vit runs from; ``None`` for an installed wheel."""
    support = Path(rocm_vit.__file__).resolve().parents[1] / "tests" / "sglang_support"
    return support if (support / "sgl_kernel_standin" / "sgl_kernel").is_dir() else None


# The report ---------------------------------------------------------------------------------------


def format_report(report: dict[str, Any]) -> list[str]:
    """The lines ``run`` prints: what ran where, the layouts table, the stream table, then what failed."""
    from rocm_vit.workloads.workload import table_lines

    configs = report["configs"]
    ran = {key: result for key, result in configs.items() if "layouts" in result}
    lines = [f"rocm-vit bench-sglang: {report['preset']}, {report['device']}, rocm-vit {report['rocm_vit']}"]
    for key, result in configs.items():
        lines.append(f"  {key}: {result['label']}: {_config_line(result)}")
    if ran:
        lines += ["", "Layouts: warm median ms (first call ms, capture included)"]
        header, cells = layout_cells(ran)
        lines += table_lines(header, cells)
        lines += [f"  {line}" for line in layout_notes(ran)]
        lines += host_lines(ran)
    if any("breakdown" in row for result in ran.values() for row in result["layouts"]["rows"]):
        lines += ["", *breakdown_lines(ran)]
    streamed = {key: result for key, result in configs.items() if "stream" in result}
    if streamed:
        name = next(iter(streamed.values()))["stream"]["name"]
        lines += ["", f"Stream: {report['stream_calls']} calls of {name}, seed {report['seed']}"]
        header, cells = stream_cells(streamed)
        lines += [line.rstrip() for line in table_lines(header, cells)]
        lines += common_calls_lines(streamed)
    return lines


def common_calls_lines(streamed: dict[str, dict[str, Any]]) -> list[str]:
    """Where a stream stopped early: each configuration's mean and p90 over the calls every one of them
    served (the stream's first calls), from the per-call times, so that the columns compare the same calls."""
    from rocm_vit.workloads.traffic import latency_summary

    times = {key: result["stream"].get("times_ms") for key, result in streamed.items()}
    served = {len(calls) for calls in times.values() if calls is not None}
    if len(served) < 2 or None in times.values() or min(served) == 0:
        return []
    common = min(served)
    figures = []
    for key, calls in times.items():
        summary = latency_summary(calls[:common])
        figures.append(f"{key} {_ms(summary['mean_ms'])} / {_ms(summary['p90_ms'])}")
    return [f"  over the first {common} calls, which every configuration served (mean / p90 ms): " + ", ".join(figures)]


def host_lines(ran: dict[str, dict[str, Any]]) -> list[str]:
    """Per layout, each configuration's median host ms until a warm call returned (before its device
    work finished; a blocking copy inside the call, as SGLang's ``cu_seqlens.to(device)``, waits in it):
    the Python a replay costs around its graph, where wall and kernel time differ."""
    rows_by_key = {key: {row["layout"]: row for row in result["layouts"]["rows"]} for key, result in ran.items()}
    specs = dict.fromkeys(spec for rows in rows_by_key.values() for spec in rows)
    lines = []
    for spec in specs:
        figures = [
            f"{key} {_ms(rows[spec]['warm_host_ms'])}"
            for key, rows in rows_by_key.items()
            if rows.get(spec, {}).get("warm_host_ms") is not None
        ]
        if figures:
            lines.append(f"  {spec}: " + ", ".join(figures))
    return ["", "Host ms until a warm call returned (median):", *lines] if lines else []


def _config_line(result: dict[str, Any]) -> str:
    if "skipped" in result:
        return f"skipped: {result['skipped']}"
    problem = result.get("import_error") or result.get("error")
    if problem:
        missing = f" (missing module: {result['missing_module']})" if result.get("missing_module") else ""
        return f"FAILED: {problem}{missing}"
    parts = [result.get("backend", "?"), result.get("runner", "?").rsplit(".", 1)[-1]]
    parts.append(f"sgl_kernel {result.get('sgl_kernel', '?')}")
    if result.get("warm_up_seconds") is not None:
        parts.append(f"warm-up call {result['warm_up_seconds']:.1f} s")
    if result.get("wall_seconds") is not None:
        parts.append(f"worker {result['wall_seconds']} s")
    return ", ".join(parts)


def layout_cells(ran: dict[str, dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """One row per layout, one column per configuration, then on warm medians each plugin
    configuration against SGLang's graphs (b) and each twin against rocm-vit's own tower."""
    keys = list(ran)
    against_b = [key for key in keys if "b" in ran and _plugin_on_sglang(key)]
    twins = _twins(ran)
    header = ["layout", "patches", *(f"{key}: {ran[key]['label']}" for key in keys)]
    header += [f"{key}/b" for key in against_b]
    header += [f"{twin}/{own}" for twin, own in twins]
    rows_by_key = {key: {row["layout"]: row for row in ran[key]["layouts"]["rows"]} for key in keys}
    cells = []
    for spec, first in rows_by_key[keys[0]].items():
        line = [spec, str(first["patches"])]
        for key in keys:
            row = rows_by_key[key].get(spec)
            line.append("-" if row is None else f"{_ms(row['warm_ms'])} ({_ms(row['first_ms'])})")
        for key in against_b:
            line.append(_ratio(rows_by_key[key].get(spec), rows_by_key["b"].get(spec)))
        for twin, own in twins:
            line.append(_ratio(rows_by_key[twin].get(spec), rows_by_key[own].get(spec)))
        cells.append(line)
    return header, cells


def _plugin_on_sglang(key: str) -> bool:
    return key in CONFIGS and CONFIGS[key].plugin and not CONFIGS[key].own


def _twins(ran: dict[str, dict[str, Any]]) -> list[tuple[str, str]]:
    """``(twin, own)`` for each of rocm-vit's own towers that ran beside its twin."""
    return [(CONFIGS[key].twin, key) for key in ran if key in CONFIGS and CONFIGS[key].own and CONFIGS[key].twin in ran]


def layout_notes(ran: dict[str, dict[str, Any]]) -> list[str]:
    """Graph memory and bit-for-bit results per graph configuration; layouts where the plugin is
    slower than SGLang's own graphs past ``SLOWER_LIMIT``, or than rocm-vit's own tower past ``OWN_LIMIT``."""
    notes = []
    for key, result in ran.items():
        layouts = result["layouts"]
        rows = layouts["rows"]
        if not any("bitwise_equal" in row for row in rows):
            continue
        equal = sum(bool(row.get("bitwise_equal")) for row in rows)
        unequal = [
            f"{row['layout']} (max diff {row['max_difference']:.3g})" for row in rows if not row["bitwise_equal"]
        ]
        from_sglang = [row[_FROM_SGLANG] for row in rows if _FROM_SGLANG in row]
        held = _mib(layouts.get("graph_bytes"))
        note = f"{key}: graph == own eager on {equal}/{len(rows)} layouts"
        note += f"{': not ' + ', '.join(unequal) if unequal else ''}; {layouts.get('graphs')} graphs, {held} MiB held"
        start = layouts.get("start")
        if start and start.get("seconds") is not None:
            note += f" (of which {start['captured']} captured at start in {start['seconds']:.1f} s)"
        if from_sglang:
            note += f"; max diff from SGLang's eager forward {max(from_sglang):.3g}"
        notes.append(note)
    if "b" in ran:
        rows_b = {row["layout"]: row for row in ran["b"]["layouts"]["rows"]}
        for key in filter(_plugin_on_sglang, ran):
            notes += _slower_notes(key, ran[key]["layouts"]["rows"], "b", rows_b, SLOWER_LIMIT)
    for twin, own in _twins(ran):
        rows_own = {row["layout"]: row for row in ran[own]["layouts"]["rows"]}
        notes += _slower_notes(twin, ran[twin]["layouts"]["rows"], own, rows_own, OWN_LIMIT)
    return notes


def _slower_notes(
    key: str, rows: list[dict[str, Any]], base_key: str, base_rows: dict[str, dict[str, Any]], limit: float
) -> list[str]:
    notes = []
    for row in rows:
        base = base_rows.get(row["layout"])
        if base and row["warm_ms"] and base["warm_ms"] and row["warm_ms"] > limit * base["warm_ms"]:
            notes.append(
                f"{key} slower than {base_key} on {row['layout']}: {_ms(row['warm_ms'])} vs {_ms(base['warm_ms'])} ms"
            )
    return notes


def breakdown_lines(ran: dict[str, dict[str, Any]]) -> list[str]:
    """``rocm-vit bench --breakdown``'s table over every configuration's eager forward, layout by
    layout, then each twin less rocm-vit's own tower: where SGLang's block spends the difference."""
    from rocm_vit.cli.breakdown import KERNEL_CLASSES, format_breakdown

    by_key = {
        key: {row["layout"]: row for row in result["layouts"]["rows"] if "breakdown" in row}
        for key, result in ran.items()
    }
    twins = _twins(ran)
    rows = []
    for spec in dict.fromkeys(spec for rows_of_key in by_key.values() for spec in rows_of_key):
        rows += [
            {"layout": f"{spec} {key}", "breakdown": by_key[key][spec]["breakdown"]}
            for key in by_key
            if spec in by_key[key]
        ]
        for twin, own in twins:
            if spec in by_key[twin] and spec in by_key[own]:
                twin_breakdown, own_breakdown = by_key[twin][spec]["breakdown"], by_key[own][spec]["breakdown"]
                difference = {
                    name: twin_breakdown[name] - own_breakdown[name] for name in (*KERNEL_CLASSES, "total", "kernels")
                }
                rows.append({"layout": f"{spec} {twin}-{own}", "breakdown": difference})
    return format_breakdown(rows).splitlines()


def stream_cells(streamed: dict[str, dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """One row per configuration: latencies, captures and capture time inside calls, graph memory."""
    header = ["config", "mean ms", "p50", "p90", "p99", "captures in calls", "capturing s", "graph MiB", "note"]
    cells = []
    for key, result in streamed.items():
        stream = result["stream"]
        note = ""
        stopped = stream.get("stopped")
        if stopped:
            why = "out of memory" if stopped.get("out_of_memory") else stopped.get("error")
            note = f"stopped at call {stopped['at_call']} of {stream['calls']}: {why}"
            if stopped.get("reserved_bytes") is not None:
                note += f", {_mib(stopped['reserved_bytes'])} MiB reserved"
        start = stream.get("start")
        if start and start.get("captured") is not None:
            note = "; ".join(filter(None, [note, f"+{start['captured']} at start ({start['seconds']:.1f} s)"]))
        cells.append(
            [
                f"{key}: {result['label']}",
                *(_ms(stream.get(name)) for name in ("mean_ms", "p50_ms", "p90_ms", "p99_ms")),
                str(stream.get("captures_in_calls", stream.get("captures", "-"))),
                f"{stream.get('capture_seconds_in_calls') or 0.0:.1f}",
                _mib(stream.get("graph_bytes")),
                note,
            ]
        )
    return header, cells


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.0f}"


def _ratio(row: dict[str, Any] | None, base: dict[str, Any] | None) -> str:
    if not row or not base or not row.get("warm_ms") or not base.get("warm_ms"):
        return "-"
    return f"{row['warm_ms'] / base['warm_ms']:.3f}"


def plot_series(report: dict[str, Any]) -> dict[str, list[tuple[int, float]]]:
    """``{"key: label": [(patches, warm median ms), ...]}`` by patches, for each configuration that
    timed layouts: what ``--plot`` draws."""
    series = {}
    for key, result in report["configs"].items():
        rows = result.get("layouts", {}).get("rows", [])
        points = sorted((row["patches"], row["warm_ms"]) for row in rows if row.get("warm_ms"))
        if points:
            series[f"{key}: {result['label']}"] = points
    return series


def _layout_labels(report: dict[str, Any]) -> list[tuple[str, int, float]]:
    """``(layout, patches, lowest warm ms)`` for each layout any configuration timed."""
    lowest: dict[str, tuple[int, float]] = {}
    for result in report["configs"].values():
        for row in result.get("layouts", {}).get("rows", []):
            if row.get("warm_ms") and (row["layout"] not in lowest or row["warm_ms"] < lowest[row["layout"]][1]):
                lowest[row["layout"]] = (row["patches"], row["warm_ms"])
    return [(layout, patches, ms) for layout, (patches, ms) in lowest.items()]


def plot_report(report: dict[str, Any], path: Path) -> bool:
    """Warm latency against patches, log-log, one line a configuration, to ``path``; ``False`` (and
    why, on stderr) where nothing could be drawn."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        print("rocm-vit bench-sglang: --plot needs matplotlib (pip install rocm-vit[bench])", file=sys.stderr)
        return False
    series = plot_series(report)
    if not series:
        print("rocm-vit bench-sglang: --plot: no configuration timed a layout", file=sys.stderr)
        return False
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for label, points in series.items():
        axes.plot([p for p, _ in points], [ms for _, ms in points], marker="o", label=label)
    # Each layout named under its lowest point: at about the same patches, one image and six differ
    # (attention within each image), which the line alone would not say.
    for layout, patches, ms in _layout_labels(report):
        axes.annotate(layout, (patches, ms), textcoords="offset points", xytext=(0, -12), ha="center", fontsize=6)
    device = next((r["device_name"] for r in report["configs"].values() if r.get("device_name")), report["device"])
    title = f"SGLang's {report['preset']} tower, warm calls, {device}"
    axes.set(xscale="log", yscale="log", xlabel="patches per call", ylabel="latency (ms, median)", title=title)
    for axis in (axes.xaxis, axes.yaxis):  # plain numbers, not powers of ten
        axis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    print(f"rocm-vit bench-sglang: plot written to {path}", file=sys.stderr)
    return True
