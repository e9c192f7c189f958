"""Gloo ranks (two; four for the stand-in's sums) under SGLang's own custom all-reduce, through rocm-vit.

Each rank builds ``ViTGraphRunnerAdapter`` (its ``__init__``, plan and runner as in a server) over a
toy tower whose forward makes two all-reduces through the stand-in of SGLang's ``CustomAllreduce``
(``sglang_support/custom_all_reduce.py``): a replay reads the peers' registered graph inputs, an
eager call their start buffer, and a rank that replays while its peer runs eagerly reads NaN. A
replay that fails before its launch on one rank must never leave that rank eager while its peer
replays: every output equals the eager forward, on both ranks. The ranks also agree on the plan,
and ``group_max`` takes the maximum. Collectives time out after ``COLLECTIVE_TIMEOUT_S`` rather
than hang, should a broken protocol leave a rank waiting.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from rank_exit import leave_without_finalizing

HERE = Path(__file__).resolve().parent
WORLD_SIZE = 2
COLLECTIVE_TIMEOUT_S = 60
HIDDEN = 8

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="this torch has no torch.distributed")


def _init(rank: int, store: str, world_size: int = WORLD_SIZE) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))  # fmt: skip


def _group_max_rank(rank: int, store: str, out: str) -> None:
    from rocm_vit.graphs.ranks import group_max

    _init(rank, store)
    try:
        agreed = group_max()([rank, -rank, 7, 3 * (1 - rank)])
        Path(out, f"rank{rank}.json").write_text(json.dumps(agreed))
    finally:
        dist.destroy_process_group()
    leave_without_finalizing()


def test_group_max_is_the_element_wise_maximum_over_every_rank(tmp_path: Path) -> None:
    mp.start_processes(_group_max_rank, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=WORLD_SIZE,
                       start_method="spawn")  # fmt: skip
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(WORLD_SIZE)]
    assert reports == [[1, 0, 7, 3]] * WORLD_SIZE


# The adapter over a toy tower ----------------------------------------------------------------------


class _RowParallel(torch.nn.Module):
    """What ``plan_all_reduce`` reads of SGLang's RowParallelLinear: it all-reduces ``output_size`` wide."""

    def __init__(self) -> None:
        super().__init__()
        self.reduce_results, self.output_size = True, HIDDEN


def _toy_vit() -> torch.nn.Module:
    vit = torch.nn.Module()
    vit.blocks = torch.nn.ModuleList([torch.nn.Module()])
    vit.blocks[0].proj, vit.blocks[0].fc2 = _RowParallel(), _RowParallel()
    vit.blocks[0].attn = types.SimpleNamespace(qkv_backend_name="fa3")
    vit.spatial_merge_size, vit.dtype = 2, torch.float32
    return vit


class _ToyBlocks:
    """What the adapter calls of ``SGLangBlocks``: a forward of two all-reduces through the group's
    custom all-reduce, run by the runner (captured, replayed) or eagerly (``eager``)."""

    def __init__(self, vit: torch.nn.Module, group: Any) -> None:
        self._group = group
        self.blocks = "toy: two all-reduces"  # which block loop runs, as the adapter's stats report it
        self.weight = torch.linspace(-1, 1, HIDDEN * HIDDEN).reshape(HIDDEN, HIDDEN)
        self.eager_calls = 0

    def rotary(self, position_embeddings: Any, cos: torch.Tensor, sin: torch.Tensor) -> tuple:
        return cos, sin

    def use_sglang_blocks(self, why: str) -> None:  # one loop here, fused or not: only the report says so
        self.blocks = f"sglang: {why}"

    def layout(self, offsets: tuple[int, ...], window_offsets: tuple[int, ...] | None) -> Any:
        from rocm_vit.layout import AttentionLayout

        return AttentionLayout.from_offsets(offsets, window_offsets)

    def forward_blocks(self, spec: Any, x: torch.Tensor, attn_args: Any, cos: torch.Tensor, sin: torch.Tensor,
                       *, shares_collectives: bool = False) -> torch.Tensor:  # fmt: skip
        ca_comm = self._group.ca_comm
        hidden = ca_comm.custom_all_reduce((x * cos.sum(-1, keepdim=True) + sin.mean()).contiguous())
        return ca_comm.custom_all_reduce((torch.tanh(hidden) @ self.weight).contiguous())

    def eager(self, x: torch.Tensor, cu_seqlens: Any, cu_window_seqlens: Any, position_embeddings: Any,
              cos: torch.Tensor, sin: torch.Tensor, *rest: Any) -> torch.Tensor:  # fmt: skip
        self.eager_calls += 1
        return self.forward_blocks(None, x.clone(), None, cos, sin)


