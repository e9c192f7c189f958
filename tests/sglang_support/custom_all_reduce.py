"""A stand-in for SGLang's custom all-reduce on a CPU (gloo), with the behaviour rocm-vit must live with.

Read from SGLang 0.5.23 ``sglang/srt/distributed/device_communicators/custom_all_reduce.py``
(``CustomAllreduce``: ``capture``, ``register_graph_buffers``, ``should_custom_ar``,
``custom_all_reduce``) and aiter c16d44b93a52 (the commit SGLang's ROCm Dockerfile pins)
``aiter/dist/device_communicators/custom_all_reduce.py`` (``CustomAllreduce.capture``: ``flush_graph_buffers``
on exit; ``custom_all_reduce``) with ``csrc/include/custom_all_reduce.cuh``
(``check_rank_data_capacity``). What both do, and this does:

- inside ``capture()``, a call on a stream that is not capturing (a warm-up) returns
  ``torch.zeros_like(input)``: "mimic the allocation pattern since custom allreduce is out-of-place";
- a call while the stream captures records its input for registration ("registered" mode) and computes
  nothing now (a capture runs no kernel); outside ``capture()`` a captured call copies its input into
  the buffer registered at start ("copy-in", ``registered=False``) and registers nothing;
- leaving ``capture()`` registers the recorded inputs with every peer: a blocking exchange over the
  group (SGLang: ``broadcast_object_list`` from each rank; aiter: a store read per rank), which waits
  for every rank of the group;
- the table of registered inputs is bounded: ``rank_data`` is 8 MiB of 64-byte ``RankData`` entries
  (eight pointers each, whatever the world size) in aiter, 131,072 entries; a registration past it raises
  ``RuntimeError("Rank data buffer is overflowed by N")``, and registrations are never taken back;
- ``should_custom_ar``: a multiple of 16 bytes, weakly contiguous, at most ``max_size`` bytes.

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

# aiter: rank_data = torch.empty(8 * 1024 * 1024, uint8); RankData holds 8 pointers (64 bytes).
RANK_DATA_ENTRIES = (8 << 20) // 64
# SGLang's CustomAllreduce._MAX_CAR_SIZE on ROCm (2 * 8192 * 1024 bytes).
MAX_SIZE = 2 * 8192 * 1024


class StandInCustomAllreduce:
    """``group.ca_comm`` for a gloo group: SGLang's and aiter's contract, computed with ``dist.all_reduce``."""

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


def route_cpu_all_reduces_through_ca_comm() -> None:
    """On a GPU, SGLang's ``GroupCoordinator.all_reduce`` sends what ``ca_comm.should_custom_ar``
    takes to ``ca_comm.custom_all_reduce`` (``_resolve_outplace_all_reduce_method`` -> "ca" ->
    ``_all_reduce_out_place``); for CPU tensors it goes straight to ``torch.distributed``. This makes
    the CPU path take the GPU's choice, through SGLang's own ``_all_reduce_out_place``."""
    from sglang.srt.distributed.parallel_state import GroupCoordinator

    def all_reduce(self: GroupCoordinator, input_: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return input_
        ca_comm = self.ca_comm
        if ca_comm is not None and not ca_comm.disabled and ca_comm.should_custom_ar(input_):
            return self._all_reduce_out_place(input_, "ca")
        dist.all_reduce(input_, group=self.device_group)
        return input_

    GroupCoordinator.all_reduce = all_reduce
