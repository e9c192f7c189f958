"""The device-independent parts of the SGLang rank runs (tests/sglang_support/rank_harness.py), on a
CPU in seconds: what the GPU ranks of tests/gpu/test_sglang_ranks_gpu.py rely on before any of them
can run there. Each spawned rank imports this module: it imports no torch, so a rank starts in a
fraction of a second (the injected failures, which need torch: tests/test_injected_failures.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.append(str(Path(__file__).resolve().parent / "sglang_support"))
import rank_harness

# The run's deadline where it is not what a test checks: a guard against a hang only, as these ranks
# exit on their own, each in about a second.
HANG_S = 120


def _write_environment(rank: int, out: str) -> None:
    names = [*rank_harness.MULTICAST_OFF, "CUDA_VISIBLE_DEVICES", "ROCM_VIT_PROFILE"]
    Path(out, f"rank{rank}.json").write_text(json.dumps({name: os.environ.get(name) for name in names}))


def _hang_on(rank: int, hanging_rank: int, out: str) -> None:
    Path(out, f"rank{rank}.started").touch()
    while rank == hanging_rank:
        time.sleep(0.05)


@contextlib.contextmanager
def _started(target: Callable[..., None], args: tuple, nprocs: int, errors_dir: Path) -> Iterator[rank_harness.Ranks]:
    """Ranks that are killed as the test ends, whatever it found (a rank of ``_hang_on`` never exits)."""
    ranks = rank_harness.start_ranks(target, args, nprocs, {}, errors_dir)
    try:
        yield ranks
    finally:
        for process in ranks.processes:
            process.kill()  # a no-op on one that exited
            process.join()


def _raise_on(rank: int, failing_rank: int) -> None:
    if rank == failing_rank:
        raise ValueError(f"rank {rank} cannot build its tower")


def _hang_in_episode(rank: int, errors_dir: str) -> None:
    if rank == 0:  # the failing rank: gone
        return
    with rank_harness.episode_deadline(0.5, "fail_capture", rank, Path(errors_dir)):
        while True:  # its peer waits for it: the episode's deadline ends it
            time.sleep(0.05)


def test_a_fork_server_serves_only_the_preload_and_environment_it_started_with(monkeypatch) -> None:
    """Ranks forked by the server inherit what it imported and the environment it started under: a
    call that asks for other modules or another environment is refused, not served with the first's.
    (No server is started here: the context is only asked for.)"""
    monkeypatch.setattr(rank_harness, "_fork_server_started", None)
    first = rank_harness._fork_server_context(("json",), {"GLOO_SOCKET_IFNAME": "lo"})
    assert first.get_start_method() == "forkserver"
    assert rank_harness._fork_server_context(("json",), {"GLOO_SOCKET_IFNAME": "lo"}) is first
    with pytest.raises(ValueError, match="the fork server runs with"):
        rank_harness._fork_server_context(("json",), {"GLOO_SOCKET_IFNAME": "eth0"})
    with pytest.raises(ValueError, match="the fork server runs with"):
        rank_harness._fork_server_context(("json", "csv"), {"GLOO_SOCKET_IFNAME": "lo"})


def test_every_spawned_rank_runs_with_nvlink_multicast_off(tmp_path: Path) -> None:
    """NCCL, torch's symmetric memory and NVSHMEM read these as they start: they are in each
    rank's environment from its first instruction, and the parent's is left as it was."""
    before = dict(os.environ)
    environment = rank_harness.rank_environment("cuda")
    rank_harness.spawn_ranks(_write_environment, (str(tmp_path),), 2, HANG_S, environment, tmp_path / "errors")
    for rank in range(2):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert {name: seen[name] for name in rank_harness.MULTICAST_OFF} == {
            "NCCL_NVLS_ENABLE": "0",
            "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1",
        }
        assert seen["ROCM_VIT_PROFILE"] == "off"
        assert seen["CUDA_VISIBLE_DEVICES"] == before.get("CUDA_VISIBLE_DEVICES")  # a GPU rank sees every device
    assert dict(os.environ) == before


def test_cpu_ranks_see_no_device_and_gpu_ranks_every_one() -> None:
    cpu, cuda = rank_harness.rank_environment("cpu"), rank_harness.rank_environment("cuda")
    assert cpu["CUDA_VISIBLE_DEVICES"] == cpu["HIP_VISIBLE_DEVICES"] == ""
    assert "CUDA_VISIBLE_DEVICES" not in cuda and "HIP_VISIBLE_DEVICES" not in cuda
    assert rank_harness.MULTICAST_OFF.items() <= cpu.items() and rank_harness.MULTICAST_OFF.items() <= cuda.items()
    # GPU ranks compare with SGLang's eager forward bit for bit: SGLang's blocks, not the fused glue.
    assert cuda["ROCM_VIT_SGLANG_BLOCKS"] == "sglang" and "ROCM_VIT_SGLANG_BLOCKS" not in cpu
    with pytest.raises(ValueError, match="'rocm'"):
        rank_harness.rank_environment("rocm")


def test_a_rank_still_running_at_the_deadline_is_killed_and_named(tmp_path: Path) -> None:
    """The deadline comes once rank 0 has returned and rank 1 runs its endless loop, however long a
    busy machine takes to start them: no rank races the clock."""
    with _started(_hang_on, (1, str(tmp_path)), 2, tmp_path / "errors") as ranks:
        ranks.processes[0].join()
        while not (tmp_path / "rank1.started").exists():
            assert ranks.processes[1].is_alive(), "rank 1 exited before it started to hang"
            time.sleep(0.05)
        with pytest.raises(rank_harness.RanksHung, match=r"_hang_on: ranks \[1\] of 2 still running after 0 s"):
            rank_harness.end_ranks(ranks, 0)
        assert [process.exitcode for process in ranks.processes] == [0, -signal.SIGKILL]


def test_a_rank_that_raises_is_named_with_its_traceback(tmp_path: Path) -> None:
    with pytest.raises(rank_harness.RanksFailed, match=r"ranks \[0\] of 2 failed") as failed:
        rank_harness.spawn_ranks(_raise_on, (0,), 2, HANG_S, {}, tmp_path / "errors")
    assert "ValueError: rank 0 cannot build its tower" in str(failed.value)


def test_an_episode_past_its_own_deadline_ends_its_ranks_saying_where(tmp_path: Path) -> None:
    """The run's deadline is far; the episode's ends the rank that waits, naming the episode."""
    with pytest.raises(rank_harness.RanksFailed, match=r"ranks \[1\] of 2 failed") as failed:
        rank_harness.spawn_ranks(_hang_in_episode, (str(tmp_path / "errors"),), 2, HANG_S, {}, tmp_path / "errors")
    message = str(failed.value)
    assert f"exit code {rank_harness.EPISODE_HUNG_EXIT_CODE}" in message
    assert "episode 'fail_capture' still running after 0.5 s on rank 1 (a hang)" in message


def test_the_churn_is_the_same_calls_on_every_rank_and_many_more_layouts_than_a_cache_holds() -> None:
    schedule = rank_harness.churn_schedule(1000, seed=1234)
    assert schedule == rank_harness.churn_schedule(1000, seed=1234)  # another rank's
    assert schedule != rank_harness.churn_schedule(1000, seed=1235)
    assert len(schedule) == 1000 and all(1 <= len(grid) <= 2 for grid in schedule)
    layouts = rank_harness.attention_layouts(schedule)
    assert 8 * 4 < layouts < 1000 // 4  # past a cache of 8 many times over; each layout comes back
    assert {h for grid in schedule for _, h, _ in grid} == {2, 4, 6, 8}


def test_rank_mismatches_names_each_field_where_any_rank_differs() -> None:
    reports = [{"captures": 3, "replays": 9, "eager_runs": {}} for _ in range(4)]
    assert rank_harness.rank_mismatches(reports, ("captures", "replays", "eager_runs")) == []
    reports[3] = {**reports[3], "replays": 8}  # the last rank only: a comparison of neighbours from 0 misses none
    assert rank_harness.rank_mismatches(reports, ("captures", "replays")) == [
        "replays: rank 0 9, rank 1 9, rank 2 9, rank 3 8"
    ]


def _episode(eager_runs: dict, failures: int = 0, stopped: bool = False, bitwise: bool = True) -> dict:
    return {"bitwise_equal": [True, bitwise], "captures": 3, "graphs": 2, "eager_runs": eager_runs,
            "failures": failures, "stopped": stopped}  # fmt: skip


def test_a_failure_on_one_rank_is_judged_on_every_rank() -> None:
    same = [_episode({"capture_failed": 1}) for _ in range(2)]
    assert rank_harness.failure_problems("capture", same) == []
    assert rank_harness.failure_problems("verification", same) == [
        "no capture_unverified eager run: {'capture_failed': 1}"
    ]
    parted = [_episode({"capture_failed": 1}), _episode({"capture_failed": 1, "below_payback": 1})]
    assert rank_harness.failure_problems("capture", parted)[0].startswith("eager_runs: rank 0")
    wrong = [_episode({"capture_failed": 1}), _episode({"capture_failed": 1}, bitwise=False)]
    assert rank_harness.failure_problems("capture", wrong) == ["rank 1: outputs differ from eager at calls [1]"]
    stopped_alike = [_episode({}, stopped=True), _episode({"failed": 1}, failures=1, stopped=True)]
    assert rank_harness.failure_problems("serving_replay", stopped_alike) == []
    stopped_alone = [_episode({}), _episode({}, failures=1, stopped=True)]
    assert rank_harness.failure_problems("serving_replay", stopped_alone) == ["stopped [False, True]: not every rank"]


def test_failures_are_injected_on_the_last_rank_alone() -> None:
    assert [rank_harness.failing_rank_arguments("capture", rank, 4) for rank in range(4)] == [
        {},
        {},
        {},
        {"fail_captures": 1},
    ]
    assert rank_harness.failing_rank_arguments(None, 3, 4) == {}
    with pytest.raises(ValueError, match="no failure step 'launch'"):
        rank_harness.failing_rank_arguments("launch", 1, 2)