def _sglang_group(rank: int, world_size: int = WORLD_SIZE) -> Any:
    """SGLang's ``GroupCoordinator`` as the plan and the stand-in read it: a CPU group for agreements and
    the registration exchange, another for the data, routed by SGLang's own method."""
    from sglang.srt.distributed.parallel_state import GroupCoordinator

    cpu_group, device_group = dist.new_group(backend="gloo"), dist.new_group(backend="gloo")
    group = types.SimpleNamespace(world_size=world_size, rank_in_group=rank, ca_comm=None, qr_comm=None,
                                  pymscclpp_comm=None, pcie_ipc_comm=None, torch_symm_mem_comm=None,
                                  cpu_group=cpu_group, device_group=device_group)  # fmt: skip
    group._resolve_outplace_all_reduce_method = types.MethodType(
        GroupCoordinator._resolve_outplace_all_reduce_method, group
    )
    return group


_PATCHED = ("agreement_group", "SGLangBlocks", "original", "eager_unsupported_reason", "unsupported_reason")


def _adapter(vit: torch.nn.Module, group: Any, graph_runner: Any, mechanism: Any = None) -> Any:
    """The adapter as SGLang builds it in ``vit``'s constructor, over ``group`` and ``_ToyBlocks``."""
    from test_graph_runner import StandInGraphs

    graph_runner.agreement_group = lambda _: group
    graph_runner.SGLangBlocks = lambda vit, sglang_blocks: _ToyBlocks(vit, group)  # the fused or SGLang's: one toy
    graph_runner.original = lambda module, name: lambda vit: None
    graph_runner.eager_unsupported_reason = graph_runner.unsupported_reason = lambda *args: None
    return graph_runner.ViTGraphRunnerAdapter(vit, mechanism=mechanism or StandInGraphs())


def _failing_fill(fill: Any) -> Any:
    """``Staging.fill`` that raises on its ``after + 1``-th call once ``arm(after)`` was called: a
    replay whose staging cannot be filled, before anything of it launched."""
    countdown: list[int] = []

    def failing(staging: Any, *args: Any) -> None:
        if countdown:
            countdown[0] -= 1
            if countdown[0] < 0:
                countdown.clear()
                raise torch.OutOfMemoryError("injected: staging could not be filled")
        fill(staging, *args)

    failing.arm = lambda after: countdown[:] == [] and countdown.append(after)
    return failing


