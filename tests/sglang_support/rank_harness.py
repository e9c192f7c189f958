"""What a run of SGLang ranks needs whatever the device: their environment, spawning them under a
deadline, the calls they share, the failures injected on one of them, and the comparison of what
each saw.

Used by the CPU ranks (gloo, stand-in graphs: tests/test_sglang_parallel.py) and the GPU ranks (NCCL,
real CUDA graphs: tests/gpu/test_sglang_ranks_gpu.py), through ``parallel.py``. Imports no torch, so
that a spawned rank starts in a fraction of a second where it needs none (tests/test_rank_harness.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import random
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from env_vars import set_env  # tests/, on the path of every importer (pytest's rootdir, the scripts')

# NVLink multicast (NVLS) off in every rank, whatever the device: NCCL's NVLS algorithms, torch's
# symmetric memory and NVSHMEM each create multicast objects (cuMulticastCreate) where it is on, and
# the shared GPU machines these tests run on must never have one made.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# rocm-vit's settings for the ranks: a layout is captured from its first call, small graphs, no padding.
SERVING_SETTINGS = {
    "ROCM_VIT_PROFILE": "off",
    "SGLANG_VIT_CUDA_GRAPH_MIN_HITS": "1",
    "SGLANG_VIT_CUDA_GRAPH_MAX_TOKENS": "256",
    "SGLANG_VIT_CUDA_GRAPH_PADDING": "0",
}
# The episodes compare the runner with SGLang's eager forward bit for bit. On a GPU rocm-vit's fused
# glue differs from SGLang's blocks in the last bits (docs/numerics.md), so GPU ranks keep SGLang's
# blocks; on a CPU's plain ops the fused glue is SGLang's blocks bit for bit, and CPU ranks run it.
_GPU_ONLY = {"ROCM_VIT_SGLANG_BLOCKS": "sglang"}
_CPU_ONLY = {
    "TORCHDYNAMO_DISABLE": "1",  # SGLang's eager rotary is torch.compile'd: minutes of C++ on a CPU
    "CUDA_VISIBLE_DEVICES": "",
    "HIP_VISIBLE_DEVICES": "",
    "GLOO_SOCKET_IFNAME": "lo",
}
# Injected on the last rank, each before anything of its step ran there: the arguments of the test
# graph mechanisms (StandInGraphs on a CPU, injected_failures.InjectedFailures on a GPU).
FAILURES = {
    "warm_up": {"fail_warm_ups": 1},
    "capture": {"fail_captures": 1},
    "verification": {"corrupt_captures": 1},
    "first_replay": {"fail_replays": 1},
    "serving_replay": {"fail_later_replays": 1},
}


def rank_environment(device: str) -> dict[str, str]:
    """The variables every spawned rank of ``device`` ("cpu" or "cuda") runs under: multicast off,
    rocm-vit's settings, and on a CPU no device visible (a GPU rank sees every device and picks its own)."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r} is neither 'cpu' nor 'cuda'")
    return {**MULTICAST_OFF, **SERVING_SETTINGS, **(_CPU_ONLY if device == "cpu" else _GPU_ONLY)}


def failing_rank_arguments(step: str | None, rank: int, world_size: int) -> dict[str, int]:
    """The graph mechanism's failure arguments on ``rank`` for a failure at ``step`` (``FAILURES``,
    or ``None`` for none): the last rank fails, the others run as they would."""
    if step is not None and step not in FAILURES:
        raise ValueError(f"no failure step {step!r}: one of {list(FAILURES)}")
    return dict(FAILURES[step]) if step is not None and rank == world_size - 1 else {}


class RanksFailed(RuntimeError):
    """A rank raised, or exited without a report."""


class RanksHung(RuntimeError):
    """Ranks were still running at the deadline (killed): a hang."""


@dataclasses.dataclass(frozen=True)
class Ranks:
    """Ranks started by ``start_ranks``: ``processes[rank]`` runs ``target``, which writes a traceback
    to ``errors_dir`` where it raises."""

    target: str
    processes: list[Any]
    errors_dir: Path


