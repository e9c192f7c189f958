"""Stand-ins for the all-reduces SGLang picks, on a CPU (gloo), with the behaviour rocm-vit must live with.

Read from SGLang 0.5.23 ``sglang/srt/distributed/device_communicators/custom_all_reduce.py``
(``CustomAllreduce``, ``dispatch_custom_allreduce``), ``quick_all_reduce.py``, and aiter c16d44b93a52
(the commit SGLang's ROCm Dockerfile pins) ``aiter/dist/device_communicators/custom_all_reduce.py``
with ``csrc/include/custom_all_reduce.cuh``. ``AiterCustomAllreduce`` (aiter's, ROCm's default):

- inside ``capture()``, a call on a stream that is not capturing (a warm-up) returns
  ``torch.zeros_like(input)``: "mimic the allocation pattern since custom allreduce is out-of-place";
- a call while the stream captures records its input for registration ("registered" mode) and computes
  nothing now (a capture runs no kernel); outside ``capture()`` a captured call copies its input into
  the buffer registered at start ("copy-in", ``registered=False``) and registers nothing;
- leaving ``capture()`` registers the recorded inputs with every peer: a blocking exchange over the
  group (a store read per rank), which waits for every rank of the group;
- the table of registered inputs is bounded: ``rank_data`` is 8 MiB of 64-byte ``RankData`` entries
  (eight pointers each, whatever the world size), 131,072 entries; a registration past it raises
  ``RuntimeError("Rank data buffer is overflowed by N")``, and registrations are never taken back;
- ``should_custom_ar``: a multiple of 16 bytes, weakly contiguous, at most ``max_size`` bytes.

``sglang_custom_allreduce`` (SGLang's own, on the real class) differs where it matters: a captured
call, inside ``capture()`` or not, reads a slot only ``capture()``'s exit fills, and a replay reads
the peers' registered graph inputs where an eager call reads their start buffer (mixed: NaN);
``gpu_sglang_custom_allreduce`` keeps that contract on a GPU, under real CUDA graphs. ``quick_allreduce``
and ``UnknownCustomAllreduce`` complete the set rocm-vit identifies (``integrations/sglang/all_reduce.py``).

A call that runs (eager, or a replay of the CPU stand-in graphs, which re-run the captured function)
reduces for real over the group's gloo device group. ``capturing`` says whether the caller's stream
captures (``torch.cuda.is_current_stream_capturing`` on a GPU): the stand-in graphs' own flag.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from test_graph_runner import stand_in_graph_slots

# aiter: rank_data = torch.empty(8 * 1024 * 1024, uint8); RankData holds 8 pointers (64 bytes).
RANK_DATA_ENTRIES = (8 << 20) // 64
# SGLang's CustomAllreduce._MAX_CAR_SIZE on ROCm (2 * 8192 * 1024 bytes).
MAX_SIZE = 2 * 8192 * 1024


class AiterCustomAllreduce:
    """aiter's ``CustomAllreduce`` as ``group.ca_comm`` of a gloo group, computed with ``dist.all_reduce``.

    aiter cannot be installed here: the class declares aiter's module and name, which is what
    rocm-vit identifies it by. A captured call outside ``capture()`` copies its input into the pool
    registered at start (aiter looks there before it looks at the stream): at replay it reduces."""

    __module__ = "aiter.dist.device_communicators.custom_all_reduce"
    __qualname__ = "CustomAllreduce"

    def __init__(
        self,
        group: Any,
        capturing: Callable[[], bool],
        max_size: int = MAX_SIZE,
        table_entries: int = RANK_DATA_ENTRIES,
    ) -> None:
        self.disabled = False
        self.max_size = max_size
        self.world_size = group.world_size
        self._group = group  # SGLang's GroupCoordinator: cpu_group for the exchange, device_group to reduce
        self._capturing = capturing
        self._table_entries = table_entries
        self._IS_CAPTURING = False
        self._pending: list[int] = []  # inputs recorded in "registered" mode since capture() began
        self.registered = 0  # entries taken in the table, for good
        self.exchanges = 0  # blocking registrations among the ranks (one per capture() exit)
        self.warm_up_zeros = 0  # calls answered with zeros inside capture() on a stream not capturing
        self.captured_calls = {"registered": 0, "copy_in": 0}

    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        try:
            self._IS_CAPTURING = True
            yield
        finally:
            self._IS_CAPTURING = False
            if not self.disabled:
                self.register_graph_buffers()

    def register_graph_buffers(self) -> None:
        """Every rank's recorded inputs, exchanged with every rank (blocking), then put in the table."""
        mine, self._pending = self._pending, []
        gathered: list[Any] = [None] * self.world_size
        for index, rank in enumerate(sorted(dist.get_process_group_ranks(self._group.cpu_group))):
            slot = [mine if rank == dist.get_rank() else None]
            dist.broadcast_object_list(slot, src=rank, group=self._group.cpu_group, device="cpu")
            gathered[index] = slot[0]
        self.exchanges += 1
        if len({len(entries) for entries in gathered}) != 1:
            raise RuntimeError(f"ranks registered different numbers of graph buffers: {[len(g) for g in gathered]}")
        over = self.registered + len(mine) - self._table_entries
        if over > 0:
            raise RuntimeError(f"Rank data buffer is overflowed by {over}")
        self.registered += len(mine)

    def should_custom_ar(self, inp: torch.Tensor) -> bool:
        if self.disabled:
            return False
        size = inp.numel() * inp.element_size()
        return size % 16 == 0 and inp.is_contiguous() and size <= self.max_size

    def custom_all_reduce(self, input: torch.Tensor) -> torch.Tensor | None:
        if self.disabled or not self.should_custom_ar(input):
            return None
        if self._capturing():
            mode = "registered" if self._IS_CAPTURING else "copy_in"
            self.captured_calls[mode] += 1
            if self._IS_CAPTURING:
                self._pending.append(input.data_ptr())
            return torch.full_like(input, float("nan"))  # recorded, not run: a replay computes it
        if self._IS_CAPTURING:
            self.warm_up_zeros += 1
            return torch.zeros_like(input)
        output = input.clone()
        dist.all_reduce(output, group=self._group.device_group)
        return output


