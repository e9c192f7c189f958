"""SGLang's own Qwen3-VL tower on 2 and 4 GPUs, one process a GPU, NCCL inside real CUDA graphs.

The CPU ranks' harness (tests/sglang_support/parallel.py, with ``device="cuda"``): each rank builds
SGLang's parallel state over NCCL, SGLang's ``Qwen3VLMoeVisionModel`` (bf16, ``triton_attn``) sharded
as SGLang shards it, loads the same full weights, and serves through rocm-vit's adapter under real
CUDA graphs, the tower's all-reduces captured through SGLang's PyNccl (and, in one episode, through a
stand-in of SGLang's CUDA custom all-reduce keeping its capture contract, beside PyNccl). Layouts:
TP 2, TP 4, DP attention with attention-TP 2 and DP 2. On every rank: graphs equal SGLang's eager
forward bit for bit; the ranks of a group count alike; 1,000 calls of churn with no mismatch; a
failure injected on the last rank at each capture step, with no hang (each episode has a deadline of
its own); graph memory within its budget. NVLink multicast is off in every rank.

Skips, saying why, where the host has fewer GPUs than a layout's ranks or SGLang does not import
(fails instead where SGLang was installed from a wheelhouse for this run). Not yet run on real GPUs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SUPPORT = Path(__file__).resolve().parents[1] / "sglang_support"
sys.path.append(str(SUPPORT))
import parallel  # noqa: E402 - tests/sglang_support, imports no SGLang at module level
import rank_harness  # noqa: E402

pytestmark = pytest.mark.gpu

WORLD_SIZES = {"tp2": 2, "tp4": 4, "dp_attention_tp4_dp2": 4}
RUN_DEADLINE_S = 540  # each episode has its own (parallel.EPISODE_DEADLINE_S); this bounds a layout's run
# Counters that ranks running the same calls must agree on.
SHARED_COUNTERS = ("captures", "replays", "graphs", "eager_runs", "failures", "stopped")


def _cannot_run(reason: str) -> None:
    """Skip, or fail where SGLang was installed from a wheelhouse for this run: it must load then."""
    wheelhouse = os.environ.get("SGLANG_WHEELHOUSE")
    if wheelhouse:
        pytest.fail(f"{reason}, though SGLANG_WHEELHOUSE={wheelhouse} was installed")
    pytest.skip(reason)


def _sglang_imports() -> None:
    """SGLang's Qwen3-VL imports in a process of its own, with sgl_kernel's stand-in where it is missing."""
    if importlib.util.find_spec("sglang") is None:
        _cannot_run("sglang is not installed in this environment (pip install 'rocm-vit[sglang]')")
    probe = (
        f"import sys; sys.path.append({str(SUPPORT)!r}); sys.path.append({str(SUPPORT.parent)!r}); "
        "from scenario import _sgl_kernel_standin_where_missing; _sgl_kernel_standin_where_missing(); "
        "import sglang.srt.models.qwen3_vl"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        _cannot_run(f"SGLang cannot be imported here: {done.stderr.strip().splitlines()[-1:]}")


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _sglang_imports()
    directory = tmp_path_factory.mktemp("weights")
    environment = rank_harness.rank_environment("cpu")  # written on a CPU, as the CPU ranks' are
    rank_harness.spawn_ranks(parallel.write_reference_weights, (str(directory),), 1, 600, environment, directory / "e")
    return directory


@pytest.fixture(scope="module", params=list(WORLD_SIZES))
def ranks(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Every rank's report of one layout."""
    layout, world_size = request.param, WORLD_SIZES[request.param]
    if torch.cuda.device_count() < world_size:
        pytest.skip(f"{layout} needs {world_size} GPUs, one a rank; this host has {torch.cuda.device_count()}")
    weights = request.getfixturevalue("weights")
    out = tmp_path_factory.mktemp(layout)
    for config in parallel.TOWER_CONFIGS:
        (out / f"{config}.pt").symlink_to(weights / f"{config}.pt")
    environment = rank_harness.rank_environment("cuda")
    args = (world_size, f"file://{out / 'rendezvous'}", layout, str(out), "cuda")
    try:
        rank_harness.spawn_ranks(parallel.worker, args, world_size, RUN_DEADLINE_S, environment, out / "errors")
    except rank_harness.RanksHung as hung:
        pytest.fail(str(hung))
    return [json.loads((out / f"rank{rank}.json").read_text()) | {"layout": layout} for rank in range(world_size)]


