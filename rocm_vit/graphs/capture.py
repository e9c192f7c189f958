"""The graph mechanism the runner drives: real CUDA/HIP graphs, behind a small seam.

The runner's policy (keys, admission, staging, budget, failure handling) is tested on CPU by swapping
this mechanism for a stand-in; everything the GPU must do lives here, in a handful of lines.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch

logger = logging.getLogger(__name__)


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
        """Run the block's device work on ``stream``, after the caller's pending work, and make the
        caller's later work wait for it: callers on any stream see the runner's work in order."""

    def current_stream(self, device: torch.device) -> Any:
        """The caller's current stream on ``device``: where a replay and its staging copies run."""

    def mark(self, stream: Any, marker: Any) -> Any:
        """A marker recorded on ``stream`` after the work enqueued so far (``marker`` reused when not None)."""

    def follow(self, stream: Any, marker: Any) -> None:
        """Make work enqueued later on ``stream`` wait until ``marker`` is reached on the device."""

    def warm_up(self, fn: Callable[[], torch.Tensor]) -> None:
        """Run ``fn`` eagerly on the current (runner) stream: kernels compile before a capture."""

    def capture(self, fn: Callable[[], torch.Tensor], pool: Any, stream: Any) -> tuple[Any, torch.Tensor]:
        """Capture ``fn`` into a new graph on ``stream`` in ``pool``; return graph and static output."""

    def replay(self, graph: Any) -> None:
        """Replay ``graph`` on the current stream."""

    def pool_bytes(self, pool: Any, device: torch.device) -> int:
        """Bytes the allocator reserves for ``pool`` now."""

    def release_pools(self, pools: list[Any], device: torch.device) -> None:
        """Give the memory of ``pools`` back to the device; no graph uses them any more."""


class CudaGraphs:
    """``torch.cuda`` graphs (CUDA and HIP): thread-local capture into one shared pool.

    ``capture_error_mode`` is torch's: "thread_local" (the default, and what serving needs: other
    threads may launch, allocate and read values back meanwhile) or "global", for tests that show why.
    """

    def __init__(self, capture_error_mode: str = "thread_local") -> None:
        self.capture_error_mode = capture_error_mode

    def available(self, device: torch.device) -> bool:
        return device.type == "cuda" and torch.cuda.is_available()

    def total_memory(self, device: torch.device) -> int:
        return torch.cuda.get_device_properties(device).total_memory

    def new_pool(self, device: torch.device) -> Any:
        with torch.cuda.device(device):
            return torch.cuda.graph_pool_handle()

    def new_stream(self, device: torch.device) -> Any:
        return torch.cuda.Stream(device)

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

    def warm_up(self, fn: Callable[[], torch.Tensor]) -> None:
        fn()

    def capture(self, fn: Callable[[], torch.Tensor], pool: Any, stream: Any) -> tuple[Any, torch.Tensor]:
        graph = torch.cuda.CUDAGraph()
        caller_stream = torch.cuda.current_stream(stream.device)
        try:
            with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode=self.capture_error_mode):
                output = fn()
        except BaseException:
            _clean_up_failed_capture(pool, stream.device, caller_stream)
            raise
        return graph, output

    def replay(self, graph: Any) -> None:
        graph.replay()

    def pool_bytes(self, pool: Any, device: torch.device) -> int:
        pool_id = tuple(pool)
        segments = torch.cuda.memory_snapshot()
        return sum(
            segment["total_size"]
            for segment in segments
            if tuple(segment.get("segment_pool_id", ())) == pool_id and segment["device"] == device.index
        )

    def release_pools(self, pools: list[Any], device: torch.device) -> None:
        # The allocator frees pools that no graph uses only when its cache is emptied, which frees
        # them all at once. Rare: the runner releases its pools only when the budget demands it.
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def _clean_up_failed_capture(pool: Any, device: torch.device, caller_stream: Any) -> None:
    """Undo what a capture that failed half-way leaves behind.

    When the capture is invalidated (a sync or an illegal call inside it), ``capture_end`` raises
    before the allocator stops routing the capture stream's allocations to the pool and before the
    stream context is left. Seen on torch 2.11 (H200): every later capture into that pool failed
    with "beginAllocateToPool: already recording to mempool_id". The runner also moves on to a fresh
    pool after a failure; this restores the caller's stream and ends the pool recording.
    """
    torch.cuda.set_stream(caller_stream)
    try:
        torch._C._cuda_endAllocateToPool(device.index, tuple(pool))
    except RuntimeError as error:  # the capture had already ended cleanly
        logger.debug("no pool recording to end after the failed capture: %s", error)