def _sglang_classes() -> tuple[type, type]:
    from sglang.srt.distributed.device_communicators.custom_all_reduce import CustomAllreduce
    from sglang.srt.distributed.device_communicators.quick_all_reduce import QuickAllReduce

    return CustomAllreduce, QuickAllReduce


def _set_real_state(comm: Any, group: Any, max_size: int, variant: str) -> None:
    """The state the real ``CustomAllreduce.__init__`` leaves that its methods read, without the IPC
    handles it opens: the CUDA build's ``buffer_ptrs`` (one buffer pointer a rank), ROCm's ``buffer``."""
    comm._IS_CAPTURING = False
    comm.disabled = False
    comm.original_disabled = False
    comm.tms_cudagraph = False
    comm._ptr = 0
    comm.use_amd_deterministic_impl = variant == "deterministic"
    if variant == "cuda":
        comm.buffer_ptrs = [0] * group.world_size
    else:
        comm.buffer = torch.empty(0, dtype=torch.uint8)
    comm.group = group.cpu_group
    comm.rank = group.rank_in_group
    comm.world_size = group.world_size
    comm.max_size = max_size
    comm.full_nvlink = True
    comm._reduce_group = group.device_group


def sglang_custom_allreduce(group: Any, capturing: Callable[[], bool], variant: str, max_size: int = MAX_SIZE) -> Any:
    """SGLang's own ``CustomAllreduce`` (the real class, its ``capture()`` included) on a gloo group.

    ``variant``: "rocm" (``SGLANG_USE_AITER_AR=0``), "deterministic" (ROCm's 1-stage kernel:
    ``SGLANG_USE_1STAGE_ALLREDUCE=1`` or deterministic inference; it takes every size) or "cuda"
    (sgl_kernel's). Read from SGLang 0.5.23 ``custom_all_reduce.py`` and sgl_kernel's
    ``custom_all_reduce`` (HIP and CUDA): a kernel launched while the stream captures, inside
    ``capture()`` or not, is pointed at the next empty ``rank_data`` slot and its input queued;
    ``capture()``'s exit exchanges the queued inputs with every rank (blocking) and fills the slots.
    A replay that reads a slot nobody filled reads garbage pointers: NaN here (on a device, garbage
    or a fault). Inside ``capture()`` a call on a stream that is not capturing returns zeros.

    A replay reads each peer's input where the peer registered it at capture (``all_reduce_reg``,
    ``registered=True``); an eager call copies its input into the buffer registered at start and
    reads the peers' there (``all_reduce_unreg``), as does every call of the deterministic variant.
    A replay on one rank with an eager call on another reads what the other left where it is not
    now: each reduces stale data, NaN here on every rank (``mixed_reads``), never a hang."""
    base, _ = _sglang_classes()

    class SGLangCustomAllreduce(base):
        def __init__(self) -> None:  # the real __init__ opens IPC handles: only its state is set here
            _set_real_state(self, group, max_size, variant)
            self.rank_data = torch.empty(max_size, dtype=torch.uint8)  # 64-byte entries
            self._capturing = capturing
            self._pending: list[dict] = []
            self.registered = 0
            self.exchanges = 0
            self.warm_up_zeros = 0
            self.empty_slot_reads = 0
            self.mixed_reads = 0
            self.captured_calls = {"registered": 0, "copy_in": 0}

        def should_custom_ar(self, inp: torch.Tensor) -> bool:
            size = inp.numel() * inp.element_size()
            if self.disabled or size % 16 or not inp.is_contiguous():
                return False
            return self.use_amd_deterministic_impl or size <= self.max_size

        def register_graph_buffers(self) -> None:
            mine, self._pending = self._pending, []
            counts: list[Any] = [None] * self.world_size
            for index, rank in enumerate(sorted(dist.get_process_group_ranks(self.group))):
                slot = [len(mine) if rank == dist.get_rank() else None]
                dist.broadcast_object_list(slot, src=rank, group=self.group, device="cpu")
                counts[index] = slot[0]
            self.exchanges += 1
            over = self.registered + len(mine) - self.rank_data.numel() // 64
            if over > 0:
                raise RuntimeError(f"Rank data buffer is overflowed by {over}")
            self.registered += len(mine)
            for index, slot in enumerate(mine):  # a peer that queued fewer leaves garbage in the rest
                slot["filled"] = index < min(counts)

        def custom_all_reduce(self, input: torch.Tensor) -> torch.Tensor | None:
            if self.disabled or not self.should_custom_ar(input):
                return None
            if self._capturing():  # queued for capture()'s exit, whether inside capture() or not
                slot = {"filled": False}
                self._pending.append(slot)
                stand_in_graph_slots().append(slot)
                self.captured_calls["registered" if self._IS_CAPTURING else "copy_in"] += 1
                return torch.full_like(input, float("nan"))  # recorded, not run
            if self._IS_CAPTURING:
                self.warm_up_zeros += 1
                return torch.zeros_like(input)
            replaying = stand_in_graph_slots()
            if replaying is not None and not next(replaying)["filled"]:
                self.empty_slot_reads += 1
                return torch.full_like(input, float("nan"))
            return self._reduce(input, registered=replaying is not None and not self.use_amd_deterministic_impl)

        def _reduce(self, input: torch.Tensor, registered: bool) -> torch.Tensor:
            """The sum over the group, each rank's mode exchanged beside it: ranks that mixed read stale
            data. The data is reduced alone, as an eager all-reduce of it is: gloo splits a tensor into
            chunks by its length, so one element more would sum it in another order past two ranks,
            where SGLang's kernel sums the same in either mode."""
            modes = torch.tensor([float(registered)])
            dist.all_reduce(modes, group=self._reduce_group)
            output = input.clone()
            dist.all_reduce(output, group=self._reduce_group)
            if modes.item() not in (0, self.world_size):
                self.mixed_reads += 1
                return torch.full_like(input, float("nan"))
            return output

    return SGLangCustomAllreduce()


