"""What a graph capture needs from the all-reduce SGLang picked for a tensor-parallel tower.

Each communicator is identified from the object on SGLang's group (``ca_comm``, ``qr_comm``,
``pynccl_comm``), and each of the tower's all-reduces is routed as SGLang 0.5.23's
``GroupCoordinator.all_reduce`` routes it: symmetric memory, then FlashInfer's all-reduce, then
``_resolve_outplace_all_reduce_method``. aiter's ``CustomAllreduce`` and ``QuickAllReduce`` capture
anywhere as their eager call; SGLang's own ``CustomAllreduce`` must capture inside its ``capture()``
(``RegisteringScope``), and its replay reads the peers' registered graph inputs while an eager call
reads their start buffer: the two do not pair (``pairs_eager_with_replay``), except in its
deterministic 1-stage variant, which always copies through the start buffer. NCCL/RCCL is captured
through SGLang's PyNccl where it found NCCL. Anything else (``CustomAllReduceV2``, PCIe-IPC,
MSCCL++, symmetric memory, FlashInfer's all-reduce) is not known: graphs are off under TP, with the
reason. The ranks agree on the plan (``agreed_plan``). docs/sglang.md, "Parallel serving", says why.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rocm_vit.graphs.ranks import AgreeMax

logger = logging.getLogger(__name__)

_AITER = ("aiter.dist.device_communicators.custom_all_reduce", "CustomAllreduce")
_SGLANG = ("sglang.srt.distributed.device_communicators.custom_all_reduce", "CustomAllreduce")
_QUICK = ("sglang.srt.distributed.device_communicators.quick_all_reduce", "QuickAllReduce")
# SGLang's rank_data holds one RankData (8 device pointers) per registered graph input.
_RANK_DATA_ENTRY_BYTES = 64

CaptureScope = Callable[[], contextlib.AbstractContextManager]


@dataclass(frozen=True)
class AllReducePlan:
    """How the tower's graphs are captured under one group.

    ``communicator``: what serves the all-reduces, named from the objects. ``max_tokens``: the most
    patches whose every all-reduce goes to a communicator rocm-vit captures. ``capture_scope``: the
    context a capture must run inside (SGLang's ``ca_comm.capture``), or ``None``. ``problem``: why
    graphs are off under this group, or ``None``. ``pairs_eager_with_replay``: whether an eager
    all-reduce on one rank pairs with a replay's on the others; where not, no rank may serve a call
    eagerly while the others replay it (the ranks agree before each launch).
    """

    communicator: str
    max_tokens: int = 0
    capture_scope: CaptureScope | None = None
    problem: str | None = None
    pairs_eager_with_replay: bool = False


def plan_all_reduce(vit: nn.Module, group: Any, max_tokens: int) -> AllReducePlan:
    """The plan for ``vit``'s all-reduces over ``group`` (SGLang's ``GroupCoordinator``), graphs up
    to ``max_tokens`` patches at most."""
    ca_comm = _enabled(getattr(group, "ca_comm", None))
    qr_comm = _enabled(getattr(group, "qr_comm", None))
    ca_kind = None if ca_comm is None else _kind(ca_comm)
    pynccl_comm = _available(getattr(group, "pynccl_comm", None))
    names = [describe(ca_comm, ca_kind)] if ca_comm is not None else []
    if qr_comm is not None:
        names.append("QuickAllReduce" if _kind(qr_comm) == _QUICK else _class_name(qr_comm))
    if pynccl_comm is not None:
        names.append("PyNccl")
    communicator = " + ".join(names) or "NCCL/RCCL"
    size = group.world_size
    if ca_comm is not None and ca_kind not in (_AITER, _SGLANG):
        return AllReducePlan(communicator, problem=f"the {size}-rank group's {describe(ca_comm, ca_kind)} is not an "
                             "all-reduce rocm-vit knows how to capture")  # fmt: skip
    capturable = {"ca"} if ca_comm is not None else set()
    if qr_comm is not None and _kind(qr_comm) == _QUICK:
        capturable.add("qr")
    if pynccl_comm is not None:
        capturable.add(None)  # the in-place route: PyNccl's, enabled for the capture
    routes = _router(vit, group)
    if not all(route in capturable for route in routes(1)):
        declined = ", ".join(sorted({_ROUTE_NAMES.get(route, str(route)) for route in routes(1)} - capturable))
        problem = f"the {size}-rank group sends the tower's all-reduces to {declined}, which rocm-vit does not capture"
        return AllReducePlan(communicator, problem=problem)
    low, high = 1, max_tokens  # every route of low is captured; find the largest such
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if all(route in capturable for route in routes(middle)) else (low, middle - 1)
    if low < max_tokens:
        logger.info("rocm-vit graph runner: graphs up to %d patches, the limit of %s", low, communicator)
    scopes: list[CaptureScope] = []
    if ca_kind == _SGLANG:
        scopes.append(RegisteringScope(ca_comm, len(_widths(vit))))
    if pynccl_comm is not None:
        scopes.append(functools.partial(pynccl_comm.change_state, enable=True))
    # SGLang's own replays read the peers' registered graph inputs, its eager calls their start buffer.
    pairs = not (ca_kind == _SGLANG and "ca" in routes(1) and not getattr(ca_comm, "use_amd_deterministic_impl", False))
    return AllReducePlan(communicator, low, _nested(scopes), pairs_eager_with_replay=pairs)


def agreed_plan(plan: AllReducePlan, agree: AgreeMax) -> AllReducePlan:
    """``plan`` where every rank of the group made the same one, else graphs off (``problem``): a
    rank without a runner, or one that agrees before its replays where the others do not, would
    leave the others waiting. One agreement, on every rank, before any capture."""
    summary = (plan.communicator, plan.max_tokens, plan.pairs_eager_with_replay, plan.problem is None)
    digest = zlib.crc32(repr(summary).encode())
    another_problem, highest, lowest = agree([int(plan.problem is not None), digest, -digest])
    if plan.problem is not None:
        return plan
    if another_problem:
        return dataclasses.replace(plan, problem="another rank of the group cannot capture its all-reduces")
    if highest != -lowest:
        problem = f"the ranks of the group planned their all-reduces differently (this one: {plan.communicator})"
        return dataclasses.replace(plan, problem=problem)
    return plan


def describe(ca_comm: Any, kind: tuple[str, str] | None = None) -> str:
    """The custom all-reduce named from its object: whose, and SGLang's variant."""
    kind = kind or _kind(ca_comm)
    if kind == _AITER:
        return "aiter's CustomAllreduce"
    if kind == _SGLANG:
        if getattr(ca_comm, "use_amd_deterministic_impl", False):
            return "SGLang's CustomAllreduce (ROCm, deterministic 1-stage)"
        # The HIP build keeps one registered buffer; the CUDA build a pointer per rank (buffer_ptrs).
        return f"SGLang's CustomAllreduce ({'CUDA' if hasattr(ca_comm, 'buffer_ptrs') else 'ROCm'})"
    return f"{_class_name(ca_comm)} ({type(ca_comm).__module__})"