def _call(adapter: Any, blocks: _ToyBlocks, tokens: int, seed: int) -> dict:
    """One call through the adapter and the same call eagerly, on every rank alike."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, HIDDEN, generator=generator)
    cos, sin = torch.randn(tokens, 4, generator=generator), torch.randn(tokens, 4, generator=generator)
    cu_seqlens = torch.tensor([0, tokens], dtype=torch.int32)
    served = adapter.run(x, cu_seqlens, None, None, cos, sin, None, ((0, tokens), None))
    eager = blocks.eager(x, cu_seqlens, None, None, cos, sin)
    return {"equal": torch.equal(served, eager), "nan": bool(served.isnan().any())}


def _until_captured(adapter: Any, blocks: _ToyBlocks, tokens: int, seed: int) -> list[dict]:
    """Calls of one layout until the runner attempted its capture (the cost model admits it after a
    few eager calls: the same call on every rank, whose decisions are agreed)."""
    calls = []
    attempts = lambda: adapter.stats()["captures"] + adapter.stats()["eager_runs"]["capture_failed"]  # noqa: E731
    before = attempts()
    while attempts() == before and len(calls) < 16:
        calls.append(_call(adapter, blocks, tokens, seed=seed + 100 * len(calls)))
    return calls


def _pairing_rank(rank: int, store: str, out: str) -> None:
    sys.path[:0] = [str(HERE), str(HERE / "sglang_support")]
    os.environ.update({"SGLANG_VIT_ENABLE_CUDA_GRAPH": "1", "SGLANG_VIT_CUDA_GRAPH_MIN_HITS": "1",
                       "SGLANG_VIT_CUDA_GRAPH_PADDING": "0", "ROCM_VIT_PROFILE": "off"})  # fmt: skip
    from custom_all_reduce import sglang_custom_allreduce
    from test_graph_runner import stand_in_capturing

    from rocm_vit.graphs import staging
    from rocm_vit.integrations.sglang import graph_runner

    _init(rank, store)
    report: dict[str, Any] = {}
    try:
        group = _sglang_group(rank)
        ca_comm = group.ca_comm = sglang_custom_allreduce(group, stand_in_capturing, "rocm")
        # The stand-in itself: a replay's read beside an eager one reads stale data, on both ranks.
        mixed = ca_comm._reduce(torch.ones(4), registered=rank == 0)
        report["stand_in_mixed_is_nan"] = bool(mixed.isnan().all())
        report["stand_in_alike_sums"] = ca_comm._reduce(torch.ones(4), registered=True).tolist()
        ca_comm.mixed_reads = 0

        failing = staging.Staging.fill = _failing_fill(staging.Staging.fill)
        vit = _toy_vit()
        adapter = _adapter(vit, group, graph_runner)
        report["plan"] = [adapter.all_reduce.communicator, adapter.all_reduce.pairs_eager_with_replay]
        blocks = adapter._blocks
        calls = _until_captured(adapter, blocks, 16, seed=1)  # admitted, captured, verified
        if rank == 1:
            failing.arm(0)  # the next staging filled: a serving replay's
        calls.append(_call(adapter, blocks, 16, seed=2))
        if rank == 1:
            failing.arm(1)  # the capture's, then the new graph's first replay's
        calls += _until_captured(adapter, blocks, 24, seed=3)
        calls += [_call(adapter, blocks, tokens, seed=4 + tokens) for tokens in (16, 24)]
        stats = adapter.stats()
        eager_runs = {reason: count for reason, count in stats["eager_runs"].items() if count}
        report.update(calls=calls, mixed_reads=ca_comm.mixed_reads, failures=stats["failures"],
                      eager_runs=eager_runs, replays=stats["replays"])  # fmt: skip

        # Ranks that plan differently (the custom all-reduce off on one): graphs off on both.
        ca_comm.disabled = rank == 1
        report["disagreeing_plans_serve_graphs"] = _adapter(vit, group, graph_runner).serves_graphs
    finally:
        Path(out, f"rank{rank}.json").write_text(json.dumps(report))
        dist.destroy_process_group()
    leave_without_finalizing()


needs_sglang = pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="sglang is not installed")


@pytest.fixture(scope="module")
def pairing_reports(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Both ranks' reports of ``_pairing_rank``."""
    out = tmp_path_factory.mktemp("pairing")
    mp.start_processes(_pairing_rank, args=(str(out / "store"), str(out)), nprocs=WORLD_SIZE, start_method="spawn")
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(WORLD_SIZE)]


@pytest.mark.slow
@needs_sglang
def test_the_stand_in_reads_nan_where_one_rank_replays_and_another_runs_eagerly(pairing_reports: list[dict]) -> None:
    for report in pairing_reports:
        assert report["stand_in_mixed_is_nan"] and report["stand_in_alike_sums"] == [2.0] * 4, report


def _stand_in_sums_rank(rank: int, store: str, out: str, world_size: int) -> None:
    sys.path[:0] = [str(HERE), str(HERE / "sglang_support")]
    from custom_all_reduce import sglang_custom_allreduce

    _init(rank, store, world_size)
    try:
        group = _sglang_group(rank, world_size)
        ca_comm = sglang_custom_allreduce(group, lambda: False, "rocm")
        data = torch.randn(1536, generator=torch.Generator().manual_seed(rank))  # a 24-patch row block
        plain = data.clone()
        dist.all_reduce(plain, group=group.device_group)
        equal = [torch.equal(ca_comm._reduce(data, registered=mode), plain) for mode in (False, True)]
        Path(out, f"rank{rank}.json").write_text(json.dumps(equal))
    finally:
        dist.destroy_process_group()
    leave_without_finalizing()