def _groups(ranks: list[dict], episode: str) -> list[list[dict]]:
    """The episode's reports, one list per agreement group (the ranks that run the same calls)."""
    by_group: dict[str, list[dict]] = {}
    for rank in ranks:
        by_group.setdefault(str(rank["groups"]["agreement"]), []).append(rank[episode])
    return list(by_group.values())


def test_every_layout_shares_its_calls_over_a_group_of_two_or_more(ranks: list[dict]) -> None:
    for rank in ranks:
        groups = rank["groups"]
        if rank["layout"] == "dp_attention_tp4_dp2":  # attention-TP pairs {0, 1} and {2, 3}
            assert groups["agreement"] == groups["attn_tp_group"] == ([0, 1] if rank["rank"] < 2 else [2, 3])
        else:
            assert groups["agreement"] == groups["tp_group"] == list(range(len(ranks)))


def test_graphs_with_nccl_inside_replay_the_eager_bits_on_every_rank(ranks: list[dict]) -> None:
    for report in (rank["serve"] for rank in ranks):
        assert all(report["bitwise_equal"]), report
        assert report["communicator"] == "PyNccl" and report["agrees"], report
        assert report["captures"] > 0 and report["graphs"] == report["captures"] and report["replays"] > 0, report
        assert not {"capture_failed", "capture_unverified"} & set(report["eager_runs"]), report


def test_the_ranks_of_a_group_count_alike(ranks: list[dict]) -> None:
    for episode in ("serve", "custom_all_reduce"):
        for group in _groups(ranks, episode):
            assert rank_harness.rank_mismatches(group, SHARED_COUNTERS) == [], episode


@pytest.mark.parametrize("point", list(rank_harness.FAILURES))
def test_a_failure_on_one_rank_leaves_every_rank_on_the_same_path(ranks: list[dict], point: str) -> None:
    """Injected on the last rank (of the last group under DP attention) into real CUDA graphs: no
    hang, every output right, every rank of its group on the same path; the other group unharmed."""
    *others, failing = _groups(ranks, f"fail_{point}")
    assert rank_harness.failure_problems(point, failing) == [], failing
    for group in others:
        assert all(all(report["bitwise_equal"]) and report["failures"] == 0 for report in group), group


def test_a_custom_all_reduce_beside_pynccl_fills_every_slot_before_a_replay_reads_it(ranks: list[dict]) -> None:
    """SGLang's CUDA custom all-reduce (its stand-in) takes the small all-reduces, PyNccl the rest,
    both inside one graph: captured inside ``capture()``, each slot filled at its exit."""
    for report in (rank["custom_all_reduce"] for rank in ranks):
        assert all(report["bitwise_equal"]), report
        assert report["communicator"] == "SGLang's CustomAllreduce (CUDA) + PyNccl", report
        assert report["captures"] > 0 and report["graphs"] == report["captures"], report
        assert report["unfilled_slots"] == 0 and report["all_reduce"]["captured_registered"] > 0, report
        assert report["all_reduce"]["warm_up_zeros"] == 0, report


def test_a_thousand_calls_of_churn_replay_the_eager_bits_within_the_memory_budget(ranks: list[dict]) -> None:
    for group in _groups(ranks, "churn_compared"):
        for report in group:
            assert report["error"] is None and report["calls"] == 1000 and report["mismatches"] == 0, report
            assert report["captures"] >= 20 and report["evictions"] > 0 and report["failures"] == 0, report
            assert 0 < report["most_bytes_held"] <= report["budget_bytes"], report
        assert rank_harness.rank_mismatches(group, ("captures", "replays", "evictions", "eager_runs")) == []
