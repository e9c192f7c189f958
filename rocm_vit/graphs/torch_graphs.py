"""torch's graph API behind the small seam the runner drives (``GraphMechanism``): CUDA/HIP graphs
(``CudaGraphs``), and a host stand-in on the CPU (``HostGraphs``).

Invariants: captures use ``capture_begin``/``capture_end`` on the runner's stream, never ``torch.cuda.graph``;
a warm-up allocates in its capture's pool; pools are released by emptying the cache, never by freeing a
``MemPool``. Evidence: docs/design.md, "Hazards".
"""

from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch

logger = logging.getLogger(__name__)

# Retired graphs destroyed together: on ROCm each destruction syncs the device (docs/rocm.md, "Hazards").
_RETIRED_GRAPHS_KEPT = 256


class GraphMechanism(Protocol):
    """What the runner needs from a graph API."""

    def available(self, device: torch.device) -> bool:
        """Whether graphs can be captured for tensors on ``device``."""

    def total_memory(self, device: torch.device) -> int:
        """The device's memory in bytes (the default budget is a fraction of it)."""

    def new_pool(self, device: torch.device) -> Any:
        """A memory pool that every graph of one runner captures into."""

    def new_stream(self, device: torch.device) -> Any:
        """The runner's capture stream: warm-up and capture run on it (replays run on the caller's)."""

    def on_stream(self, stream: Any) -> contextlib.AbstractContextManager:
        """Run the block on ``stream`` after the caller's pending work; the caller's later work waits for it."""

    def current_stream(self, device: torch.device) -> Any:
        """The caller's current stream on ``device``: where a replay and its staging copies run."""

    def mark(self, stream: Any, marker: Any) -> Any:
        """A marker recorded on ``stream`` after the work enqueued so far (``marker`` reused when not None)."""

    def follow(self, stream: Any, marker: Any) -> None:
        """Make work enqueued later on ``stream`` wait until ``marker`` is reached on the device."""

    def warm_up(self, fn: Callable[[], torch.Tensor], pool: Any, stream: Any) -> torch.Tensor:
        """Run ``fn`` eagerly on ``stream`` allocating in ``pool`` (kernels compile); the first replay must equal it."""

    def capture(self, fn: Callable[[], torch.Tensor], pool: Any, stream: Any) -> tuple[Any, torch.Tensor]:
        """Capture ``fn`` into a new graph on ``stream`` in ``pool``; return graph and static output."""

    def replay(self, graph: Any) -> None:
        """Replay ``graph`` on the current stream."""

    def retire(self, graph: Any) -> None:
        """``graph`` will never replay again: let go of it and of its hold on its pool."""

    def pool_bytes(self, pool: Any, device: torch.device) -> int:
        """Bytes the allocator reserves for ``pool`` now."""

    def release_pools(self, pools: list[Any], device: torch.device) -> None:
        """Give the memory of ``pools`` back to the device; every graph of them is retired."""


class Marker:
    """One marker behind a runner's last device work, on the stream it ran on: work on another
    stream waits for it before touching staging or pool memory (docs/design.md, "Streams and threads")."""

    def __init__(self, mechanism: GraphMechanism) -> None:
        self._mechanism = mechanism
        self._marker: Any = None
        self._stream: Any = None

    def follow(self, stream: Any) -> None:
        """Order ``stream`` after the last marked work, when that ran on another stream."""
        if self._marker is not None and stream != self._stream:
            self._mechanism.follow(stream, self._marker)

    def mark(self, stream: Any) -> None:
        """Mark the work enqueued on ``stream`` so far as the runner's last."""
        self._marker = self._mechanism.mark(stream, self._marker)
        self._stream = stream