def gpu_sglang_custom_allreduce(group: Any, max_size: int = 8 << 10) -> Any:
    """SGLang's own ``CustomAllreduce`` on CUDA (the real class, its ``capture()`` included) on a GPU
    group, keeping its capture contract on real CUDA graphs where sgl_kernel's kernels cannot run.

    A call captured while the stream captures, inside ``capture()`` or not, takes the next
    ``rank_data`` slot (a device flag, set only by ``capture()``'s exit, after a blocking exchange of
    every rank's count) and records an NCCL all-reduce of its input (the group's PyNccl) whose output
    the slot's flag masks: a replay of a slot nobody filled reads NaN, as SGLang's kernel reads
    garbage pointers. An eager call reduces through ``torch.distributed``; inside ``capture()`` a call
    on a stream not capturing returns zeros. ``max_size`` (8 KiB: a block all-reduce of 16 patches of
    the GPU toy tower) leaves larger all-reduces to PyNccl, so that one graph holds both."""
    base, _ = _sglang_classes()

    class GpuSGLangCustomAllreduce(base):
        def __init__(self) -> None:  # the real __init__ opens IPC handles: only its state is set here
            _set_real_state(self, group, max_size, "cuda")
            self.rank_data = torch.empty(RANK_DATA_ENTRIES * 64, dtype=torch.uint8)  # 64-byte entries
            self._pynccl = group.pynccl_comm
            # One flag a slot, allocated now: a capture must launch nothing that resets it at replay.
            self._filled = torch.zeros(RANK_DATA_ENTRIES, dtype=torch.bool, device=torch.cuda.current_device())
            self._taken = 0  # slots pointed at by captured calls, filled or pending
            self._pending: list[int] = []
            self.registered = 0
            self.exchanges = 0
            self.warm_up_zeros = 0
            self.captured_calls = {"registered": 0, "copy_in": 0}

        def should_custom_ar(self, inp: torch.Tensor) -> bool:
            size = inp.numel() * inp.element_size()
            return not self.disabled and size % 16 == 0 and inp.is_contiguous() and size <= self.max_size

        def register_graph_buffers(self) -> None:
            mine, self._pending = self._pending, []
            counts: list[Any] = [None] * self.world_size
            dist.all_gather_object(counts, len(mine), group=self.group)
            self.exchanges += 1
            over = self.registered + len(mine) - RANK_DATA_ENTRIES
            if over > 0:
                raise RuntimeError(f"Rank data buffer is overflowed by {over}")
            self.registered += len(mine)
            for slot in mine[: min(counts)]:  # a peer that queued fewer leaves the rest empty
                self._filled[slot].fill_(True)

        def unfilled_slots(self) -> int:
            """Slots captured calls point at that no ``capture()`` exit filled."""
            return self._taken - int(self._filled[: self._taken].sum())

        def custom_all_reduce(self, input: torch.Tensor) -> torch.Tensor | None:
            if not self.should_custom_ar(input):
                return None
            if torch.cuda.is_current_stream_capturing():
                slot, self._taken = self._taken, self._taken + 1
                self._pending.append(slot)
                self.captured_calls["registered" if self._IS_CAPTURING else "copy_in"] += 1
                with self._pynccl.change_state(enable=True):
                    reduced = self._pynccl.outplace_all_reduce(input)
                return reduced.masked_fill_(self._filled[slot].logical_not(), float("nan"))
            if self._IS_CAPTURING:
                self.warm_up_zeros += 1
                return torch.zeros_like(input)
            output = input.clone()
            dist.all_reduce(output, group=self._reduce_group)
            return output

    return GpuSGLangCustomAllreduce()


