"""rocm-vit under each parallel layout SGLang serves Qwen3-VL in, against the real SGLang 0.5.23 package.

Ranks are processes on a CPU (gloo), each building SGLang's parallel state and its own Qwen3-VL tower
sharded over it (tests/sglang_support/parallel.py), with a stand-in custom all-reduce that behaves as
SGLang's and aiter's do (tests/sglang_support/custom_all_reduce.py). A layout whose ranks do not all
finish within the deadline is a hang, and fails.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

SUPPORT = Path(__file__).resolve().parent / "sglang_support"
sys.path.append(str(SUPPORT))
import parallel  # noqa: E402 - tests/sglang_support, imports no SGLang at module level
import rank_harness  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="sglang is not installed (make venv)"),
]

DEADLINE_S = 600
WORLD_SIZES = {"tp2": 2, "tp4": 4, "tp8": 8, "dp_attention_tp4_dp2": 4, "dp_attention_tp2_dp2": 2}
WORLD_SIZES |= {"dp_encoder_tp2": 2, "encode_server_tp2": 2}


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("weights")
    _spawn(parallel.write_reference_weights, (str(directory),), 1, directory / "errors")
    return directory


@pytest.fixture(scope="module", params=list(WORLD_SIZES))
def ranks(request: pytest.FixtureRequest, weights: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Every rank's report of one layout."""
    layout, world_size = request.param, WORLD_SIZES[request.param]
    out = tmp_path_factory.mktemp(layout)
    for config in parallel.TOWER_CONFIGS:
        (out / f"{config}.pt").symlink_to(weights / f"{config}.pt")
    rendezvous = f"file://{out / 'rendezvous'}"
    _spawn(parallel.worker, (world_size, rendezvous, layout, str(out)), world_size, out / "errors")
    return [json.loads((out / f"rank{rank}.json").read_text()) | {"layout": layout} for rank in range(world_size)]


def _spawn(target: Any, args: tuple, nprocs: int, errors_dir: Path) -> None:
    """``target(rank, *args)`` in ``nprocs`` processes forked by a server that imported SGLang once
    (``parallel.CPU_PRELOAD``: 25 ranks, each ~5 s of imports on a CPU); a hang past the deadline fails."""
    environment = rank_harness.rank_environment("cpu")
    # The fork server imports the preload on PYTHONPATH (this process's sys.path reaches only the ranks).
    environment["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(SUPPORT), str(SUPPORT.parent), os.environ.get("PYTHONPATH")])
    )
    try:
        rank_harness.spawn_ranks(target, args, nprocs, DEADLINE_S, environment, errors_dir, parallel.CPU_PRELOAD)
    except rank_harness.RanksHung as hung:
        pytest.fail(str(hung))


def _episode(ranks: list[dict], name: str) -> list[dict]:
    if name not in ranks[0]:
        pytest.skip(f"{ranks[0]['layout']} runs no {name} episode")
    return [report[name] for report in ranks]


def test_graphs_are_kept_under_tensor_parallelism_and_replay_the_eager_bits(ranks: list[dict]) -> None:
    """Captured outside the custom all-reduce's capture context: the warm-up all-reduces for real (inside
    it, SGLang's and aiter's all-reduce answer a warm-up with zeros, and no graph was ever kept), and a
    captured all-reduce is the eager one, copied through the buffer registered at start."""
    for report in _episode(ranks, "serve"):
        assert all(report["bitwise_equal"]), report
        assert report["captures"] > 0 and report["graphs"] == report["captures"] and report["replays"] > 0
        assert "capture_unverified" not in report["eager_runs"], report
        counts = report["all_reduce"]
        if report["agrees"]:  # a sharded tower: its all-reduces are in every graph
            assert counts["captured_copy_in"] == 8 * report["captures"], counts
        assert counts.get("warm_up_zeros", 0) == 0, counts
        assert [counts.get(name, 0) for name in ("registered", "exchanges", "captured_registered")] == [0, 0, 0]


def test_every_rank_serves_through_rocm_vits_fused_blocks(ranks: list[dict]) -> None:
    """The fused glue between SGLang's linear modules, whose all-reduces the test above counts: on a
    CPU's plain ops its output is SGLang's eager forward's, bit for bit."""
    for report in _episode(ranks, "serve"):
        assert report["blocks"] == "rocm-vit: fused glue between SGLang's linear modules", report


def test_ranks_that_run_the_same_calls_take_the_same_decisions(ranks: list[dict]) -> None:
    reports = _episode(ranks, "serve")
    by_group: dict[str, list[dict]] = {}
    for rank, report in zip(ranks, reports, strict=True):
        if rank["groups"]["agreement"] is not None:  # else each rank serves its own images
            by_group.setdefault(str(rank["groups"]["agreement"]), []).append(report)
    for group in by_group.values():
        decisions = [(r["captures"], r["replays"], r["eager_runs"]) for r in group]
        assert all(decision == decisions[0] for decision in decisions), decisions


