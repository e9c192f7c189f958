"""ViTGraphRunner: graphs for the small, repeated calls of a server, within a memory budget, for any caller.

Why each rule exists (DESIGN.md, Known hazards):
- keys come from host data and carry every segmentation's ``cu_seqlens`` (the full one, and the
  window one of a windowed tower): equal token counts with other image or window boundaries would
  otherwise replay stale attention metadata. Keys also carry the dtypes and trailing shapes of the
  per-call tensors: a graph captured with fp32 cos/sin would round bf16 ones and differ from eager;
- every graph reads its inputs from one set of staging buffers (``_Staging``), allocated once at the
  token ceiling and never regrown, and every per-call tensor and offset is copied in before each
  replay unless staging holds it already (offsets: the same key; a tensor passed as immutable: the
  very same object): a shared workspace regrown under captured graphs silently corrupted 485 of
  500 SGLang replies, and layouts that share a key may differ in what is not attention metadata
  (rotary angles, position embeddings, a window order). A graph's own memory is its share of the pool;
- graphs share one pool and one staging area, so the runner's device work must never overlap
  (measured before it was ordered: 188 of 200 outputs wrong with four threads on four streams).
  A replay (staging copies, the graph, the output clone) runs on the caller's stream, after a
  marker event recorded behind the runner's previous device work whenever that ran on another
  stream; warm-up and capture run on the runner's own stream, ordered the same way. Replaying on
  the caller's stream instead of switching to the runner's saved 0.07-0.12 ms per small-image call
  on an H200 (two cross-stream waits and a stream switch; docs/benchmarks.md, eleventh round);
- replay returns a clone: a caller holding a static output would see the next replay overwrite it;
- warm-up runs on the capture stream before each capture: kernel JIT, ``torch.compile`` and
  per-stream library handles created inside a capture fail or hang;
- admission keeps graphs for what pays: a layout is captured on its ``min_sightings``-th call and
  only up to ``max_tokens`` tokens (past that, replay saves under 10 % on an H200:
  docs/benchmarks.md); least recently used graphs are evicted to stay within ``capacity`` graphs
  and ``budget_bytes`` of staging plus pool. Everything else runs the same function eagerly;
- bad input raises ``ValueError`` before anything runs and changes nothing; a layout is remembered
  as failed only when its capture fails where the eager run of the same input succeeds.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import torch

from rocm_vit.attention import AttentionBackend
from rocm_vit.graphs.capture import CudaGraphs, GraphMechanism
from rocm_vit.layout import AttentionLayout
from rocm_vit.policy import DEFAULT_GRAPH_MAX_TOKENS

logger = logging.getLogger(__name__)

# forward_blocks(x, attn_args, cos, sin, *inputs) -> output
ForwardBlocks = Callable[..., torch.Tensor]
# Per per-call tensor, in call order: dtype, shape past the first dim, and rows per token (1 for x,
# cos, sin; 1/4 for a window index with one entry per 2x2 merge block).
Signature = tuple[tuple[torch.dtype, tuple[int, ...], Fraction], ...]

EAGER_REASONS = (
    "no_gpu",
    "over_capacity",
    "over_max_tokens",
    "below_min_sightings",
    "over_budget",
    "capture_failed",
)

DEFAULT_CAPACITY = 32
# A layout is captured on its second call: one-off layouts (most of a real image mix) never are.
DEFAULT_MIN_SIGHTINGS = 2
# The policy's ceiling without a tuned profile: replay beats eager by >= 10 % up to about this many
# tokens on an H200 (qwen3-vl-8b: 13.7 vs 16.0 ms at 4096, 27.8 vs 28.0 at 6400; docs/benchmarks.md).
DEFAULT_MAX_TOKENS = DEFAULT_GRAPH_MAX_TOKENS
# Default budget: 1/64 of the device's memory, between 256 MiB and 4 GiB (H200: 2.2 GB; MI355X: 4 GiB).
_BUDGET_FRACTION = 64
_MIN_DEFAULT_BUDGET = 256 << 20
_MAX_DEFAULT_BUDGET = 4 << 30

# Layouts remembered while not (yet) captured, or as failed; bounded so endless new sizes stay flat.
_MAX_TRACKED_LAYOUTS = 4096


def default_budget_bytes(total_memory_bytes: int) -> int:
    """The byte budget used when none is given: ``total / 64``, clamped to 256 MiB .. 4 GiB."""
    return min(_MAX_DEFAULT_BUDGET, max(_MIN_DEFAULT_BUDGET, total_memory_bytes // _BUDGET_FRACTION))


@dataclass
class _Graph:
    """A captured layout: the graph, its static output (in the pool), and the staging views it reads."""

    graph: Any
    output: torch.Tensor
    key: tuple
    pool: Any  # the pool it was captured into (a failed capture moves later ones to a fresh pool)
    staging: _Staging
    inputs: tuple[torch.Tensor, ...]  # views of staging.inputs, one per per-call tensor
    offsets: dict[str, torch.Tensor]  # views of staging.cu_seqlens, by segmentation
    host_offsets: dict[str, torch.Tensor]  # the layout's pinned int32 offsets, copied into ``offsets``
    tokens: int

    def fill(self, tensors: tuple[torch.Tensor, ...], immutable: bool) -> None:
        """Copy this call's tensors into staging, and this graph's offsets unless they are there already."""
        self.staging.fill(self.key, self.inputs, tensors, self.offsets, self.host_offsets, immutable)


class _Staging:
    """The static inputs every graph of one signature reads, at ``max_tokens`` rows, never regrown.

    One buffer per per-call tensor, and one int32 offsets buffer per segmentation name; a graph
    captures views of their first rows, so every graph reads the same memory, filled before each
    replay.
    """

    def __init__(self, signature: Signature, max_tokens: int, device: torch.device) -> None:
        self.max_tokens = max_tokens
        self.inputs = tuple(
            torch.empty(shape, dtype=dtype, device=device) for dtype, shape in _buffer_shapes(signature, max_tokens)
        )
        self.cu_seqlens: dict[str, torch.Tensor] = {}
        # The graph key whose offsets the cu_seqlens buffers hold: a layout replayed again (the common
        # case) needs no offsets copy; its offsets follow from its key alone.
        self.offsets_key: tuple | None = None
        # Per input buffer, the tensor it holds when that tensor was passed as immutable (never
        # written after it is passed): passed again, the very object needs no copy. Held, so that
        # no other tensor can take its memory and pass for it.
        self.sources: list[torch.Tensor | None] = [None] * len(self.inputs)
        self._device = device

    @staticmethod
    def planned_bytes(signature: Signature, max_tokens: int) -> int:
        """What the input buffers of ``signature`` take, before allocating them."""
        return sum(math.prod(shape) * dtype.itemsize for dtype, shape in _buffer_shapes(signature, max_tokens))

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in (*self.inputs, *self.cu_seqlens.values()))

    def views(
        self, tensors: tuple[torch.Tensor, ...], layout: AttentionLayout
    ) -> tuple[tuple[torch.Tensor, ...], dict[str, torch.Tensor]]:
        """The views a graph of ``layout`` reads: its rows of each input buffer, its offsets by segmentation."""
        inputs = tuple(buffer[: given.shape[0]] for buffer, given in zip(self.inputs, tensors, strict=True))
        offsets = {}
        for name, segmentation in layout.segmentations.items():
            if name not in self.cu_seqlens:
                # Offsets of up to max_tokens segments (plus an empty leading one, as SGLang passes).
                self.cu_seqlens[name] = torch.zeros(self.max_tokens + 2, dtype=torch.int32, device=self._device)
            offsets[name] = self.cu_seqlens[name][: len(segmentation.cu_seqlens)]
        return inputs, offsets

    def fill(
        self,
        key: tuple,
        inputs: tuple[torch.Tensor, ...],
        tensors: tuple[torch.Tensor, ...],
        offsets: dict[str, torch.Tensor],
        host_offsets: dict[str, torch.Tensor],
        immutable: bool,
    ) -> None:
        # x (index 0) is the caller's per-call data: always copied.
        for index, (view, given) in enumerate(zip(inputs, tensors, strict=True)):
            keep = immutable and index > 0
            if keep and self.sources[index] is given:
                continue
            self.sources[index] = None  # no claim on the buffer while its copy is not enqueued
            view.copy_(given)
            if keep:
                self.sources[index] = given
        if self.offsets_key != key:
            for name, view in offsets.items():
                view.copy_(host_offsets[name], non_blocking=True)
            self.offsets_key = key


class ViTGraphRunner:
    """Runs ``forward_blocks(x, attn_args, cos, sin, *inputs)`` under graphs keyed by the exact layout.

    ``attn_args`` is ``attention.layout_args(layout, cu_seqlens)``: one backend argument list per
    segmentation, by name, built on the staging offsets in a graph and on the layout's own tensors in
    an eager run. ``forward_blocks`` hands each block the list of the segmentation it attends within.

    ``run`` returns a tensor owned by the caller, ready on the caller's current stream. Calls are
    serialised on the host by a lock, and the runner's device work on the device by a marker event
    (replays run on the caller's stream, captures on the runner's own); capture is thread-local, so
    other threads may use the GPU meanwhile. Nothing escapes ``run`` that the eager
    ``forward_blocks`` would not raise too.

    Options (defaults in this module): ``capacity`` graphs at most; ``min_sightings`` calls of a
    layout before it is captured; ``max_tokens`` per captured layout (also the staging size);
    ``budget_bytes`` for staging plus pool (``None``: 1/64 of the device's memory, 256 MiB .. 4 GiB).
    """

    def __init__(
        self,
        forward_blocks: ForwardBlocks,
        attention: AttentionBackend,
        *,
        capacity: int = DEFAULT_CAPACITY,
        min_sightings: int = DEFAULT_MIN_SIGHTINGS,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        budget_bytes: int | None = None,
        capture_context: Callable[[], contextlib.AbstractContextManager] | None = None,
        mechanism: GraphMechanism | None = None,
    ) -> None:
        for name, value, least in (("capacity", capacity, 0), ("min_sightings", min_sightings, 1)):
            if not isinstance(value, int) or value < least:
                raise ValueError(f"{name} = {value!r} must be an int >= {least}")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens = {max_tokens!r} must be an int >= 1")
        if budget_bytes is not None and (not isinstance(budget_bytes, int) or budget_bytes < 0):
            raise ValueError(f"budget_bytes = {budget_bytes!r} must be an int >= 0 or None (device default)")
        self.forward_blocks = forward_blocks
        self.attention = attention
        self.capacity = capacity
        self.min_sightings = min_sightings
        self.max_tokens = max_tokens
        self._budget_bytes = budget_bytes
        self._capture_context = capture_context or contextlib.nullcontext
        self._mechanism = mechanism or CudaGraphs()
        self._lock = threading.Lock()
        self._graphs: OrderedDict[tuple, _Graph] = OrderedDict()  # least recently used first
        self._staging: dict[Signature, _Staging] = {}
        self._sightings: OrderedDict[tuple, int] = OrderedDict()
        self._failed: OrderedDict[tuple, None] = OrderedDict()
        self._over_budget: OrderedDict[tuple, None] = OrderedDict()  # captured once, alone over the budget
        self._pool: Any = None
        self._stream: Any = None  # warm-up and capture run on it
        # Recorded behind the runner's last device work, on the stream it ran on: work on another
        # stream waits for it before touching staging or pool memory.
        self._marker: Any = None
        self._marker_stream: Any = None
        self._device: torch.device | None = None
        self._pool_bytes = 0
        # Learned from captures, to predict a capture's cost before it runs: output bytes per token,
        # and the pool beside the live outputs (the intermediates all captures share: ``_scratch_bytes``
        # now, and per token of the capture that last grew it).
        self._output_bytes_per_token = 0.0
        self._scratch_bytes = 0
        self._scratch_bytes_per_token = 0.0
        self._captures = 0
        self._replays = 0
        self._evictions = 0
        self._pool_releases = 0
        self._capture_seconds = 0.0
        self._eager_runs: Counter[str] = Counter({reason: 0 for reason in EAGER_REASONS})
        self._logged: set[str] = set()

    def run(
        self,
        x: torch.Tensor,
        layout: AttentionLayout,
        cos: torch.Tensor,
        sin: torch.Tensor,
        *inputs: torch.Tensor,
        immutable: bool = False,
    ) -> torch.Tensor:
        """Forward ``x`` ``[N, ...]`` laid out as ``layout``; ``cos``/``sin`` ``[N, head_dim]``, any dtype.

        ``inputs`` are further tensors ``forward_blocks`` reads (a tower's position taps, ``[N, 4]``,
        or window index, one row per merge block); like ``x``, ``cos`` and ``sin`` they are copied
        into staging before every replay. ``immutable=True`` promises that ``cos``, ``sin`` and
        ``inputs`` are never written after they are passed (a tower's prepared layouts): one passed
        again, the very tensor object, is then not copied again while staging still holds it. Returns
        ``forward_blocks``' output, freshly allocated: no later call changes it. Raises ``ValueError``
        (before anything runs) when ``x``, ``cos`` or ``sin`` do not have one row per token of
        ``layout``, or a tensor is on another device.
        """
        tensors = (x, cos, sin, *inputs)
        _check_inputs(tensors, layout)
        # Exact shapes and dtypes: cheap to build on every call (the staging signature is derived
        # from them only when a capture is due).
        key = (layout.graph_key, tuple((t.dtype, t.shape) for t in tensors))
        with self._lock:
            entry = self._graphs.get(key)
            if entry is not None:
                self._graphs.move_to_end(key)
                return self._replay(entry, tensors, immutable)
            reason = self._admission(key, layout.num_patches, x.device)
            if reason is None:
                signature = _signature(tensors, layout.num_patches)
                reason = self._make_room(signature, layout.num_patches)
            if reason is None:
                entry, error = self._capture(key, signature, layout, tensors, immutable)
                if entry is not None:
                    return self._replay(entry, tensors, immutable)
                if error is None:  # captured, but over the budget: dropped at once
                    self._eager_runs["over_budget"] += 1
                    return self._eager(tensors, layout)
                # Only a capture that fails where eager works marks the layout: bad input raises here.
                output = self._eager(tensors, layout)
                self._remember_failure(key, layout, error)
                self._eager_runs["capture_failed"] += 1
                return output
            self._eager_runs[reason] += 1
        return self._eager(tensors, layout)

    def stats(self) -> dict[str, Any]:
        """Counters for logs, ``rocm-vit bench`` and ``bench-memory``: captures, replays, evictions,
        eager runs by reason, graphs held, and the bytes held (staging plus pool) against the budget."""
        with self._lock:
            staging_bytes = self._staging_bytes()
            return {
                "captures": self._captures,
                "replays": self._replays,
                "evictions": self._evictions,
                "pool_releases": self._pool_releases,
                "eager_runs": dict(self._eager_runs),
                "graphs": len(self._graphs),
                "failed_layouts": len(self._failed),
                "capture_seconds": self._capture_seconds,
                "pool_bytes": self._pool_bytes,
                "staging_bytes": staging_bytes,
                "bytes_held": self._pool_bytes + staging_bytes,
                "budget_bytes": self._budget_bytes,
                "capacity": self.capacity,
                "min_sightings": self.min_sightings,
                "max_tokens": self.max_tokens,
            }

    # Admission and room ---------------------------------------------------------------------------

    def _admission(self, key: tuple, tokens: int, device: torch.device) -> str | None:
        """Why this layout runs eagerly now, or ``None`` when it may be captured."""
        if not self._mechanism.available(device):
            self._log_once("no_gpu", "graphs need a CUDA/ROCm device; running %s eagerly", device)
            return "no_gpu"
        if key in self._failed:
            return "capture_failed"
        if key in self._over_budget:
            return "over_budget"
        if self.capacity == 0:
            return "over_capacity"
        if tokens > self.max_tokens:
            return "over_max_tokens"
        sightings = self._sightings.pop(key, 0) + 1
        if sightings < self.min_sightings:
            self._sightings[key] = sightings
            if len(self._sightings) > _MAX_TRACKED_LAYOUTS:
                self._sightings.popitem(last=False)
            return "below_min_sightings"
        if self._device is None:
            self._device = device
            if self._budget_bytes is None:
                self._budget_bytes = default_budget_bytes(self._mechanism.total_memory(device))
                logger.info("graph memory budget %.0f MiB (1/64 of %s)", self._budget_bytes / 2**20, device)
        return None

    def _make_room(self, signature: Signature, tokens: int) -> str | None:
        """Evict least recently used graphs until a capture of ``tokens`` fits; ``"over_budget"`` if none can."""
        budget = self._budget_bytes
        staging_bytes = self._staging_bytes()
        if signature not in self._staging:
            staging_bytes += _Staging.planned_bytes(signature, self.max_tokens)
        if staging_bytes > budget:
            self._log_once(
                "staging",
                "graph staging for %d tokens needs %.0f MiB, over the %.0f MiB budget; calls run eagerly",
                self.max_tokens,
                staging_bytes / 2**20,
                budget / 2**20,
            )
            return "over_budget"
        alone = self._output_bytes_per_token * tokens + self._scratch_bytes_per_token * tokens
        if staging_bytes + alone > budget:  # would not fit in an empty pool: evict nothing for it
            return "over_budget"
        while len(self._graphs) >= self.capacity:
            self._evict_oldest()
        while self._graphs and staging_bytes + self._predicted_pool_bytes(tokens) > budget:
            self._evict_oldest()
        if staging_bytes + self._predicted_pool_bytes(tokens) > budget and self._pool_bytes:
            self._release_pools()  # no graph left: what the pool still reserves is only in the way
        if staging_bytes + self._predicted_pool_bytes(tokens) > budget:
            return "over_budget"
        return None

    def _predicted_pool_bytes(self, tokens: int) -> int:
        """The pool after capturing ``tokens`` more: today's, or the live outputs plus the new one's
        output and intermediates, whichever is larger (freed intermediates are shared)."""
        live_outputs = sum(entry.output.nbytes for entry in self._graphs.values())
        scratch = max(self._scratch_bytes, self._scratch_bytes_per_token * tokens)
        return max(self._pool_bytes, int(live_outputs + self._output_bytes_per_token * tokens + scratch))

    def _evict_oldest(self) -> None:
        _, entry = self._graphs.popitem(last=False)
        self._evictions += 1
        logger.debug("evicted the graph of %d tokens (least recently used)", entry.tokens)

    def _release_pools(self) -> None:
        """Drop every graph and hand the pools' memory back; later captures start a fresh pool."""
        pools = self._live_pools()
        self._graphs.clear()
        if pools:
            self._mechanism.release_pools(pools, self._device)
        self._pool = None
        self._pool_bytes = 0
        self._scratch_bytes = 0
        self._pool_releases += 1

    def _staging_bytes(self) -> int:
        return sum(staging.nbytes for staging in self._staging.values())

    def _live_pools(self) -> list[Any]:
        """The pool new captures go to, and any older one a live graph was captured into."""
        pools = [] if self._pool is None else [self._pool]
        for entry in self._graphs.values():
            if all(entry.pool is not pool for pool in pools):
                pools.append(entry.pool)
        return pools

    # Capture, replay, eager -----------------------------------------------------------------------

    def _capture(
        self,
        key: tuple,
        signature: Signature,
        layout: AttentionLayout,
        tensors: tuple[torch.Tensor, ...],
        immutable: bool,
    ) -> tuple[_Graph | None, Exception | None]:
        started = time.perf_counter()
        device = tensors[0].device
        try:
            if self._pool is None:
                self._pool = self._mechanism.new_pool(device)
                self._stream = self._mechanism.new_stream(device)
            with self._mechanism.on_stream(self._stream):
                self._follow_marker(self._stream)
                try:
                    staging = self._staging.get(signature)
                    if staging is None:
                        staging = self._staging[signature] = _Staging(signature, self.max_tokens, device)
                    views, offsets = staging.views(tensors, layout)
                    host_offsets = {name: layout.cu_seqlens_host(name) for name in offsets}
                    staging.fill(key, views, tensors, offsets, host_offsets, immutable)
                    attn_args = self.attention.layout_args(layout, offsets)

                    def forward() -> torch.Tensor:
                        x, cos, sin, *inputs = views
                        return self.forward_blocks(x, attn_args, cos, sin, *inputs)

                    with self._capture_context():
                        self._mechanism.warm_up(forward)
                        graph, output = self._mechanism.capture(forward, self._pool, self._stream)
                finally:
                    # Warm-up reads staging on this stream, also when the capture then fails.
                    self._mark(self._stream)
        except Exception as error:  # any capture failure degrades to eager
            # Later captures get a fresh pool and stream: a failed capture can leave the old ones
            # mid-capture. Graphs already captured keep the memory of the pool they used.
            self._pool = None
            return None, error
        entry = _Graph(graph, output, key, self._pool, staging, views, offsets, host_offsets, layout.num_patches)
        self._graphs[key] = entry
        self._captures += 1
        self._capture_seconds += time.perf_counter() - started
        self._account_capture(key, entry)
        return self._graphs.get(key), None

    def _account_capture(self, key: tuple, entry: _Graph) -> None:
        """Measure the pool after a capture, learn from it, and hold the budget."""
        self._pool_bytes = sum(self._mechanism.pool_bytes(pool, self._device) for pool in self._live_pools())
        live_outputs = sum(graph.output.nbytes for graph in self._graphs.values())
        self._output_bytes_per_token = max(self._output_bytes_per_token, entry.output.nbytes / entry.tokens)
        scratch = self._pool_bytes - live_outputs
        if scratch > self._scratch_bytes:  # this capture needed more intermediates than any before
            self._scratch_bytes = scratch
            self._scratch_bytes_per_token = max(self._scratch_bytes_per_token, scratch / entry.tokens)
        held = self._pool_bytes + self._staging_bytes()
        if held > self._budget_bytes:
            logger.warning(
                "graph memory %.0f MiB after capturing %d tokens is over the %.0f MiB budget; "
                "graphs dropped and the pool released, this layout runs eagerly",
                held / 2**20,
                entry.tokens,
                self._budget_bytes / 2**20,
            )
            self._release_pools()
            self._remember(self._over_budget, key)
        logger.debug("captured a graph for %d tokens; pool %.0f MiB", entry.tokens, self._pool_bytes / 2**20)

    def _replay(self, entry: _Graph, tensors: tuple[torch.Tensor, ...], immutable: bool) -> torch.Tensor:
        # On the caller's stream: ordered after the caller's pending work (its inputs) by the stream
        # itself, after the runner's last work on other streams by the marker; the clone is the
        # caller's, allocated on its stream.
        stream = self._mechanism.current_stream(tensors[0].device)
        self._follow_marker(stream)
        entry.fill(tensors, immutable)
        self._mechanism.replay(entry.graph)
        output = entry.output.clone()
        self._mark(stream)
        self._replays += 1
        return output

    def _follow_marker(self, stream: Any) -> None:
        """Order ``stream`` after the runner's last device work, when that ran on another stream."""
        if self._marker is not None and stream != self._marker_stream:
            self._mechanism.follow(stream, self._marker)

    def _mark(self, stream: Any) -> None:
        self._marker = self._mechanism.mark(stream, self._marker)
        self._marker_stream = stream

    def _eager(self, tensors: tuple[torch.Tensor, ...], layout: AttentionLayout) -> torch.Tensor:
        x, cos, sin, *inputs = tensors
        attn_args = self.attention.layout_args(layout, layout.cu_seqlens_tensors(x.device))
        return self.forward_blocks(x, attn_args, cos, sin, *inputs)

    def _remember_failure(self, key: tuple, layout: AttentionLayout, error: Exception | None) -> None:
        self._remember(self._failed, key)
        logger.warning(
            "graph capture failed for %d tokens in %d segments (%s: %s) where eager works; this layout runs eagerly",
            layout.num_patches,
            len(layout.segmentations["full"].seq_lens),
            type(error).__name__,
            error,
        )

    @staticmethod
    def _remember(keys: OrderedDict[tuple, None], key: tuple) -> None:
        keys[key] = None
        if len(keys) > _MAX_TRACKED_LAYOUTS:
            keys.popitem(last=False)

    def _log_once(self, topic: str, message: str, *args: object) -> None:
        if topic not in self._logged:
            self._logged.add(topic)
            logger.warning(message, *args)


def _buffer_shapes(signature: Signature, max_tokens: int) -> list[tuple[torch.dtype, tuple[int, ...]]]:
    """The staging buffer of each per-call tensor: its rows per token times ``max_tokens`` rows."""
    return [(dtype, (math.ceil(max_tokens * rows_per_token), *shape)) for dtype, shape, rows_per_token in signature]


def _signature(tensors: tuple[torch.Tensor, ...], tokens: int) -> Signature:
    """What staging is shared by: dtypes, trailing shapes and rows per token, not the token count."""
    return tuple((t.dtype, tuple(t.shape[1:]), Fraction(t.shape[0], tokens)) for t in tensors)


def _check_inputs(tensors: tuple[torch.Tensor, ...], layout: AttentionLayout) -> None:
    """``x``, ``cos``, ``sin`` have one row per token of ``layout``; every tensor sits on ``x``'s device."""
    names = ("x", "cos", "sin", *(f"inputs[{index}]" for index in range(len(tensors) - 3)))
    device = tensors[0].device
    for index, (name, tensor) in enumerate(zip(names, tensors, strict=True)):
        if not isinstance(tensor, torch.Tensor) or tensor.dim() < 1:
            raise ValueError(f"{name} must be a tensor with a first dim; got {type(tensor).__name__}")
        if index < 3 and tensor.shape[0] != layout.num_patches:
            raise ValueError(f"{name} has {tensor.shape[0]} rows but the layout describes {layout.num_patches} patches")
        if tensor.device != device:
            raise ValueError(f"{name} is on {tensor.device}, x on {device}: pass every tensor on one device")