def quick_allreduce(group: Any, min_bytes: int) -> Any:
    """SGLang's ``QuickAllReduce`` (the real class) on a gloo group: buffers exchanged at start, so a
    call captured anywhere is its eager call and a replay reduces. It takes inputs from ``min_bytes``
    up (SGLang's ``_QR_MIN_SIZE`` per dtype and world size; any dtype here, as the CPU tower is fp32)."""
    _, base = _sglang_classes()

    class StandInQuickAllReduce(base):
        def __init__(self) -> None:
            self.disabled = False
            self._ptr = 0
            self.calls = 0
            self._reduce_group = group.device_group

        def should_quick_allreduce(self, inp: torch.Tensor) -> bool:
            size = inp.numel() * inp.element_size()
            return size % 16 == 0 and inp.is_contiguous() and size >= min_bytes

        def quick_all_reduce(self, inp: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
            self.calls += 1
            output = inp.clone()
            dist.all_reduce(output, group=self._reduce_group)
            return output

    return StandInQuickAllReduce()


class UnknownCustomAllreduce:
    """A custom all-reduce rocm-vit does not know (declared as CUDA's ``CustomAllReduceV2``)."""

    __module__ = "sglang.srt.distributed.device_communicators.custom_all_reduce_v2"
    __qualname__ = "CustomAllReduceV2"

    def __init__(self, group: Any) -> None:
        self.disabled = False
        self._reduce_group = group.device_group

    def should_custom_ar(self, inp: torch.Tensor) -> bool:
        return True

    def custom_all_reduce(self, input: torch.Tensor) -> torch.Tensor:
        output = input.clone()
        dist.all_reduce(output, group=self._reduce_group)
        return output


def route_cpu_all_reduces_through_ca_comm() -> None:
    """On a GPU, SGLang's ``GroupCoordinator.all_reduce`` sends an all-reduce where
    ``_resolve_outplace_all_reduce_method`` says ("ca": ``ca_comm``, "qr": ``qr_comm``, ...) through
    ``_all_reduce_out_place``; for CPU tensors it goes straight to ``torch.distributed``. This makes
    the CPU path take the GPU's choice, through SGLang's own two functions."""
    from sglang.srt.distributed.parallel_state import GroupCoordinator

    def all_reduce(self: GroupCoordinator, input_: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return input_
        method = self._resolve_outplace_all_reduce_method(input_)
        if method is not None:
            return self._all_reduce_out_place(input_, method)
        dist.all_reduce(input_, group=self.device_group)
        return input_

    GroupCoordinator.all_reduce = all_reduce
