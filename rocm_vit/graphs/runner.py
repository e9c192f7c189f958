"""ViTGraphRunner: one graph per exact attention layout, one shared pool, a bounded cache, owned outputs.

Why each rule exists (DESIGN.md, Known hazards):
- keys come from host data and carry every segmentation's ``cu_seqlens`` (the full one, and the
  window one of a windowed tower): equal token counts with other image or window boundaries would
  otherwise replay stale attention metadata;
- every graph keeps its own static input, cos/sin, further per-call inputs and ``cu_seqlens``
  buffers (one per segmentation) alive and in place, and copies every per-call tensor in before
  each replay: a shared workspace regrown under a captured graph silently corrupts replies, and
  layouts that share a key may differ in what is not attention metadata (rotary angles, position
  embeddings, a window order);
- keys also carry the dtypes of the per-call tensors: a graph captured with fp32 cos/sin would
  round bf16 ones up and no longer equal the eager result;
- replay returns a clone: graphs share one pool, and a caller holding a static output would see it
  overwritten by the next replay;
- warm-up runs on the capture stream before the first capture: kernel JIT and per-stream library
  handles created inside a capture fail or hang;
- capacity bounds memory: layouts past it run the same ``forward_blocks`` eagerly.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rocm_vit.attention import AttentionBackend
from rocm_vit.graphs.capture import CudaGraphs, GraphMechanism
from rocm_vit.layout import VisionLayout

logger = logging.getLogger(__name__)

# forward_blocks(x, attn_args, cos, sin, *inputs) -> output
ForwardBlocks = Callable[..., torch.Tensor]

EAGER_REASONS = ("over_capacity", "below_min_hits", "over_max_tokens", "capture_failed", "no_gpu")

# Hit counts for layouts not (yet) captured; bounded so a server seeing endless new sizes stays flat.
_MAX_TRACKED_LAYOUTS = 4096


@dataclass
class _Graph:
    """A captured layout: the graph, its static buffers and their addresses at capture time."""

    graph: Any
    x: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    inputs: tuple[torch.Tensor, ...]  # the further per-call tensors, in call order
    cu_seqlens: dict[str, torch.Tensor]  # int32, one per segmentation of the layout
    output: torch.Tensor
    addresses: tuple[int, ...] = ()

    def buffers(self) -> tuple[torch.Tensor, ...]:
        return (self.x, self.cos, self.sin, *self.inputs, *self.cu_seqlens.values(), self.output)


class ViTGraphRunner:
    """Runs ``forward_blocks(x, attn_args, cos, sin, *inputs)`` under graphs keyed by the exact layout.

    ``attn_args`` is ``attention.layout_args(layout, cu_seqlens)``: one backend argument list per
    segmentation of the layout, by name, built on this runner's static ``cu_seqlens`` buffers in a
    graph and on the layout's own tensors in an eager run. ``forward_blocks`` hands each block the
    list of the segmentation it attends within; the runner knows nothing of which block takes which.

    ``run`` returns a tensor owned by the caller. Calls are serialised by a lock; capture is
    thread-local, so other threads may use the GPU meanwhile. Failures never escape ``run`` as long
    as the eager ``forward_blocks`` works: a failed capture is remembered and served eagerly.
    """

    def __init__(
        self,
        forward_blocks: ForwardBlocks,
        attention: AttentionBackend,
        *,
        capacity: int | None = None,
        min_hits: int = 1,
        max_tokens: int | None = None,
        capture_context: Callable[[], contextlib.AbstractContextManager] | None = None,
        mechanism: GraphMechanism | None = None,
    ) -> None:
        if capacity is not None and capacity < 0:
            raise ValueError(f"capacity = {capacity} must be >= 0 or None (unbounded)")
        if min_hits < 1:
            raise ValueError(f"min_hits = {min_hits} must be >= 1")
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"max_tokens = {max_tokens} must be >= 1 or None")
        self.forward_blocks = forward_blocks
        self.attention = attention
        self.capacity = capacity
        self.min_hits = min_hits
        self.max_tokens = max_tokens
        self._capture_context = capture_context or contextlib.nullcontext
        self._mechanism = mechanism or CudaGraphs()
        self._lock = threading.Lock()
        self._graphs: dict[tuple, _Graph] = {}
        self._failed: set[tuple] = set()
        self._hits: OrderedDict[tuple, int] = OrderedDict()
        self._pool: Any = None  # the pool new captures go to
        self._pools: list[Any] = []  # every pool a live graph may use
        self._stream: Any = None
        self._device: torch.device | None = None
        self._captures = 0
        self._replays = 0
        self._capture_seconds = 0.0
        self._eager_runs: Counter[str] = Counter({reason: 0 for reason in EAGER_REASONS})
        self._logged: set[str] = set()

    def run(
        self, x: torch.Tensor, layout: VisionLayout, cos: torch.Tensor, sin: torch.Tensor, *inputs: torch.Tensor
    ) -> torch.Tensor:
        """Forward ``x`` ``[N, ...]`` laid out as ``layout``; ``cos``/``sin`` ``[N, head_dim]``, any dtype.

        ``inputs`` are further tensors ``forward_blocks`` reads (a tower's position-embedding
        indices, say); like ``x``, ``cos`` and ``sin`` each gets a static buffer in a graph, copied
        in before every replay. Returns ``forward_blocks``' output, freshly allocated: no later call
        changes it.
        """
        if x.shape[0] != layout.num_patches:
            raise ValueError(f"x has {x.shape[0]} rows but the layout describes {layout.num_patches} patches")
        tensors = (x, cos, sin, *inputs)
        with self._lock:
            key = (*layout.graph_key, *(t.dtype for t in tensors))
            entry = self._graphs.get(key)
            if entry is not None and self._buffers_in_place(key, entry):
                return self._replay(entry, tensors)
            reason = self._eager_reason(key, layout, x.device)
            if reason is None:
                entry = self._capture(key, layout, tensors)
                if entry is not None:
                    return self._replay(entry, tensors)
                reason = "capture_failed"
            self._eager_runs[reason] += 1
            attn_args = self.attention.layout_args(layout, layout.cu_seqlens_tensors(x.device))
            return self.forward_blocks(x, attn_args, cos, sin, *inputs)

    def stats(self) -> dict[str, Any]:
        """Counters for logs and ``rocm-vit bench``: captures, replays, eager runs by reason, memory."""
        with self._lock:
            pool_bytes = sum(self._mechanism.pool_bytes(pool, self._device) for pool in self._pools)
            return {
                "captures": self._captures,
                "replays": self._replays,
                "eager_runs": dict(self._eager_runs),
                "graphs": len(self._graphs),
                "failed_layouts": len(self._failed),
                "capture_seconds": self._capture_seconds,
                "pool_bytes": pool_bytes,
                "buffer_bytes": sum(t.nbytes for entry in self._graphs.values() for t in entry.buffers()),
            }

    def _eager_reason(self, key: tuple, layout: VisionLayout, device: torch.device) -> str | None:
        if not self._mechanism.available(device):
            self._log_once("no_gpu", "graphs need a CUDA/ROCm device; running %s eagerly", device)
            return "no_gpu"
        if key in self._failed:
            return "capture_failed"
        if self.max_tokens is not None and layout.num_patches > self.max_tokens:
            return "over_max_tokens"
        if self.capacity is not None and len(self._graphs) >= self.capacity:
            self._log_once("over_capacity", "graph cache full (%d graphs); new layouts run eagerly", self.capacity)
            return "over_capacity"
        hits = self._hits.pop(key, 0) + 1
        if hits < self.min_hits:
            self._hits[key] = hits
            if len(self._hits) > _MAX_TRACKED_LAYOUTS:
                self._hits.popitem(last=False)
            return "below_min_hits"
        return None

    def _capture(self, key: tuple, layout: VisionLayout, tensors: tuple[torch.Tensor, ...]) -> _Graph | None:
        started = time.perf_counter()
        device = tensors[0].device
        try:
            if self._pool is None:
                self._device = device
                self._pool = self._mechanism.new_pool(device)
                self._pools.append(self._pool)
                self._stream = self._mechanism.new_stream(device)
            static = tuple(t.clone() for t in tensors)  # x, cos, sin, *inputs
            static_cu = {name: cu.clone() for name, cu in layout.cu_seqlens_tensors(device).items()}
            attn_args = self.attention.layout_args(layout, static_cu)

            def forward() -> torch.Tensor:
                x, cos, sin, *inputs = static
                return self.forward_blocks(x, attn_args, cos, sin, *inputs)

            with self._capture_context():
                self._mechanism.warm_up(forward, self._stream)
                graph, output = self._mechanism.capture(forward, self._pool, self._stream)
        except Exception as error:  # any capture failure degrades to eager
            self._failed.add(key)
            # Later captures get a fresh pool and stream: a failed capture can leave the old ones
            # mid-capture. Graphs already captured keep the memory of the pool they used.
            self._pool = None
            logger.warning(
                "graph capture failed for %d patches in %d segments (%s: %s); this layout runs eagerly",
                layout.num_patches,
                len(layout.seq_lens),
                type(error).__name__,
                error,
            )
            return None
        entry = _Graph(graph, *static[:3], static[3:], static_cu, output)
        entry.addresses = tuple(t.data_ptr() for t in entry.buffers())
        self._graphs[key] = entry
        self._captures += 1
        self._capture_seconds += time.perf_counter() - started
        logger.debug("captured graph %d for %d patches", len(self._graphs), layout.num_patches)
        return entry

    def _replay(self, entry: _Graph, tensors: tuple[torch.Tensor, ...]) -> torch.Tensor:
        for static, given in zip((entry.x, entry.cos, entry.sin, *entry.inputs), tensors, strict=True):
            static.copy_(given)
        self._mechanism.replay(entry.graph)
        self._replays += 1
        return entry.output.clone()

    def _buffers_in_place(self, key: tuple, entry: _Graph) -> bool:
        """A graph whose buffers moved would read or write freed memory: drop it and serve eagerly."""
        if tuple(t.data_ptr() for t in entry.buffers()) == entry.addresses:
            return True
        logger.error("static buffers of a captured graph moved; dropping the graph and running eagerly")
        del self._graphs[key]
        self._failed.add(key)
        return False

    def _log_once(self, topic: str, message: str, *args: object) -> None:
        if topic not in self._logged:
            self._logged.add(topic)
            logger.warning(message, *args)