class RegisteringScope:
    """``ca_comm.capture()`` for a communicator that registers each captured input at its exit, in a
    table that never gives an entry back (SGLang's ``rank_data``: 64 bytes an entry). Entering it
    raises, on every rank alike (they capture the same layouts), once one more capture would overflow
    the table: past that a replay would read a slot nobody filled."""

    def __init__(self, ca_comm: Any, entries_per_capture: int) -> None:
        self.ca_comm = ca_comm
        self.entries_per_capture = entries_per_capture
        rank_data = getattr(ca_comm, "rank_data", None)
        table_bytes = rank_data.numel() * rank_data.element_size() if isinstance(rank_data, torch.Tensor) else 0
        self.table_entries = table_bytes // _RANK_DATA_ENTRY_BYTES
        self.entries_taken = 0

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        if self.entries_taken + self.entries_per_capture > self.table_entries:
            raise RuntimeError(
                f"{describe(self.ca_comm)}'s table of graph inputs is full ({self.entries_taken} of "
                f"{self.table_entries} entries, {self.entries_per_capture} a capture)"
            )
        self.entries_taken += self.entries_per_capture
        with self.ca_comm.capture():
            yield


_ROUTE_NAMES = {  # SGLang's route None: the in-place all-reduce
    None: "NCCL/RCCL",
    "symmetric_memory": "PyNccl's symmetric memory (--enable-symm-mem)",
    "flashinfer": "FlashInfer's all-reduce (--flashinfer-allreduce-fusion-backend)",
}