@needs_sglang
def test_the_stand_in_sums_as_a_plain_all_reduce_past_two_ranks(tmp_path: Path) -> None:
    """Four ranks, each in either mode: the stand-in's sum is gloo's plain all-reduce's, bit for bit, as
    SGLang's kernel sums alike whether it reads registered inputs or its start buffer (reduced with
    its mode beside it, one element more, gloo summed the data in another order past two ranks)."""
    world_size = 4
    mp.start_processes(_stand_in_sums_rank, args=(str(tmp_path / "store"), str(tmp_path), world_size),
                       nprocs=world_size, start_method="spawn")  # fmt: skip
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(world_size)]
    assert reports == [[True, True]] * world_size


@pytest.mark.slow
@needs_sglang
def test_a_replay_that_fails_before_launch_on_one_rank_never_pairs_with_the_others_eager_call(
    pairing_reports: list[dict],
) -> None:
    """Under SGLang's own custom all-reduce, rank 1's staging fails at a serving replay, then at a new
    graph's first replay: every rank serves both calls the same way, every output equals eager on
    both ranks, and no all-reduce read a replay beside an eager call."""
    for rank, report in enumerate(pairing_reports):
        assert report["plan"] == ["SGLang's CustomAllreduce (ROCm)", False], report
        assert all(call["equal"] and not call["nan"] for call in report["calls"]), (rank, report["calls"])
        assert report["mixed_reads"] == 0, report
        assert report["eager_runs"].get("capture_failed", 0) >= 1 and report["replays"] >= 2, report
    assert pairing_reports[0]["eager_runs"] == pairing_reports[1]["eager_runs"]  # the same path on both ranks
    assert [report["failures"] for report in pairing_reports] == [0, 1]  # the serving replay's, on rank 1 alone


@pytest.mark.slow
@needs_sglang
def test_ranks_that_plan_their_all_reduce_differently_all_turn_graphs_off(pairing_reports: list[dict]) -> None:
    """SGLang's custom all-reduce disabled on rank 1 alone: rank 1 cannot capture, so neither does rank 0
    (it would wait for rank 1 in its first capture's agreement)."""
    assert [report["disagreeing_plans_serve_graphs"] for report in pairing_reports] == [False, False]


@needs_sglang
def test_a_replay_launch_that_raises_where_eager_does_not_pair_fails_the_call(tmp_path: Path) -> None:
    """Under SGLang's own custom all-reduce a replay whose launch raised after the ranks agreed to
    launch cannot be served eagerly on this rank (its peers' replays wait for this rank's): the call
    fails, saying why, and SGLang's eager blocks never run it. A rank alone here (world of one)."""
    sys.path[:0] = [str(HERE / "sglang_support")]
    from custom_all_reduce import sglang_custom_allreduce
    from test_graph_runner import StandInGraphs, stand_in_capturing

    from rocm_vit.integrations.sglang import graph_runner

    environ = {"SGLANG_VIT_ENABLE_CUDA_GRAPH": "1", "SGLANG_VIT_CUDA_GRAPH_MIN_HITS": "1",
               "SGLANG_VIT_CUDA_GRAPH_PADDING": "0", "ROCM_VIT_PROFILE": "off"}  # fmt: skip
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    saved = {name: getattr(graph_runner, name) for name in _PATCHED}
    try:
        group = _sglang_group(0, world_size=1)
        group.ca_comm = sglang_custom_allreduce(group, stand_in_capturing, "rocm")
        with pytest.MonkeyPatch.context() as patch:
            for name, value in environ.items():
                patch.setenv(name, value)
            adapter = _adapter(_toy_vit(), group, graph_runner, StandInGraphs(fail_later_replays=1))
        blocks = adapter._blocks
        calls = _until_captured(adapter, blocks, 16, seed=1)
        eager_calls = blocks.eager_calls
        with pytest.raises(RuntimeError, match="collectives may have run") as raised:
            _call(adapter, blocks, 16, seed=2)
        assert "a later replay failed" in str(raised.value.__cause__)  # the launch's own error
        assert blocks.eager_calls == eager_calls and all(call["equal"] for call in calls)
        assert adapter.stats()["stopped"]
    finally:
        for name, value in saved.items():
            setattr(graph_runner, name, value)
        dist.destroy_process_group()


