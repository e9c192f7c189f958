"""ViTGraphRunner: graphs for the small, repeated calls of a server, within a memory budget, for any caller.

Invariants (docs/design.md, "Runner" and "Hazards"):
- the key carries every segmentation's offsets and each per-call tensor's dtype and shape; a padded
  layout's carries its token and segment counts, and its graph takes the offsets per call, copied
  device-to-device and read by the kernels from a copy a kernel of the graph makes;
- one staging set (inputs and output) per input signature, allocated once at the token ceiling;
- the pool holds nothing between calls; each exact graph owns its offsets, written once, never again,
  and every graph's first offsets are made on the caller's stream, never on the capture stream;
- a graph last in the pool that captures go to is reset only once another capture there has begun;
- with ``padding``, whether a call runs padded follows from its layout alone, eager or replayed;
- a new graph is kept only if its first replay equals its warm-up (an eager run of its inputs) bit for bit;
- captures run on the caller's thread, inside its call: no thread of the runner's own touches the
  device while the server's threads do (docs/design.md, "Hazards");
- ``run`` returns a clone; one marker event orders the runner's device work on any stream;
- admission (the cost model, call counts), eviction and release follow the call sequence and
  rank-agreed sizes and launch times (``agree_max``), so tensor-parallel ranks decide alike.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from rocm_vit.graphs.admission import Admission
from rocm_vit.graphs.capture import CudaGraphs, GraphMechanism
from rocm_vit.graphs.cost import CostModel
from rocm_vit.graphs.memory import PredictionErrors, ScratchBounds
from rocm_vit.graphs.padding import Padding, pad_rows, padded_shape, real_rows
from rocm_vit.graphs.staging import Signature, Staging, signature_of
from rocm_vit.layout import AttentionLayout, PaddedLayout
from rocm_vit.settings import DEFAULT_CAPACITY, DEFAULT_MAX_TOKENS, DEFAULT_MIN_HITS

logger = logging.getLogger(__name__)

# forward_blocks(x, attn_args, cos, sin, *inputs) -> output
ForwardBlocks = Callable[..., torch.Tensor]
# layout_args(layout, cu_seqlens) -> attn_args: per segmentation, built on the given offsets tensors
# (a tower's: rocm_vit.attention.AttnArgs). The runner passes them on unread.
LayoutArgs = Callable[[AttentionLayout, Mapping[str, torch.Tensor]], Mapping[str, Any]]
# The element-wise maximum of a list of ints over every rank that shares the runner's decisions.
AgreeMax = Callable[[Sequence[int]], list[int]]

EAGER_REASONS = (
    "no_gpu",
    "over_capacity",
    "over_max_tokens",
    "no_saving",
    "below_min_hits",
    "below_payback",
    "over_budget",
    "capture_failed",
    "capture_unverified",
)

# Default budget: 1/64 of the device's memory, between 256 MiB and 4 GiB (H200: 2.2 GB; MI355X: 4 GiB).
_BUDGET_FRACTION = 64
_MIN_DEFAULT_BUDGET = 256 << 20
_MAX_DEFAULT_BUDGET = 4 << 30


def default_budget_bytes(total_memory_bytes: int) -> int:
    """The byte budget used when none is given: ``total / 64``, clamped to 256 MiB .. 4 GiB."""
    return min(_MAX_DEFAULT_BUDGET, max(_MIN_DEFAULT_BUDGET, total_memory_bytes // _BUDGET_FRACTION))


@dataclass
class _Graph:
    """A captured layout: the graph, the staging views it reads and writes, the offsets it reads."""

    graph: Any
    output: torch.Tensor  # a view of staging's output buffer
    pool: Any  # the pool it was captured into (a failed capture moves later ones to a fresh pool)
    staging: Staging
    inputs: tuple[torch.Tensor, ...]  # views of staging.inputs, one per per-call tensor
    # This graph's own int32 offsets by segmentation: written once, or before each replay of a
    # layout whose offsets are a per-call input (``offsets_per_call``).
    offsets: dict[str, torch.Tensor]
    tokens: int
    offsets_per_call: bool = False

    @property
    def offsets_bytes(self) -> int:
        return sum(offsets.nbytes for offsets in self.offsets.values())


@dataclass
class _Attempt:
    """A capture's outcome before the ranks agree on it."""

    entry: _Graph | None
    reference: torch.Tensor | None  # the warm-up's output, which the first replay must equal; None if it did not run
    error: Exception | None
    pool_before: int  # the pool's bytes once room was made, before the capture
    # Graphs were let go of or pools released before the error: this rank's graphs may differ from the others'.
    room_failed: bool = False