def test_the_agreement_group_is_the_one_the_tower_all_reduces_over(ranks: list[dict]) -> None:
    layout = ranks[0]["layout"]
    for rank in ranks:
        groups, agrees = rank["groups"], rank["serve"]["agrees"]
        if layout in ("tp2", "tp4", "tp8", "encode_server_tp2"):
            assert groups["agreement"] == groups["tp_group"] and agrees
        elif layout == "dp_attention_tp4_dp2":  # attention-TP pairs {0, 1} and {2, 3}
            pair = [0, 1] if rank["rank"] < 2 else [2, 3]
            assert groups["agreement"] == groups["attn_tp_group"] == pair and agrees
        else:  # an attention-TP group of one, a DP encoder: each rank encodes its own images alone
            assert groups["agreement"] is None and not agrees


@pytest.mark.parametrize("point", list(parallel.FAILURES))
def test_a_failure_on_one_rank_leaves_every_rank_on_the_same_path(ranks: list[dict], point: str) -> None:
    """Injected on the last rank before anything of that step ran there: no hang, every rank serves
    the same calls the same way, each output equal to SGLang's eager forward bit for bit."""
    reports = _episode(ranks, f"fail_{point}")
    assert rank_harness.failure_problems(point, reports) == [], reports


def test_buckets_captured_at_start_on_every_rank_serve_the_first_requests(ranks: list[dict]) -> None:
    """Padding on, as SGLang serves by default: the start hooks' bucket captures run on every rank
    (each all-reduce of a capture in the custom all-reduce's capture context, none answered with
    zeros), and each rank's first requests replay those graphs, equal to its padded eager calls."""
    reports = _episode(ranks, "start")
    for report in reports:
        assert report["captured"] == report["captures_at_start"] > 0, report
        assert report["captures_while_serving"] == 0 and report["replays"] == report["padded_requests"] > 0, report
        assert all(report["bitwise_equal"]) and report["failures"] == 0, report
        assert report["a_stale_adapter_beside"]
        counts = report["all_reduce"]
        assert counts.get("warm_up_zeros", 0) == 0 and counts.get("registered", 0) == 0, counts
    assert len({report["captured"] for report in reports}) == 1  # every rank captured the same buckets


def test_churn_registers_nothing_with_the_all_reduce(ranks: list[dict]) -> None:
    """2,000 calls of ever new layouts at capacity 8, the all-reduce's table scaled to hold as many of
    this tower's captures as aiter's 131,072 entries hold of Qwen3-VL-8B's: no registration (captured
    inside the all-reduce's capture context, each capture took 8 entries for good), no overflow. The
    cache is filled at least twice over and has evicted at least as many graphs as it holds."""
    for report in _episode(ranks, "churn"):
        assert report["error"] is None and report["failures"] == 0, report
        assert report["captures"] >= 2 * report["capacity"] and report["evictions"] >= report["capacity"], report
        assert report["all_reduce"]["captured_copy_in"] == 8 * report["captures"], report
        assert report["all_reduce"]["registered"] == 0 and report["all_reduce"]["exchanges"] == 0


@pytest.mark.parametrize("communicator", parallel.COMMUNICATORS)
def test_each_all_reduce_sglang_picks_is_captured_as_it_needs_or_left_eager(
    ranks: list[dict], communicator: str
) -> None:
    """aiter's: captured outside its capture(), nothing registered. SGLang's own (ROCm, CUDA,
    deterministic): captured inside capture(), every captured slot filled at its exit before any
    replay reads it (outside, a replay reads an empty slot: NaN, every graph unverified). Quick
    all-reduce: captured anywhere. NCCL only, or an all-reduce rocm-vit does not know: graphs off
    under TP, with the reason. Every output equal to SGLang's eager forward bit for bit."""
    for report in (rank[communicator] for rank in _episode(ranks, "communicators")):
        assert all(report["bitwise_equal"]), report
        assert report["warm_up_zeros"] == 0 and report["empty_slot_reads"] == 0, report
        if communicator in ("nccl", "unknown"):
            assert report["problem"] is not None and report["captures"] == 0, report
            continue
        assert report["problem"] is None and report["captures"] > 0 and report["graphs"] == report["captures"], report
        assert not {"capture_unverified", "capture_failed"} & set(report["eager_runs"]), report
        if communicator.startswith("sglang"):
            assert report["registered_slots"] == 8 * report["captures"] and report["copy_in"] == 0, report
            assert report["exchanges"] == report["captures"], report
        else:
            assert report["registered_slots"] == 0 and report["exchanges"] == 0, report
        if communicator == "quick":
            assert report["quick_calls"] > 0, report


@pytest.mark.parametrize("communicator", ["sglang_rocm", "sglang_cuda"])
def test_the_runner_built_under_tensor_parallelism_takes_the_all_reduces_token_cap(
    ranks: list[dict], communicator: str
) -> None:
    """The custom all-reduce takes 24 patches' all-reduces, under the settings' 256: the runner is
    built with 24, so the 32-patch requests run eagerly (their all-reduces would go to NCCL)."""
    for report in (rank[communicator] for rank in _episode(ranks, "communicators")):
        assert report["plan_max_tokens"] == report["runner_max_tokens"] == 24, report
        assert report["eager_runs"].get("over_max_tokens", 0) > 0, report