# The plan, from SGLang's objects --------------------------------------------------------------------


def _plan_group(**communicators: Any) -> Any:
    """A group routed by SGLang's own ``_resolve_outplace_all_reduce_method``, exchanging nothing."""
    from sglang.srt.distributed.parallel_state import GroupCoordinator

    group = types.SimpleNamespace(world_size=2, rank_in_group=0, cpu_group=None, device_group=None, ca_comm=None,
                                  qr_comm=None, pymscclpp_comm=None, pcie_ipc_comm=None,
                                  torch_symm_mem_comm=None)  # fmt: skip
    group.__dict__.update(communicators)
    group._resolve_outplace_all_reduce_method = types.MethodType(
        GroupCoordinator._resolve_outplace_all_reduce_method, group
    )
    return group


def _pynccl() -> Any:
    """SGLang's ``PyNcclCommunicator`` as its ``__init__`` leaves it where it found NCCL."""
    from sglang.srt.distributed.device_communicators.pynccl import PyNcclCommunicator

    pynccl = object.__new__(PyNcclCommunicator)
    pynccl.available, pynccl.disabled = True, True
    return pynccl


@needs_sglang
def test_the_plan_says_which_communicators_pair_an_eager_call_with_a_replay() -> None:
    """SGLang's own custom all-reduce (ROCm, CUDA) reads registered graph inputs at replay and its
    start buffer eagerly: no pairing. Its deterministic variant, aiter's, the quick all-reduce and
    NCCL read the same memory either way."""
    sys.path[:0] = [str(HERE / "sglang_support")]
    from custom_all_reduce import AiterCustomAllreduce, UnknownCustomAllreduce, quick_allreduce, sglang_custom_allreduce

    from rocm_vit.integrations.sglang.all_reduce import plan_all_reduce

    vit = _toy_vit()
    own = _plan_group()
    plans = {
        variant: plan_all_reduce(vit, _plan_group(ca_comm=sglang_custom_allreduce(own, lambda: False, variant)), 256)
        for variant in ("rocm", "cuda", "deterministic")
    }
    plans["aiter"] = plan_all_reduce(vit, _plan_group(ca_comm=AiterCustomAllreduce(own, lambda: False)), 256)
    plans["quick"] = plan_all_reduce(
        vit, _plan_group(qr_comm=quick_allreduce(own, min_bytes=16), pynccl_comm=_pynccl()), 256
    )
    plans["nccl"] = plan_all_reduce(vit, _plan_group(pynccl_comm=_pynccl()), 256)
    plans["unknown"] = plan_all_reduce(vit, _plan_group(ca_comm=UnknownCustomAllreduce(own)), 256)
    pairs = {name: plan.pairs_eager_with_replay for name, plan in plans.items()}
    assert pairs == {"rocm": False, "cuda": False, "deterministic": True, "aiter": True, "quick": True,
                     "nccl": True, "unknown": False}  # fmt: skip
    assert all(plan.problem is None for name, plan in plans.items() if name != "unknown")