class CudaGraphs:
    """``torch.cuda`` graphs (CUDA and HIP): thread-local capture into one shared pool, without a device sync.

    ``capture_error_mode``: "thread_local" (serving: other threads keep working) or "global" (tests).
    """

    def __init__(self, capture_error_mode: str = "thread_local") -> None:
        self.capture_error_mode = capture_error_mode
        self._retired: list[Any] = []
        # Pools a warm-up registered: each keeps one use until released (the allocator asserts on reuse).
        self._held_pools: set[tuple[int, int]] = set()

    def available(self, device: torch.device) -> bool:
        return device.type == "cuda" and torch.cuda.is_available()

    def total_memory(self, device: torch.device) -> int:
        return torch.cuda.get_device_properties(device).total_memory

    def new_pool(self, device: torch.device) -> Any:
        with torch.cuda.device(device):
            return torch.cuda.graph_pool_handle()

    def new_stream(self, device: torch.device) -> Any:
        stream = torch.cuda.Stream(device)
        with torch.cuda.stream(stream):
            prime_blas(device)
        return stream

    @contextlib.contextmanager
    def on_stream(self, stream: Any) -> Iterator[None]:
        caller = torch.cuda.current_stream(stream.device)
        stream.wait_stream(caller)  # the caller's inputs are written
        with torch.cuda.stream(stream):
            yield
        caller.wait_stream(stream)  # the caller reads what the runner wrote only once it is there

    def current_stream(self, device: torch.device) -> Any:
        return torch.cuda.current_stream(device)

    def mark(self, stream: Any, marker: Any) -> Any:
        # One event re-recorded on every replay: a wait takes the record that precedes it.
        marker = marker or torch.cuda.Event()
        marker.record(stream)
        return marker

    def follow(self, stream: Any, marker: Any) -> None:
        stream.wait_event(marker)

    def warm_up(self, fn: Callable[[], torch.Tensor], pool: Any, stream: Any) -> torch.Tensor:
        pool_id, device_index = tuple(pool), stream.device.index
        # Only this thread's allocations: other threads keep the ordinary cache meanwhile.
        torch._C._cuda_beginAllocateCurrentThreadToPool(device_index, pool_id)
        try:
            with torch.cuda.stream(stream):
                return fn()
        finally:
            torch._C._cuda_endAllocateToPool(device_index, pool_id)
            if pool_id in self._held_pools:
                torch._C._cuda_releasePool(device_index, pool_id)
            else:  # the first routing created the pool in the allocator: that use is the runner's
                self._held_pools.add(pool_id)

    def capture(self, fn: Callable[[], torch.Tensor], pool: Any, stream: Any) -> tuple[Any, torch.Tensor]:
        # torch.cuda.graph's body minus its synchronize() and empty_cache(): on_stream already orders it.
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream), _no_cyclic_collection():
            graph.capture_begin(pool=pool, capture_error_mode=self.capture_error_mode)
            try:
                output = fn()
            finally:  # the capture ends whatever happened inside it
                try:
                    graph.capture_end()
                except BaseException:
                    _end_pool_recording(pool, stream.device)
                    raise
        return graph, output

    def replay(self, graph: Any) -> None:
        graph.replay()

    def retire(self, graph: Any) -> None:
        graph.reset()  # frees its executable graph and its hold on the pool, without a device sync
        self._retired.append(graph)
        if len(self._retired) > _RETIRED_GRAPHS_KEPT:
            self._retired.clear()

    def pool_bytes(self, pool: Any, device: torch.device) -> int:
        pool_id = tuple(pool)
        return sum(
            segment["total_size"]
            for segment in _pool_snapshot(pool_id)
            if tuple(segment.get("segment_pool_id", ())) == pool_id and segment["device"] == device.index
        )

    def release_pools(self, pools: list[Any], device: torch.device) -> None:
        # A pool no graph and no hold uses is freed when the allocator's cache is emptied, all at once.
        self._retired.clear()
        for pool_id in map(tuple, pools):
            if pool_id in self._held_pools:
                self._held_pools.discard(pool_id)
                torch._C._cuda_releasePool(device.index, pool_id)
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