def spawn_ranks(
    target: Callable[..., None],
    args: tuple,
    nprocs: int,
    deadline_s: float,
    environment: dict[str, str],
    errors_dir: Path,
    preload: Sequence[str] = (),
) -> None:
    """``target(rank, *args)`` in ``nprocs`` spawned processes under ``environment`` (``start_ranks``);
    returns once all exit, else ends them at ``deadline_s`` (``end_ranks``)."""
    end_ranks(start_ranks(target, args, nprocs, environment, errors_dir, preload), deadline_s)


def start_ranks(
    target: Callable[..., None],
    args: tuple,
    nprocs: int,
    environment: dict[str, str],
    errors_dir: Path,
    preload: Sequence[str] = (),
) -> Ranks:
    """The started processes of ``target(rank, *args)`` for each rank of ``nprocs``, ``environment``
    set before each starts (NCCL and torch read it at their first import); a rank that raises writes
    its traceback to ``errors_dir``.

    ``preload``: modules imported once, by a fork server that then forks each rank (``forkserver``
    start method), instead of by every fresh rank: on a CPU a rank's start is mostly SGLang's
    imports. The server starts at the first such call, under ``environment``, and serves every later
    one: those must pass the same ``preload`` and ``environment`` (else ``ValueError``). Name only
    modules a rank would import before anything it tests (a module imported before a hook that
    waits for it would meet the hook differently)."""
    errors_dir.mkdir(parents=True, exist_ok=True)
    context = _fork_server_context(tuple(preload), environment) if preload else multiprocessing.get_context("spawn")
    with set_env(environment):
        processes = [
            context.Process(target=_rank_main, args=(target, rank, args, str(errors_dir)), daemon=False)
            for rank in range(nprocs)
        ]
        for process in processes:
            process.start()
    return Ranks(getattr(target, "__name__", repr(target)), processes, errors_dir)


def end_ranks(ranks: Ranks, deadline_s: float) -> None:
    """Waits up to ``deadline_s`` from now for every rank to exit.

    Raises ``RanksHung`` naming the ranks still running then (every one of them killed), else
    ``RanksFailed`` with each failed rank's traceback."""
    processes, nprocs = ranks.processes, len(ranks.processes)
    deadline = time.monotonic() + deadline_s
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    running = [rank for rank, process in enumerate(processes) if process.is_alive()]
    for rank in running:
        processes[rank].kill()
        processes[rank].join()
    if running:
        raise RanksHung(
            f"{ranks.target}: ranks {running} of {nprocs} still running after {deadline_s} s (a hang); killed"
        )
    failed = {rank: process.exitcode for rank, process in enumerate(processes) if process.exitcode != 0}
    if failed:
        tracebacks = "\n".join(_error_of(ranks.errors_dir, rank, code) for rank, code in failed.items())
        raise RanksFailed(f"ranks {sorted(failed)} of {nprocs} failed:\n{tracebacks}")


# The (preload, environment) the fork server of this process was started with (``spawn_ranks``).
_fork_server_started: tuple[tuple[str, ...], dict[str, str]] | None = None


def _fork_server_context(preload: tuple[str, ...], environment: dict[str, str]) -> Any:
    """The ``forkserver`` context, its server preloading ``preload``; refuses a server that started
    with other modules or another environment (its ranks would inherit those)."""
    global _fork_server_started
    if _fork_server_started is None:
        _fork_server_started = (preload, dict(environment))
    elif _fork_server_started != (preload, environment):
        raise ValueError(f"the fork server runs with {_fork_server_started}, not {(preload, environment)}")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(preload))
    return context


# The exit code of a rank whose episode passed its deadline (``episode_deadline``).
EPISODE_HUNG_EXIT_CODE = 75


