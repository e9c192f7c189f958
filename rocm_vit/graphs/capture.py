"""The graph mechanism the runner drives: real CUDA/HIP graphs, behind a small seam.

The runner's policy (keys, admission, buffers, failure handling) is tested on CPU by swapping this
mechanism for a stand-in; everything the GPU must do lives here, in a handful of lines.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

import torch

logger = logging.getLogger(__name__)


class GraphMechanism(Protocol):
    """What the runner needs from a graph API."""

    def available(self, device: torch.device) -> bool:
        """Whether graphs can be captured for tensors on ``device``."""

    def new_pool(self, device: torch.device) -> Any:
        """A memory pool that every graph of one runner captures into."""

    def new_stream(self, device: torch.device) -> Any:
        """The side stream used for warm-up and capture (libraries keep per-stream state)."""

    def warm_up(self, fn: Callable[[], torch.Tensor], stream: Any) -> None:
        """Run ``fn`` eagerly on ``stream``, ordered after the caller's current stream."""

    def capture(self, fn: Callable[[], torch.Tensor], pool: Any, stream: Any) -> tuple[Any, torch.Tensor]:
        """Capture ``fn`` into a new graph on ``stream`` in ``pool``; return graph and static output."""

    def replay(self, graph: Any) -> None:
        """Replay ``graph`` on the caller's current stream."""

    def pool_bytes(self, pool: Any, device: torch.device) -> int:
        """Bytes the allocator reserves for ``pool`` now."""


class CudaGraphs:
    """``torch.cuda`` graphs (CUDA and HIP): thread-local capture into one shared pool."""

    def available(self, device: torch.device) -> bool:
        return device.type == "cuda" and torch.cuda.is_available()

    def new_pool(self, device: torch.device) -> Any:
        with torch.cuda.device(device):
            return torch.cuda.graph_pool_handle()

    def new_stream(self, device: torch.device) -> Any:
        return torch.cuda.Stream(device)

    def warm_up(self, fn: Callable[[], torch.Tensor], stream: Any) -> None:
        stream.wait_stream(torch.cuda.current_stream(stream.device))
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream(stream.device).wait_stream(stream)

    def capture(self, fn: Callable[[], torch.Tensor], pool: Any, stream: Any) -> tuple[Any, torch.Tensor]:
        graph = torch.cuda.CUDAGraph()
        caller_stream = torch.cuda.current_stream(stream.device)
        try:
            # thread_local: other threads may keep launching work (and allocating) while this one captures.
            with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
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