class ViTGraphRunner:
    """Runs ``forward_blocks(x, attn_args, cos, sin, *inputs)`` under graphs keyed by the exact layout.

    ``attn_args = layout_args(layout, cu_seqlens)``: per segmentation, arguments that reference the
    given ``cu_seqlens`` (the graph's own offsets, or the layout's in an eager run) and hold nothing
    read back from the device. ``run`` returns a tensor owned by the caller, ready on its current
    stream, and raises only what the eager ``forward_blocks`` would. Options (docs/usage.md,
    "Graphs"): ``capacity``, ``min_hits``, ``max_tokens`` (also the staging size),
    ``budget_bytes`` (``None``: ``default_budget_bytes``), ``cost_model`` (``None``: every layout is
    worth a graph), ``clock`` (times eager runs), ``agree_max`` (the element-wise maximum over the
    ranks that must decide alike), ``padding`` (runs the layouts it pads padded, eagerly too;
    ``layout_args`` must then take a ``PaddedLayout``), ``prepare_capture`` (called on the runner's
    stream before each warm-up and capture: what ``forward_blocks`` makes lazily per stream is made
    there, outside the pool).
    ``forward_blocks`` is never given the caller's tensors to write: an eager run takes a copy of ``x``.
    """

    def __init__(
        self,
        forward_blocks: ForwardBlocks,
        layout_args: LayoutArgs,
        *,
        capacity: int = DEFAULT_CAPACITY,
        min_hits: int = DEFAULT_MIN_HITS,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        budget_bytes: int | None = None,
        prepare_capture: Callable[[], None] | None = None,
        mechanism: GraphMechanism | None = None,
        agree_max: AgreeMax | None = None,
        cost_model: CostModel | None = None,
        clock: Callable[[], float] = time.perf_counter,
        padding: Padding | None = None,
    ) -> None:
        for name, value, least in (("capacity", capacity, 0), ("min_hits", min_hits, 1)):
            if not isinstance(value, int) or value < least:
                raise ValueError(f"{name} = {value!r} must be an int >= {least}")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens = {max_tokens!r} must be an int >= 1")
        if budget_bytes is not None and (not isinstance(budget_bytes, int) or budget_bytes < 0):
            raise ValueError(f"budget_bytes = {budget_bytes!r} must be an int >= 0 or None (device default)")
        self.forward_blocks = forward_blocks
        self.layout_args = layout_args
        self.capacity = capacity
        self.min_hits = min_hits
        self.max_tokens = max_tokens
        self._admission = Admission(
            capacity=capacity, min_hits=min_hits, max_tokens=max_tokens, cost_model=cost_model, agree=self._agree
        )
        self._budget_bytes = budget_bytes
        self._prepare_capture = prepare_capture or _nothing
        self._mechanism = mechanism or CudaGraphs()
        self._agree_max = agree_max
        self._padding = padding
        self._clock = clock
        self._padded_calls = 0
        self._lock = threading.Lock()
        self._counts_lock = threading.Lock()  # eager runs counted without the runner's lock
        self._graphs: OrderedDict[tuple, _Graph] = OrderedDict()  # least recently used first
        self._staging: dict[Signature, Staging] = {}
        self._pool: Any = None
        self._retired_pools: list[Any] = []  # pools of failed captures: no graph, memory still reserved
        # The last graph let go of in ``_pool``, held until a capture has begun there (``_let_go``).
        self._pool_keeper: Any = None
        self._stream: Any = None  # warm-up and capture run on it
        # Recorded behind the runner's last device work, on the stream it ran on: work on another
        # stream waits for it before touching staging or pool memory.
        self._marker: Any = None
        self._marker_stream: Any = None
        self._device: torch.device | None = None
        self._pool_bytes = 0  # reserved by the live and retired pools, as agreed after the last capture
        self._scratch = ScratchBounds()
        self._prediction_errors = PredictionErrors()
        self._captures = 0
        self._replays = 0
        self._evictions = 0
        self._pool_releases = 0
        self._capture_seconds = 0.0
        self._verify_seconds = 0.0
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
        ``layout``, or a tensor is on another device. A layout ``padding`` pads runs padded (its
        output cut to the real tokens' rows), replayed or not.
        """
        tensors = (x, cos, sin, *inputs)
        _check_inputs(tensors, layout)
        padded = self._padded_layout(layout)
        if padded is None:
            return self._run(tensors, layout, immutable)
        # Padded in staging where replayed, else padded copies (``_run``): never immutable.
        tokens, padded_tokens = layout.num_patches, padded.num_patches
        return real_rows(self._run(tensors, padded, immutable=False, real_tokens=tokens), tokens, padded_tokens)

    def run_eager(
        self, x: torch.Tensor, layout: AttentionLayout, cos: torch.Tensor, sin: torch.Tensor, *inputs: torch.Tensor
    ) -> torch.Tensor:
        """What ``run`` computes, without graphs and without counting: a layout ``padding`` pads runs
        padded here too, so this is the eager reference a replay equals bit for bit."""
        tensors = (x, cos, sin, *inputs)
        _check_inputs(tensors, layout)
        padded = self._padded_layout(layout)
        if padded is None:
            return self._eager(tensors, layout)
        tokens = layout.num_patches
        return real_rows(self._eager(_padded(tensors, tokens, padded), padded), tokens, padded.num_patches)

    def _padded_layout(self, layout: AttentionLayout) -> PaddedLayout | None:
        """The layout ``padding`` runs ``layout`` as, or ``None`` to run it as it is."""
        return self._padding.padded(layout) if self._padding is not None else None

    def _run(
        self,
        tensors: tuple[torch.Tensor, ...],
        layout: AttentionLayout,
        immutable: bool,
        real_tokens: int | None = None,
    ) -> torch.Tensor:
        """``real_tokens``: ``layout`` is a padded layout and ``tensors`` have rows for this many of
        its tokens. A replay pads them in staging, filling the padding rows with zeros; any other
        run takes padded copies (``pad_rows``), as ``run_eager`` does."""
        if layout.offsets_per_call:
            with self._counts_lock:
                self._padded_calls += 1
        # Exact shapes and dtypes: cheap to build on every call (the staging signature is derived
        # from them only when a capture is due).
        shapes = tuple(
            (t.dtype, t.shape if real_tokens is None else padded_shape(t, real_tokens, layout.num_patches))
            for t in tensors
        )
        key = (layout.graph_key, shapes)
        with self._lock:
            output, reason, tensors = self._decide_and_serve(key, tensors, layout, immutable, real_tokens)
        if output is not None:
            return output
        return self._timed_eager(tensors, layout, timed=reason != "no_gpu")  # outside the lock: threads run it at once

    def _decide_and_serve(
        self,
        key: tuple,
        tensors: tuple[torch.Tensor, ...],
        layout: AttentionLayout,
        immutable: bool,
        real_tokens: int | None,
    ) -> tuple[torch.Tensor | None, str | None, tuple[torch.Tensor, ...]]:
        """Under the runner's lock: replay ``key``'s graph, or capture it (on this thread, inside this
        call); either way ``(output, None, tensors)``. Else ``(None, why, tensors as eager takes them)``."""
        self._admission.called()
        entry = self._graphs.get(key)
        if entry is not None:
            self._graphs.move_to_end(key)
            self._admission.replayed(key)
            return self._replay(entry, layout, tensors, immutable), None, tensors
        tensors = _padded(tensors, real_tokens, layout)
        reason = self._admit(key, layout, tensors[0].device)
        if reason is None:
            signature = signature_of(tensors, layout.num_patches)
            reason = self._staging_over_budget(signature)
        if reason is None:
            output, pool_before = self._capture_and_verify(key, signature, layout, tensors, immutable)
            # Here, not inside: a pool is released only once no local holds the warm-up's output.
            self._hold_budget(layout.num_patches, pool_before)
            return output, None, tensors
        self._eager_runs[reason] += 1
        return None, reason, tensors

    @property
    def padding(self) -> Padding | None:
        """The static rule of which layouts run padded (``None``: none do)."""
        return self._padding

    def _timed_eager(
        self, tensors: tuple[torch.Tensor, ...], layout: AttentionLayout, timed: bool = True
    ) -> torch.Tensor:
        started = self._clock()
        output = self._eager(tensors, layout)
        if timed:
            host_ms = (self._clock() - started) * 1e3
            self._admission.timed(layout, host_ms)  # outside the runner's lock: other threads time theirs
        return output

    def counters(self) -> dict[str, int]:
        """The calls served so far: ``replays``, eager runs by reason, ``padded`` calls of either kind.
        Unlike ``stats``, read without the runner's lock: a caller on another thread reads them
        without waiting for a capture (``bench-traffic --mode tower`` reads them call by call)."""
        with self._counts_lock:
            return {"replays": self._replays, **self._eager_runs, "padded": self._padded_calls}

    def stats(self) -> dict[str, Any]:
        """Counters for logs, ``rocm-vit bench`` and ``bench-memory``: captures, replays, evictions,
        eager runs by reason, graphs held, the bytes held (staging, offsets and pool) against the
        budget, and how far the pool growth predicted before each capture was from what it took."""
        with self._lock:
            staging_bytes = self._staging_bytes()
            offsets_bytes = self._offsets_bytes()
            return {
                "captures": self._captures,
                "replays": self._replays,
                "evictions": self._evictions,
                "pool_releases": self._pool_releases,
                "eager_runs": dict(self._eager_runs),
                "padded_calls": self._padded_calls,
                "graphs": len(self._graphs),
                "capture_seconds": self._capture_seconds,
                "verify_seconds": self._verify_seconds,
                "pool_bytes": self._pool_bytes,
                "staging_bytes": staging_bytes,
                "offsets_bytes": offsets_bytes,
                "bytes_held": self._pool_bytes + staging_bytes + offsets_bytes,
                "budget_bytes": self._budget_bytes,
                "pool_growth_prediction": self._prediction_errors.summary(),
                **self._admission.stats(),
            }

    # Admission and room ---------------------------------------------------------------------------

    def _admit(self, key: tuple, layout: AttentionLayout, device: torch.device) -> str | None:
        """Why this layout runs eagerly now (``Admission.decide``), or ``None`` when it is captured
        now; the first admitted capture fixes the device and its default budget."""
        if not self._mechanism.available(device):
            self._log_once("no_gpu", "graphs need a CUDA/ROCm device; running %s eagerly", device)
            return "no_gpu"
        reason = self._admission.decide(key, layout)
        if reason is None and self._device is None:
            self._device = device
            if self._budget_bytes is None:
                total = self._mechanism.total_memory(device)
                if self._agree_max is not None:  # the smallest device of the group
                    total = -self._agree_max([-total])[0]
                self._budget_bytes = default_budget_bytes(total)
                logger.info("graph memory budget %.0f MiB (1/64 of %s)", self._budget_bytes / 2**20, device)
        return reason

    def _fixed_bytes(self, signature: Signature) -> int:
        """Staging and offsets once ``signature``'s staging exists."""
        fixed_bytes = self._staging_bytes() + self._offsets_bytes()
        if signature not in self._staging:
            fixed_bytes += Staging.planned_bytes(signature, self.max_tokens)
        return fixed_bytes

    def _staging_over_budget(self, signature: Signature) -> str | None:
        """``"over_budget"`` where staging alone is over the budget: the only refusal before a measurement."""
        fixed_bytes, budget = self._fixed_bytes(signature), self._budget_bytes
        if fixed_bytes <= budget:
            return None
        self._log_once(
            "staging",
            "graph staging for %d tokens needs %.0f MiB, over the %.0f MiB budget; calls run eagerly",
            self.max_tokens,
            fixed_bytes / 2**20,
            budget / 2**20,
        )
        return "over_budget"

    def _make_room(self, signature: Signature, tokens: int) -> None:
        """Evict the least used graph when at capacity; release the pool when a capture of
        ``tokens`` is predicted to grow it past the budget (graphs hold nothing in it between calls,
        so evicting them would free nothing there). A capture whose bound says it may not fit even
        alone is tried alone: only a measurement refuses it (``Admission.over_budget_from``)."""
        budget, fixed_bytes = self._budget_bytes, self._fixed_bytes(signature)
        while len(self._graphs) >= self.capacity:
            self._evict_least_used()
        need = self._scratch.bound(tokens)
        if need is not None and self._pool_bytes and fixed_bytes + max(self._pool_bytes, need) > budget:
            self._release_pools()

    def _evict_least_used(self) -> None:
        key = self._admission.least_used()
        entry = self._graphs.pop(key)
        try:
            self._let_go(entry)
        except BaseException:
            self._graphs[key] = entry  # still held: the pools are released only once it is retired
            raise
        self._admission.dropped(key)
        self._evictions += 1
        logger.debug("evicted the graph of %d tokens (least used)", entry.tokens)

    def _release_pools(self) -> None:
        """Drop every graph and hand the pools' memory back; later captures start a fresh pool."""
        pools = self._live_pools()
        self._retire_all_graphs()  # in a call of its own: no local may keep an output in the pools alive
        self._release_pool_keeper()
        self._pool = None
        self._retired_pools = []
        if pools:
            self._mechanism.release_pools(pools, self._device)
        self._pool_bytes = 0
        self._pool_releases += 1

    def _retire_all_graphs(self) -> None:
        while self._graphs:
            key, entry = self._graphs.popitem()
            self._admission.dropped(key)
            self._mechanism.retire(entry.graph)

    def _let_go(self, entry: _Graph) -> None:
        """Retire ``entry``'s graph, which no longer is in ``_graphs``; the last graph of the pool later
        captures go to is held instead until the next capture there has begun. torch >= 2.11 keeps a
        pinned-host pool beside each graph pool that dies with its last graph; a capture into the
        pool then fails an internal assert (``use_count > 0``, seen on the H200), so every other
        capture of a runner that evicts its pool's last graph would fail."""
        if entry.pool is not self._pool or any(other.pool is entry.pool for other in self._graphs.values()):
            self._mechanism.retire(entry.graph)
            return
        self._release_pool_keeper()
        self._pool_keeper = entry.graph

    def _release_pool_keeper(self) -> None:
        if self._pool_keeper is not None:
            self._mechanism.retire(self._pool_keeper)
            self._pool_keeper = None

    def _staging_bytes(self) -> int:
        return sum(staging.nbytes for staging in self._staging.values())

    def _offsets_bytes(self) -> int:
        return sum(entry.offsets_bytes for entry in self._graphs.values())

    def _live_pools(self) -> list[Any]:
        """The pool new captures go to, the older ones live graphs were captured into, and retired ones."""
        pools = [] if self._pool is None else [self._pool]
        for pool in (*(entry.pool for entry in self._graphs.values()), *self._retired_pools):
            if all(pool is not known for known in pools):
                pools.append(pool)
        return pools

    # Capture, replay, eager -----------------------------------------------------------------------

    def _capture_and_verify(
        self,
        key: tuple,
        signature: Signature,
        layout: AttentionLayout,
        tensors: tuple[torch.Tensor, ...],
        immutable: bool,
    ) -> tuple[torch.Tensor, int]:
        """Capture ``key``, keep its graph only if every rank captured it and its first replay equals
        its warm-up everywhere, and serve this call. Returns the output and the pool's bytes before
        the capture.

        Ranks never part ways here (docs/design.md, "Ranks"): whatever fails on one rank (making room,
        the offsets, the warm-up's setup, the capture, the first replay's launch, the check) is caught
        and agreed before any rank takes a step the others would skip, and a forward that did not
        run on this rank (a warm-up or replay that failed before launching) runs eagerly in its
        place, which makes the same all-reduces in the same order. Every rank then runs the same
        forwards: warm-up, capture, [eager or replay], [eager]."""
        need = self._scratch.bound(layout.num_patches)
        started = time.perf_counter()
        attempt = self._capture(signature, layout, tensors, immutable)
        if attempt.reference is None and self._agree_max is not None:
            self._eager(tensors, layout)  # the warm-up's forward, in its place; raises if eager fails
        try:
            measured = sum(self._mechanism.pool_bytes(pool, self._device) for pool in self._live_pools())
        except Exception as error:  # the allocator cannot be read: treat it as a failed capture
            attempt, measured = replace(attempt, error=attempt.error or error), self._pool_bytes
        failed, room_failed, self._pool_bytes = self._agree(
            [int(attempt.error is not None), int(attempt.room_failed), measured]
        )
        if failed and attempt.entry is not None:
            self._let_go(attempt.entry)
        if room_failed:  # graphs went on one rank only: every rank starts again from none
            self._release_pools()
        if failed:
            output = self._eager(tensors, layout)  # raises if eager fails too: nothing marked
            why = attempt.error or "another rank's capture failed"
            self._remember_failure(key, layout, "capture_failed", why)
            return output, attempt.pool_before
        entry = attempt.entry
        self._graphs[key] = entry
        self._admission.captured(key)
        self._captures += 1
        self._capture_seconds += time.perf_counter() - started
        self._account(entry, need, attempt.pool_before)
        verify_started = time.perf_counter()
        output, replay_error = self._first_replay(entry, layout, tensors, immutable)
        differs = output is None or not _bitwise_equal(output, attempt.reference)
        replay_failed, unverified = self._agree([int(replay_error is not None), int(differs)])
        self._verify_seconds += time.perf_counter() - verify_started
        if replay_failed or unverified:
            self._drop_new_graph(key, entry)
            if replay_failed:
                reason, why = "capture_failed", replay_error or "another rank's first replay failed"
            else:
                reason, why = "capture_unverified", "its first replay differs from an eager run of its inputs"
            output = self._eager(tensors, layout)
            self._remember_failure(key, layout, reason, why)
            return output, attempt.pool_before
        self._replays += 1
        return output, attempt.pool_before

    def _first_replay(
        self, entry: _Graph, layout: AttentionLayout, tensors: tuple[torch.Tensor, ...], immutable: bool
    ) -> tuple[torch.Tensor | None, Exception | None]:
        """A new graph's first replay: its output, or the error that stopped it. A replay that raised
        before its launch runs eagerly in its place under tensor parallelism: the other ranks'
        replays wait in their all-reduces for this rank's."""
        launched = False
        try:
            self._launch(entry, layout, tensors, immutable)
            launched = True
            return self._take_output(entry), None
        except Exception as error:
            if not launched and self._agree_max is not None:
                self._eager(tensors, layout)
            return None, error

    def _drop_new_graph(self, key: tuple, entry: _Graph) -> None:
        del self._graphs[key]
        self._admission.dropped(key)
        self._let_go(entry)

    def _capture(
        self,
        signature: Signature,
        layout: AttentionLayout,
        tensors: tuple[torch.Tensor, ...],
        immutable: bool,
    ) -> _Attempt:
        """Make room, then capture into the runner's pool on its stream after an eager warm-up there:
        what ``forward_blocks`` makes lazily per thread and stream (and compiles) is made outside any
        capture, the pool is registered (``CudaGraphs.warm_up``), and the warm-up's output is what the
        first replay must equal. Never raises: the error is in the attempt."""
        device = tensors[0].device
        reference = None
        try:
            self._make_room(signature, layout.num_patches)
        except Exception as error:
            return _Attempt(None, reference, error, self._pool_bytes, room_failed=True)
        pool_before = self._pool_bytes
        try:
            offsets = self._graph_offsets(layout, device)
            if self._pool is None:
                self._pool = self._mechanism.new_pool(device)
                self._stream = self._mechanism.new_stream(device)
            with self._mechanism.on_stream(self._stream):
                self._follow_marker(self._stream)
                try:
                    staging = self._staging.get(signature)
                    if staging is None:
                        staging = self._staging[signature] = Staging(signature, self.max_tokens, device)
                    views = staging.views(tensors)
                    staging.fill(views, tensors, immutable)
                    attn_args = None if layout.offsets_per_call else self.layout_args(layout, offsets)

                    def forward() -> torch.Tensor:
                        x, cos, sin, *inputs = views
                        if layout.offsets_per_call:  # read from a copy that a kernel of the graph writes
                            made = {name: torch.add(given, 0) for name, given in offsets.items()}
                            return self.forward_blocks(x, self.layout_args(layout, made), cos, sin, *inputs)
                        return self.forward_blocks(x, attn_args, cos, sin, *inputs)

                    self._prepare_capture()
                    if reference is None:
                        reference = self._mechanism.warm_up(forward, self._pool, self._stream)
                    output_view = staging.output_view(reference, layout.num_patches)

                    def forward_into_staging() -> torch.Tensor:
                        return output_view.copy_(forward())

                    graph, output = self._mechanism.capture(forward_into_staging, self._pool, self._stream)
                finally:
                    # Warm-up reads staging on this stream, also when the capture then fails.
                    self._mark(self._stream)
                    self._release_pool_keeper()  # a new graph holds the pool now, or the pool is retired
        except Exception as error:  # any capture failure degrades to eager
            # Later captures get a fresh pool and stream: a failed capture can leave the old ones
            # mid-capture. Graphs already captured keep the memory of the pool they used.
            if self._pool is not None:
                self._retired_pools.append(self._pool)
            self._pool = None
            return _Attempt(None, reference, error, pool_before)
        entry = _Graph(graph, output, self._pool, staging, views, offsets, layout.num_patches, layout.offsets_per_call)
        return _Attempt(entry, reference, None, pool_before)

    @staticmethod
    def _graph_offsets(layout: AttentionLayout, device: torch.device) -> dict[str, torch.Tensor]:
        """A new graph's own offsets, made on the caller's stream before the capture stream takes over.

        An exact layout's are copied from pinned host memory and never written again (a host-to-device
        copy right before a replay can be read stale on ROCm: docs/rocm.md, "Hazards"). A padded layout's are copied
        device-to-device here and before each replay, and the kernels read them from a copy that a
        kernel of the graph makes (``_capture``'s ``forward``), never from what a copy wrote. Never
        on the capture stream: the host allocator records a pinned block's free on every stream that
        copied from it, and a free during a later capture there would record a captured event, on
        which the next pinned allocation of any thread fails (docs/design.md, "Hazards").
        """
        if layout.offsets_per_call:
            return {name: layout.cu_seqlens_tensor(device, name).clone() for name in layout.segmentations}
        return {
            name: torch.empty_like(host, device=device).copy_(host, non_blocking=True)
            for name in layout.segmentations
            for host in (layout.cu_seqlens_host(name),)
        }

    def _agree(self, values: list[int]) -> list[int]:
        """``values`` as every rank sees them: the element-wise maximum over the group."""
        return values if self._agree_max is None else self._agree_max(values)

    def _account(self, entry: _Graph, need: int | None, pool_before: int) -> None:
        """Learn from a capture what the next ones will take; log the prediction beside the measurement."""
        pool_after = self._pool_bytes
        self._scratch.observe(entry.tokens, pool_after)  # it used at most the whole pool
        growth = pool_after - pool_before
        if need is not None:
            predicted = max(0, need - pool_before)
            self._prediction_errors.add(predicted, growth)
            logger.debug(
                "captured %d tokens: pool growth predicted %.1f MiB, measured %.1f MiB; pool %.0f MiB",
                entry.tokens,
                predicted / 2**20,
                growth / 2**20,
                pool_after / 2**20,
            )

    def _hold_budget(self, tokens: int, pool_before: int) -> None:
        """After a capture: past the budget, release the pools; a capture that was alone in an empty
        pool is over the budget by measurement, and so is every larger one."""
        held = self._pool_bytes + self._staging_bytes() + self._offsets_bytes()
        if held <= self._budget_bytes:
            return
        alone = pool_before == 0
        logger.warning(
            "graph memory %.0f MiB after capturing %d tokens is over the %.0f MiB budget; graphs dropped and "
            "the pool released%s",
            held / 2**20,
            tokens,
            self._budget_bytes / 2**20,
            f"; layouts of {tokens} tokens or more run eagerly" if alone else "",
        )
        self._release_pools()
        if alone:
            self._admission.over_budget_from(tokens)

    def _replay(
        self, entry: _Graph, layout: AttentionLayout, tensors: tuple[torch.Tensor, ...], immutable: bool
    ) -> torch.Tensor:
        self._launch(entry, layout, tensors, immutable)
        output = self._take_output(entry)
        self._replays += 1
        return output

    def _launch(
        self, entry: _Graph, layout: AttentionLayout, tensors: tuple[torch.Tensor, ...], immutable: bool
    ) -> None:
        """Fill staging and replay ``entry`` on the caller's stream: ordered after the caller's pending
        work (its inputs) by the stream itself, after the runner's last work on other streams by the
        marker."""
        stream = self._mechanism.current_stream(tensors[0].device)
        self._follow_marker(stream)
        try:
            entry.staging.fill(entry.inputs, tensors, immutable)
            if entry.offsets_per_call:
                self._write_offsets(entry, layout)
            self._mechanism.replay(entry.graph)
        except BaseException:
            self._mark(stream)  # what was enqueued before the error reads staging on this stream
            raise

    def _take_output(self, entry: _Graph) -> torch.Tensor:
        """The replay's output, cloned for the caller on its stream, allocated there; the marker
        goes after the clone, which reads staging."""
        stream = self._mechanism.current_stream(entry.output.device)
        output = entry.output.clone()
        self._mark(stream)
        return output

    @staticmethod
    def _write_offsets(entry: _Graph, layout: AttentionLayout) -> None:
        """A padded graph's offsets input: this call's, device-to-device on the caller's stream."""
        for name, offsets in entry.offsets.items():
            offsets.copy_(layout.cu_seqlens_tensor(offsets.device, name))

    def _follow_marker(self, stream: Any) -> None:
        """Order ``stream`` after the runner's last device work, when that ran on another stream."""
        if self._marker is not None and stream != self._marker_stream:
            self._mechanism.follow(stream, self._marker)

    def _mark(self, stream: Any) -> None:
        self._marker = self._mechanism.mark(stream, self._marker)
        self._marker_stream = stream

    def _eager(self, tensors: tuple[torch.Tensor, ...], layout: AttentionLayout) -> torch.Tensor:
        """``forward_blocks`` on a copy of ``x``: the caller's tensors are never written. SGLang's blocks
        add into their input in place, and a caller's fallback after a failure starts from its input."""
        x, cos, sin, *inputs = tensors
        attn_args = self.layout_args(layout, layout.cu_seqlens_tensors(x.device))
        return self.forward_blocks(x.clone(), attn_args, cos, sin, *inputs)

    def _remember_failure(self, key: tuple, layout: AttentionLayout, reason: str, why: object) -> None:
        self._admission.failed(key, reason)
        self._eager_runs[reason] += 1
        logger.warning(
            "graph capture of %d tokens in %d segments is not used (%s: %s); this layout runs eagerly",
            layout.num_patches,
            len(layout.segmentations["full"].seq_lens),
            reason,
            f"{type(why).__name__}: {why}" if isinstance(why, Exception) else why,
        )

    def _log_once(self, topic: str, message: str, *args: object) -> None:
        if topic not in self._logged:
            self._logged.add(topic)
            logger.warning(message, *args)


def _nothing() -> None:
    """No preparation before a warm-up or capture."""


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (NaNs too): what graph against eager promises."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _padded(
    tensors: tuple[torch.Tensor, ...], real_tokens: int | None, layout: AttentionLayout
) -> tuple[torch.Tensor, ...]:
    """``tensors`` as ``layout`` takes them: padded copies where they have rows for ``real_tokens``."""
    if real_tokens is None:
        return tensors
    return tuple(pad_rows(tensor, real_tokens, layout.num_patches) for tensor in tensors)


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
