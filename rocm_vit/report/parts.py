"""The parts of ``rocm-vit report``: which commands run, with which options, and how each one runs.

Invariant: each part runs in a process of its own with a time limit, so a crash or hang ends that part
only; logs in ``logs/``. Limits below are hang ceilings, not estimates.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import rocm_vit
from rocm_vit.report.hazards import HAZARDS

OK = "ok"
FAILED = "failed"
TIMED_OUT = "timed_out"
SKIPPED = "skipped"

# bench-attn layouts: one image of each size class, a batch, a ragged batch and a 1080p screenshot.
ATTENTION_LAYOUTS = "1x1024,1x4096,4x1024,16x256,ragged16,1x8160,1x16384"
QUICK_ATTENTION_LAYOUTS = "1x1024,4x1024,1x8160"
# bench-traffic --mode tower: chat where graphs pay on some calls, a repeated launch-bound call, and a
# device-bound one that must not get slower (400 chat calls, 100 of each other stream).
ADMISSION_STREAMS = ("chat, 1.3 MP cap", "6 x 640x360 per call", "1 x 1080p per call")
_STDERR_TAIL_LINES = 15


@dataclass(frozen=True)
class Part:
    """One command of the report; ``output``: ``json`` (stdout or its last line), ``text`` or ``json_file``."""

    key: str
    title: str
    argv: tuple[str, ...]
    timeout_s: float
    needs_gpu: bool = False
    output: str = "json"
    ok_exit_codes: tuple[int, ...] = (0,)


@dataclass
class PartResult:
    """How a part ended (``ok``, ``failed``, ``timed_out``, ``skipped``), its data, ``detail`` and logs."""

    status: str
    seconds: float = 0.0
    detail: str = ""
    data: Any = None
    exit_code: int | None = None
    logs: dict[str, str] = field(default_factory=dict)


def plan(
    preset_name: str,
    quick: bool,
    on_gpu: bool,
    head_dim: int,
    heads: int,
    profile_out: Path | None,
    plots: bool,
) -> list[Part]:
    """The parts in run order: ``tune`` first (the rest run under its policy), correctness, then timings."""
    preset_args = ("--preset", preset_name)
    parts: list[Part] = []
    if not quick:
        tune = ["-m", "rocm_vit", "tune", *preset_args]
        tune += ["--out", str(profile_out)] if profile_out else []
        tune += ["--plot", "tune.png"] if plots else []
        parts.append(Part("tune", "tune", tuple(tune), 420, needs_gpu=True, output="text"))
    parts.append(Part("doctor", "doctor", ("-m", "rocm_vit", "doctor", "--json"), 120))
    for name in HAZARDS:
        argv = ("-m", "rocm_vit.cli.hazard_check", name, *preset_args, *(("--quick",) if quick else ()))
        parts.append(Part(f"hazard_{name}", f"hazard: {name}", argv, 120 if quick else 240, name != "aiter_kernels"))
    layouts, max_side = ("4", "512") if quick else ("16", "1024")
    for grad_mode in ("inference", "no_grad"):
        argv = ("-m", "rocm_vit", "verify", *preset_args, "--grad-mode", grad_mode, "--layouts", layouts)
        argv += ("--max-side", max_side, "--json")
        parts.append(Part(f"verify_{grad_mode}", f"verify ({grad_mode})", argv, 120 if quick else 300, True))
    sweep = ("small" if quick else "default") if on_gpu else "tiny"
    repeats = ("3" if quick else "10") if on_gpu else "1"
    bench = ["-m", "rocm_vit", "bench", *preset_args, "--layouts", sweep, "--repeats", repeats, "--json"]
    bench += ["--plot", "bench.png"] if plots else []
    parts.append(Part("bench", "bench", tuple(bench), 120 if quick else 300))
    bench_attn = ("-m", "rocm_vit", "bench-attn", "--head-dims", str(head_dim), "--heads", str(heads))
    bench_attn += ("--layouts", QUICK_ATTENTION_LAYOUTS if quick else ATTENTION_LAYOUTS)
    bench_attn += ("--rep-ms", "10" if quick else "25", "--json", "bench_attn.json")
    parts.append(Part("bench_attn", "bench-attn", bench_attn, 120 if quick else 300, True, "json_file"))
    if not quick:
        memory = ["-m", "rocm_vit", "bench-memory", *preset_args, "--scenario", "mixed", "--calls", "600", "--json"]
        memory += ["--plot", "memory.png"] if plots else []
        # Exit status 1: a target missed, which its table (in the report) shows.
        parts.append(Part("graph_memory", "bench-memory (mixed)", tuple(memory), 300, True, ok_exit_codes=(0, 1)))
        admission = ["-m", "rocm_vit", "bench-traffic", "--mode", "tower", *preset_args, "--calls", "400"]
        admission += [
            "--oracle-calls",
            "40",
            "--json",
            *(arg for name in ADMISSION_STREAMS for arg in ("--stream", name)),
        ]
        parts.append(Part("graph_admission", "bench-traffic (tower)", tuple(admission), 600, True))
    return parts


def run_part(part: Part, folder: Path, on_gpu: bool) -> PartResult:
    """Run ``part`` in ``folder``, logs in ``folder/logs``; never raises for anything the part does."""
    if part.needs_gpu and not on_gpu:
        return PartResult(SKIPPED, detail="no GPU: torch.cuda.is_available() is False")
    logs_dir = folder / "logs"
    logs_dir.mkdir(exist_ok=True)
    logs = {stream: f"logs/{part.key}.{stream}.txt" for stream in ("stdout", "stderr")}
    started = time.perf_counter()
    with open(folder / logs["stdout"], "w") as stdout, open(folder / logs["stderr"], "w") as stderr:
        process = subprocess.Popen(
            [sys.executable, *part.argv],
            cwd=folder,
            env=_child_environment(),
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,  # a timeout ends the part's whole process group (compile workers)
        )
        try:
            exit_code = process.wait(timeout=part.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            exit_code = None
    seconds = round(time.perf_counter() - started, 1)
    text = (folder / logs["stdout"]).read_text(errors="replace")
    if exit_code is None:
        tail = _tail(folder / logs["stderr"])
        return PartResult(TIMED_OUT, seconds, f"stopped after {part.timeout_s:.0f} s{tail}", None, None, logs)
    data = _parse(part, text, folder)
    if exit_code in part.ok_exit_codes and data is not None:
        return PartResult(OK, seconds, "", data, exit_code, logs)
    how = f"killed by signal {-exit_code}" if exit_code < 0 else f"exit status {exit_code}"
    if data is None and part.output != "text":
        how += ", no result printed"
    return PartResult(FAILED, seconds, how + _tail(folder / logs["stderr"]), data, exit_code, logs)


def _parse(part: Part, stdout: str, folder: Path) -> Any:
    if part.output == "text":
        return stdout
    if part.output == "json_file":
        path = folder / f"{part.key}.json"
        return json.loads(path.read_text()) if path.is_file() else None
    for candidate in (stdout, *reversed(stdout.strip().splitlines()[-1:])):
        try:
            return json.loads(candidate)
        except ValueError:
            continue
    return None


def _child_environment() -> dict[str, str]:
    """This environment with this rocm-vit first on the path and progress bars off."""
    env = dict(os.environ)
    source_root = str(Path(rocm_vit.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (source_root, env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env["TQDM_DISABLE"] = "1"
    return env


def _kill_group(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _tail(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return ("; stderr ends with:\n" + "\n".join(lines[-_STDERR_TAIL_LINES:])) if lines else ""