@contextlib.contextmanager
def episode_deadline(seconds: float, episode: str, rank: int, errors_dir: Path) -> Iterator[None]:
    """A deadline for one episode of a rank: past it, the rank writes where it hung to ``errors_dir``
    (what ``spawn_ranks`` reports) and exits at once, whatever collective it waits in; its peers,
    waiting for it, pass the same deadline and end alike. Each case of a run gets a deadline of its
    own, not only the run as a whole."""
    timer = threading.Timer(seconds, _episode_hung, (episode, seconds, rank, errors_dir))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _episode_hung(episode: str, seconds: float, rank: int, errors_dir: Path) -> None:
    message = f"episode {episode!r} still running after {seconds} s on rank {rank} (a hang): rank ended"
    Path(errors_dir, f"rank{rank}.error").write_text(message)
    os._exit(EPISODE_HUNG_EXIT_CODE)


def _rank_main(target: Callable[..., None], rank: int, args: tuple, errors_dir: str) -> None:
    try:
        target(rank, *args)
    except BaseException:
        Path(errors_dir, f"rank{rank}.error").write_text(traceback.format_exc())
        raise


def _error_of(errors_dir: Path, rank: int, exitcode: int | None) -> str:
    path = errors_dir / f"rank{rank}.error"
    return f"rank {rank} (exit code {exitcode}):\n{path.read_text() if path.exists() else '(no traceback)'}"


Grid = list[tuple[int, int, int]]


def churn_schedule(calls: int, seed: int, sizes: Sequence[int] = (2, 4, 6, 8), most_images: int = 2) -> list[Grid]:
    """``calls`` requests of one to ``most_images`` images of ``sizes`` x ``sizes`` patches: many
    more attention layouts than a cache of a few graphs holds, each coming back now and then. The same
    on every rank for the same ``seed`` (ranks of a group run the same calls)."""
    draw = random.Random(seed)
    return [
        [(1, draw.choice(sizes), draw.choice(sizes)) for _ in range(draw.randint(1, most_images))] for _ in range(calls)
    ]


def attention_layouts(schedule: Sequence[Grid]) -> int:
    """How many attention layouts ``schedule`` has: its distinct sequences of images' patch counts."""
    return len({tuple(t * h * w for t, h, w in grid) for grid in schedule})


def rank_mismatches(reports: Sequence[dict[str, Any]], fields: Sequence[str]) -> list[str]:
    """Where ranks' reports of the same calls differ: one line per field of ``fields`` whose values
    are not all rank 0's, naming each rank's value."""
    lines = []
    for field in fields:
        values = [report.get(field) for report in reports]
        if any(value != values[0] for value in values):
            lines.append(f"{field}: " + ", ".join(f"rank {rank} {value!r}" for rank, value in enumerate(values)))
    return lines


def failure_problems(step: str, reports: Sequence[dict[str, Any]]) -> list[str]:
    """What is wrong with every rank's report of one episode whose last rank failed at ``step``.

    Each output must equal SGLang's eager forward bit for bit. After a serving replay's failure the
    failing rank's call ran SGLang's eager blocks (its counts differ): only it counts a failure, and
    every rank stopped serving, at the same agreed call. Otherwise every rank took the same path
    (captures, graphs kept, eager runs by reason, stopped) and the layout runs eagerly on all."""
    problems = [f"rank {rank}: outputs differ from eager at calls {_false_at(report['bitwise_equal'])}"
                for rank, report in enumerate(reports) if not all(report["bitwise_equal"])]  # fmt: skip
    if step == "serving_replay":
        failures = [report["failures"] for report in reports]
        if failures != [0] * (len(reports) - 1) + [1]:
            problems.append(f"failures counted {failures}, not 1 on the last rank alone")
        if not all(report["stopped"] for report in reports):
            problems.append(f"stopped {[report['stopped'] for report in reports]}: not every rank")
        return problems
    problems += rank_mismatches(reports, ("captures", "graphs", "eager_runs", "stopped"))
    failed = "capture_unverified" if step == "verification" else "capture_failed"
    if reports[0]["eager_runs"].get(failed, 0) < 1:
        problems.append(f"no {failed} eager run: {reports[0]['eager_runs']}")
    if any(report["failures"] or report["stopped"] for report in reports):
        problems.append("a rank handed its tower to SGLang's eager blocks after a failure inside a capture")
    return problems


def _false_at(flags: Sequence[bool]) -> list[int]:
    return [index for index, flag in enumerate(flags) if not flag]