class _CollectionPause:
    """Python's cyclic garbage collection off while any thread captures, on again after the last.

    A collection runs on whichever thread allocates, the capturing one too; one there that destroys a
    graph (garbage in a cycle: a dropped tower and its runner refer to each other) invalidates the
    capture ("operation failed due to a previous error during capture"; docs/design.md, "Hazards").
    Reference counting frees everything else as usual; the collector's garbage waits for the next
    collection after the capture."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._captures = 0
        self._was_enabled = False

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._captures == 0:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._captures += 1
        try:
            yield
        finally:
            with self._lock:
                self._captures -= 1
                if self._captures == 0 and self._was_enabled:
                    gc.enable()


_no_cyclic_collection = _CollectionPause()


def _pool_snapshot(pool_id: tuple[int, int]) -> list[dict[str, Any]]:
    """The allocator's segments of ``pool_id``, read inside the serving call after every capture: a
    whole-process snapshot lists a server's every block (with traces) under the GIL, so the pool's
    alone, without traces, where this torch can."""
    options = _snapshot_options()
    if "mempool_id" not in options:
        return torch.cuda.memory_snapshot()
    if "include_traces" in options:
        return torch.cuda.memory_snapshot(mempool_id=pool_id, include_traces=False)
    return torch.cuda.memory_snapshot(mempool_id=pool_id)


@functools.cache
def _snapshot_options() -> frozenset[str]:
    return frozenset(inspect.signature(torch.cuda.memory_snapshot).parameters)


def prime_blas(device: torch.device) -> None:
    """Create the current stream's BLAS workspaces in the ordinary cache, not in a graph pool: BLAS
    keeps one per thread and stream for the process, so one made in a warm-up would hold a block of
    the pool for good."""
    for dtype in (torch.float32, torch.bfloat16):
        a = torch.ones(8, 8, dtype=dtype, device=device)
        torch.nn.functional.linear(a, a, a[0])
        torch.mm(a, a)


def _end_pool_recording(pool_id: tuple[int, int], device: torch.device) -> None:
    """Stop routing allocations to the pool after an invalidated capture (``capture_end`` raised first).

    Else every later capture into it fails "already recording to mempool_id" (torch 2.11).
    """
    try:
        torch._C._cuda_endAllocateToPool(device.index, pool_id)
    except RuntimeError as error:  # the capture had already ended cleanly
        logger.debug("no pool recording to end after the failed capture: %s", error)


@dataclass
class HostGraph:
    """A host graph: its function, run again at every replay."""

    fn: Callable[[], torch.Tensor]


class HostGraphs:
    """A CPU ``GraphMechanism`` whose graphs re-run their function (no memory, streams or failures),
    for ``bench-traffic``'s simulation and the tests' stand-in."""

    def available(self, device: torch.device) -> bool:
        return True

    def total_memory(self, device: torch.device) -> int:
        return 141 << 30

    def new_pool(self, device: torch.device) -> object:
        return object()

    def new_stream(self, device: torch.device) -> str:
        return "runner"

    @contextlib.contextmanager
    def on_stream(self, stream: object) -> Iterator[None]:
        yield

    def current_stream(self, device: torch.device) -> str:
        return "caller"

    def mark(self, stream: object, marker: object) -> object:
        return marker

    def follow(self, stream: object, marker: object) -> None:
        pass

    def warm_up(self, fn: Callable[[], torch.Tensor], pool: object, stream: object) -> torch.Tensor:
        return fn()

    def capture(self, fn: Callable[[], torch.Tensor], pool: object, stream: object) -> tuple[HostGraph, torch.Tensor]:
        return HostGraph(fn), fn()

    def replay(self, graph: HostGraph) -> None:
        graph.fn()

    def retire(self, graph: object) -> None:
        pass

    def pool_bytes(self, pool: object, device: torch.device) -> int:
        return 0

    def release_pools(self, pools: list[object], device: torch.device) -> None:
        pass