def _router(vit: nn.Module, group: Any) -> Callable[[int], list[str | None]]:
    """``routes(tokens)``: where SGLang sends each of the tower's all-reduces for that many patches."""
    widths = _widths(vit)

    def routes(tokens: int) -> list[str | None]:
        shapes = [(-(-tokens // per), width) for per, width in widths]
        return [_route(group, torch.empty(shape, dtype=vit.dtype, device="meta")) for shape in shapes]

    return routes


def _route(group: Any, tensor: torch.Tensor) -> str | None:
    """Where SGLang 0.5.23's ``GroupCoordinator.all_reduce`` sends ``tensor`` (``parallel_state.py``
    748-781), in its order: PyNccl's symmetric memory where enabled and neither MSCCL++ nor the custom
    all-reduce takes it, FlashInfer's all-reduce on a group given its workspace, then
    ``_resolve_outplace_all_reduce_method`` ("ca", "qr", ... or ``None``, the in-place NCCL one)."""
    mscclpp = getattr(group, "pymscclpp_comm", None)
    takes_mscclpp = mscclpp is not None and mscclpp.should_mscclpp_allreduce(tensor)
    ca_comm = _enabled(getattr(group, "ca_comm", None))
    takes_ca = ca_comm is not None and ca_comm.should_custom_ar(tensor)
    symmetric = getattr(group, "is_symmetric_memory_enabled", None)
    has_pynccl = getattr(group, "pynccl_comm", None) is not None
    if has_pynccl and callable(symmetric) and symmetric() and not (takes_mscclpp or takes_ca):
        return "symmetric_memory"
    flashinfer = getattr(group, "_can_use_flashinfer_allreduce", None)
    if getattr(group, "_fi_workspace_hint", None) is not None and flashinfer is not None:
        try:
            if flashinfer(tensor):
                return "flashinfer"
        except Exception:  # cannot tell from a meta tensor: as if it took it
            return "flashinfer"
    resolve = getattr(group, "_resolve_outplace_all_reduce_method", None)
    return resolve(tensor) if resolve is not None else None


def _widths(vit: nn.Module) -> list[tuple[int, int]]:
    """(patches a row, width) of each all-reduce one forward makes: the row-parallel layers'."""
    merge = vit.spatial_merge_size
    return [
        (merge**2 if "merger" in name else 1, module.output_size)
        for name, module in vit.named_modules()
        if getattr(module, "reduce_results", False) and isinstance(getattr(module, "output_size", None), int)
    ]


def _nested(scopes: list[CaptureScope]) -> CaptureScope | None:
    """One capture scope entering ``scopes`` in order, or ``None`` for none; one alone is itself."""
    if len(scopes) < 2:
        return scopes[0] if scopes else None

    @contextlib.contextmanager
    def scope() -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for each in scopes:
                stack.enter_context(each())
            yield

    return scope


def _available(pynccl_comm: Any) -> Any | None:
    """SGLang's ``PyNcclCommunicator`` where it found NCCL (it is disabled outside graph captures)."""
    return pynccl_comm if pynccl_comm is not None and getattr(pynccl_comm, "available", False) else None


def _enabled(comm: Any) -> Any | None:
    return comm if comm is not None and not getattr(comm, "disabled", True) else None


def _kind(comm: Any) -> tuple[str, str] | None:
    """The known class ``comm`` is (or derives from), as (module, class name)."""
    for cls in type(comm).__mro__:
        kind = (cls.__module__, cls.__qualname__)
        if kind in (_AITER, _SGLANG, _QUICK):
            return kind
    return None


def _class_name(comm: Any) -> str:
    return type(comm).__qualname__