@needs_sglang
def test_symmetric_memory_and_flashinfers_all_reduce_are_routed_as_sglang_routes_them() -> None:
    """SGLang's ``GroupCoordinator.all_reduce`` sends what the custom all-reduce declines to PyNccl's
    symmetric memory where it is enabled, and what FlashInfer's workspace takes to FlashInfer, before
    the route ``_resolve_outplace_all_reduce_method`` says: graphs stop where those begin."""
    sys.path[:0] = [str(HERE / "sglang_support")]
    from custom_all_reduce import AiterCustomAllreduce

    from rocm_vit.integrations.sglang.all_reduce import plan_all_reduce

    vit = _toy_vit()  # two all-reduces of [tokens, 8] fp32: 32 bytes a token
    symmetric = _plan_group(pynccl_comm=_pynccl(), is_symmetric_memory_enabled=lambda: True)
    plan = plan_all_reduce(vit, symmetric, 256)
    assert "symmetric memory" in plan.problem, plan
    symmetric.ca_comm = AiterCustomAllreduce(_plan_group(), lambda: False, max_size=32 * 64)
    assert (plan_all_reduce(vit, symmetric, 256).max_tokens, plan_all_reduce(vit, symmetric, 256).problem) == (64, None)
    flashinfer = _plan_group(pynccl_comm=_pynccl(), _fi_workspace_hint="attn_tp")
    flashinfer._can_use_flashinfer_allreduce = lambda tensor: tensor.shape[0] <= 128
    assert "FlashInfer's all-reduce" in plan_all_reduce(vit, flashinfer, 256).problem
    flashinfer._can_use_flashinfer_allreduce = lambda tensor: tensor.tolist()  # raises: cannot tell on meta
    assert "FlashInfer's all-reduce" in plan_all_reduce(vit, flashinfer, 256).problem
    flashinfer._fi_workspace_hint = None  # a group given no workspace: NCCL through PyNccl
    assert plan_all_reduce(vit, flashinfer, 256).problem is None


# The runner's agreement before a launch ---------------------------------------------------------------


@pytest.mark.parametrize("agree_before_replay", [False, True])
def test_a_replay_is_agreed_before_its_launch_only_where_asked(generator: torch.Generator,
                                                               agree_before_replay: bool) -> None:  # fmt: skip
    """A communicator whose eager call pairs with a replay costs a serving replay no agreement; one
    that does not costs one, and another rank's failure there launches nothing on this one."""
    sys.path[:0] = [str(HERE)]
    import test_graph_runner as support

    from rocm_vit.attention import get_backend
    from rocm_vit.graphs import RunnerOptions, ViTGraphRunner
    from rocm_vit.graphs.forward import PeerReplayNotReady

    agreements: list[list[int]] = []
    peer_failed = False

    def agree(values: Any) -> list[int]:  # another rank that agrees, unless it failed before its launch
        agreements.append(list(values))
        return [1] if peer_failed and len(values) == 1 else list(values)

    mechanism = support.StandInGraphs()
    runner = ViTGraphRunner(support._toy_forward_blocks, get_backend("sdpa").layout_args, RunnerOptions(min_hits=1),
                            mechanism=mechanism, agree_max=agree, agree_before_replay=agree_before_replay)  # fmt: skip
    layout = support._layout((1, 4, 4))
    support._run_checked(runner, layout, generator)  # captured, verified
    before = len(agreements)
    support._run_checked(runner, layout, generator)  # a serving replay
    assert agreements[before:] == ([[0]] if agree_before_replay else [])
    if agree_before_replay:
        peer_failed, replays = True, mechanism.events.count("replay")
        x, cos, sin = support._inputs(layout, generator)
        with pytest.raises(PeerReplayNotReady):
            runner.run(x, layout, cos, sin)
        assert mechanism.events.count("replay") == replays  # nothing launched


def test_the_doctor_names_what_sglang_routes_before_the_custom_all_reduce() -> None:
    from rocm_vit.integrations.sglang.status import all_reduce_verdict

    for platform, environ in (("rocm", {}), ("cuda", {"SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2": "0"})):
        verdict = all_reduce_verdict(environ, platform)
        assert "--enable-symm-mem" in verdict and "--flashinfer-allreduce-fusion-backend" in verdict, verdict
        assert "ViT graphs are off under TP" in verdict.split("--enable-symm-mem")[1], verdict
    assert "agreed by the ranks before its launch" in all_reduce_verdict({"SGLANG_USE_AITER_AR": "0"}, "rocm")
    assert "agreed" not in all_reduce_verdict({"SGLANG_USE_1STAGE_ALLREDUCE": "1"}, "rocm")
