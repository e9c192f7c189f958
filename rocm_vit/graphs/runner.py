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

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from rocm_vit.graphs.admission import EAGER_REASONS, Admission, LaunchSample
from rocm_vit.graphs.capture import CudaGraphs, GraphMechanism, Marker
from rocm_vit.graphs.cost import CostModel
from rocm_vit.graphs.options import RunnerOptions
from rocm_vit.graphs.padding import Padding, padded_shape, real_rows
from rocm_vit.graphs.ranks import AgreeMax
from rocm_vit.graphs.staging import Signature, check_call, padded_call, signature_of
from rocm_vit.graphs.store import Graph, GraphStore, graph_offsets
from rocm_vit.layout import AttentionLayout, PaddedLayout
from rocm_vit.settings import DEFAULT_CAPACITY, DEFAULT_MAX_TOKENS, DEFAULT_MIN_HITS

logger = logging.getLogger(__name__)

# forward_blocks(x, attn_args, cos, sin, *inputs) -> output
ForwardBlocks = Callable[..., torch.Tensor]
# layout_args(layout, cu_seqlens) -> attn_args: per segmentation, built on the given offsets tensors
# (a tower's: rocm_vit.attention.AttnArgs). The runner passes them on unread.
LayoutArgs = Callable[[AttentionLayout, Mapping[str, torch.Tensor]], Mapping[str, Any]]


@dataclass
class _Attempt:
    """A capture's outcome before the ranks agree on it."""

    entry: Graph | None
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
    there, outside the pool), ``capture_scope`` (a context every capture runs inside and every rank
    leaves together: a custom all-reduce that registers the captured inputs at its exit; the
    warm-up stays outside it).
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
        capture_scope: Callable[[], contextlib.AbstractContextManager] | None = None,
        cost_model: CostModel | None = None,
        clock: Callable[[], float] = time.perf_counter,
        padding: Padding | None = None,
    ) -> None:
        RunnerOptions(capacity, min_hits, max_tokens, budget_bytes, cost_model, padding)  # checks them
        self.forward_blocks = forward_blocks
        self.layout_args = layout_args
        self._admission = Admission(
            capacity=capacity, min_hits=min_hits, max_tokens=max_tokens, cost_model=cost_model, agree=self._agree
        )
        self._prepare_capture = prepare_capture or _nothing
        self._mechanism = mechanism or CudaGraphs()
        self._agree_max = agree_max
        self._capture_scope = capture_scope
        self._ready_agreed = False  # this attempt's ranks agreed they reached the capture (capture_scope)
        self._store = GraphStore(self._mechanism, self._admission, budget_bytes=budget_bytes, agree_max=agree_max)
        self._padding = padding
        self._clock = clock
        self._padded_calls = 0
        self._lock = threading.Lock()
        self._counts_lock = threading.Lock()  # eager runs counted without the runner's lock
        self._order = Marker(self._mechanism)  # the runner's device work, in order across streams
        self._captures = 0
        self._replays = 0
        self._capture_seconds = 0.0
        self._verify_seconds = 0.0
        self._eager_runs: Counter[str] = Counter({reason: 0 for reason in EAGER_REASONS})
        self._warned_no_gpu = False

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
        check_call(tensors, layout)
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
        check_call(tensors, layout)
        padded = self._padded_layout(layout)
        if padded is None:
            return self._eager(tensors, layout)
        tokens = layout.num_patches
        return real_rows(self._eager(padded_call(tensors, tokens, padded), padded), tokens, padded.num_patches)

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
        entry = self._store.graphs.get(key)
        if entry is not None:
            self._admission.replayed(key)
            return self._replay(entry, layout, tensors, immutable), None, tensors
        tensors = padded_call(tensors, real_tokens, layout)
        reason = self._admit(key, layout, tensors[0].device)
        if reason is None:
            signature = signature_of(tensors, layout.num_patches)
            reason = "over_budget" if self._store.staging_over_budget(signature) else None
        if reason is None:
            output, pool_before = self._capture_and_verify(key, signature, layout, tensors, immutable)
            # Here, not inside: a pool is released only once no local holds the warm-up's output.
            self._store.hold_budget(layout.num_patches, pool_before)
            return output, None, tensors
        self._eager_runs[reason] += 1
        return None, reason, tensors

    @property
    def capacity(self) -> int:
        return self._admission.capacity

    @property
    def min_hits(self) -> int:
        return self._admission.min_hits

    @property
    def max_tokens(self) -> int:
        """The most patches a captured call has: the admission guard and the staging's rows."""
        return self._admission.max_tokens

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

    def launch_samples(self) -> list[LaunchSample]:
        """The eager runs behind the launch time learned so far (``Admission.launch_samples``):
        each one's host ms, the cost model's device ms for its layout and the launch time it taught."""
        return self._admission.launch_samples()

    def counters(self) -> dict[str, int]:
        """The calls served so far: ``replays``, ``captures`` (each served by its first replay), eager
        runs by reason, ``padded`` calls of either kind. Unlike ``stats``, read without the runner's
        lock: a caller on another thread reads them without waiting for a capture (``bench-traffic
        --mode tower`` reads them around each call, ``served_as``)."""
        with self._counts_lock:
            return {"replays": self._replays, "captures": self._captures, **self._eager_runs,
                    "padded": self._padded_calls}  # fmt: skip

    def stats(self) -> dict[str, Any]:
        """Counters for logs, ``rocm-vit bench`` and ``bench-memory``: captures, replays, evictions,
        eager runs by reason, graphs held, the bytes held (staging, offsets and pool) against the
        budget, and how far the pool growth predicted before each capture was from what it took."""
        with self._lock:
            return {
                "captures": self._captures,
                "replays": self._replays,
                "eager_runs": dict(self._eager_runs),
                "padded_calls": self._padded_calls,
                "capture_seconds": self._capture_seconds,
                "verify_seconds": self._verify_seconds,
                **self._store.stats(),
                **self._admission.stats(),
            }

    # Admission and room ---------------------------------------------------------------------------

    def _admit(self, key: tuple, layout: AttentionLayout, device: torch.device) -> str | None:
        """Why this layout runs eagerly now (``Admission.decide``), or ``None`` when it is captured
        now; the first admitted capture fixes the device and its default budget."""
        if not self._mechanism.available(device):
            if not self._warned_no_gpu:
                self._warned_no_gpu = True
                logger.warning("graphs need a CUDA/ROCm device; running %s eagerly", device)
            return "no_gpu"
        reason = self._admission.decide(key, layout)
        if reason is None:
            self._store.use_device(device)
        return reason

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
        store = self._store
        need = store.scratch.bound(layout.num_patches)
        started = time.perf_counter()
        self._ready_agreed = False
        attempt = self._capture(signature, layout, tensors, immutable)
        if attempt.reference is None and self._agree_max is not None:
            self._eager(tensors, layout)  # the warm-up's forward, in its place; raises if eager fails
        if self._capture_scope is not None and not self._ready_agreed:
            self._agree([1])  # the others' agreement before their capture (_scoped_capture): none captures
        try:
            measured = store.measured_pool_bytes()
        except Exception as error:  # the allocator cannot be read: treat it as a failed capture
            attempt, measured = replace(attempt, error=attempt.error or error), store.pool_bytes
        failed, room_failed, store.pool_bytes = self._agree(
            [int(attempt.error is not None), int(attempt.room_failed), measured]
        )
        if failed and attempt.entry is not None:
            store.let_go(attempt.entry)
        if room_failed:  # graphs went on one rank only: every rank starts again from none
            store.release_pools()
        if failed:
            output = self._eager(tensors, layout)  # raises if eager fails too: nothing marked
            why = attempt.error or "another rank's capture failed"
            self._remember_failure(key, layout, "capture_failed", why)
            return output, attempt.pool_before
        store.add(key, attempt.entry)
        self._captures += 1
        self._capture_seconds += time.perf_counter() - started
        store.learn(attempt.entry, need, attempt.pool_before)
        return self._verify(key, attempt, layout, tensors, immutable), attempt.pool_before

    def _verify(
        self, key: tuple, attempt: _Attempt, layout: AttentionLayout, tensors: tuple[torch.Tensor, ...], immutable: bool
    ) -> torch.Tensor:
        """Serve the call by the new graph's first replay, and keep the graph only if that replay ran
        and equals the warm-up bit for bit on every rank; else drop it and serve the call eagerly."""
        started, entry = time.perf_counter(), attempt.entry
        output, replay_error = self._first_replay(entry, layout, tensors, immutable)
        differs = output is None or not _bitwise_equal(output, attempt.reference)
        replay_failed, unverified = self._agree([int(replay_error is not None), int(differs)])
        self._verify_seconds += time.perf_counter() - started
        if replay_failed or unverified:
            self._store.drop_new(key, entry)
            if replay_failed:
                reason, why = "capture_failed", replay_error or "another rank's first replay failed"
            else:
                reason, why = "capture_unverified", "its first replay differs from an eager run of its inputs"
            output = self._eager(tensors, layout)
            self._remember_failure(key, layout, reason, why)
            return output
        self._replays += 1
        return output

    def _first_replay(
        self, entry: Graph, layout: AttentionLayout, tensors: tuple[torch.Tensor, ...], immutable: bool
    ) -> tuple[torch.Tensor | None, Exception | None]:
        """A new graph's first replay: its output, or the error that stopped it. A replay that raised
        before its launch runs eagerly in its place under tensor parallelism: the other ranks'
        replays wait in their all-reduces for this rank's."""
        try:
            return self._launch(entry, layout, tensors, immutable), None
        except Exception as error:  # raised before the replay launched: nothing can fail after it
            if self._agree_max is not None:
                self._eager(tensors, layout)
            return None, error

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
        device, store = tensors[0].device, self._store
        reference = None
        try:
            store.make_room(signature, layout.num_patches)
        except Exception as error:
            return _Attempt(None, reference, error, store.pool_bytes, room_failed=True)
        pool_before = store.pool_bytes
        try:
            offsets = graph_offsets(layout, device)
            pool, stream = store.capture_target(device)
            with self._mechanism.on_stream(stream):
                self._order.follow(stream)
                try:
                    staging = store.staging_for(signature, device)
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
                    reference = self._mechanism.warm_up(forward, pool, stream)
                    output_view = staging.output_view(reference, layout.num_patches)

                    def forward_into_staging() -> torch.Tensor:
                        return output_view.copy_(forward())

                    graph, output = self._scoped_capture(forward_into_staging, pool, stream)
                finally:
                    # Warm-up reads staging on this stream, also when the capture then fails.
                    self._order.mark(stream)
                    store.release_pool_keeper()  # a new graph holds the pool now, or the pool is retired
        except Exception as error:  # any capture failure degrades to eager
            store.retire_pool()
            return _Attempt(None, reference, error, pool_before)
        entry = Graph(graph, output, pool, staging, views, offsets, layout.num_patches, layout.offsets_per_call)
        return _Attempt(entry, reference, None, pool_before)

    def _scoped_capture(self, fn: Callable[[], torch.Tensor], pool: Any, stream: Any) -> tuple[Any, torch.Tensor]:
        """The mechanism's capture, inside ``capture_scope`` where one is given. Every rank leaves the
        scope together (its exit is a blocking exchange): the ranks first agree that each reached its
        capture, else none enters; inside, that each captured, before any leaves."""
        if self._capture_scope is None:
            return self._mechanism.capture(fn, pool, stream)
        (not_ready,) = self._agree([0])
        self._ready_agreed = True
        if not_ready:
            raise RuntimeError("another rank failed before its capture")
        graph, error = None, None
        with self._capture_scope():
            try:
                graph, output = self._mechanism.capture(fn, pool, stream)
            except Exception as raised:
                error = raised
            (failed,) = self._agree([int(error is not None)])
        if error is not None:
            raise error
        if failed:
            self._mechanism.retire(graph)
            raise RuntimeError("another rank's capture failed")
        return graph, output

    def _agree(self, values: list[int]) -> list[int]:
        """``values`` as every rank sees them: the element-wise maximum over the group."""
        return values if self._agree_max is None else self._agree_max(values)

    def _replay(
        self, entry: Graph, layout: AttentionLayout, tensors: tuple[torch.Tensor, ...], immutable: bool
    ) -> torch.Tensor:
        output = self._launch(entry, layout, tensors, immutable)
        self._replays += 1
        return output

    def _launch(
        self, entry: Graph, layout: AttentionLayout, tensors: tuple[torch.Tensor, ...], immutable: bool
    ) -> torch.Tensor:
        """Fill staging and replay ``entry`` on the caller's stream: ordered after the caller's pending
        work (its inputs) by the stream itself, after the runner's last work on other streams by the
        marker. Returns the replay's output, copied into a tensor the caller owns, allocated on its
        stream before the replay: nothing that can fail sits between a launched replay, whose
        all-reduces the other ranks' wait for, and the return (docs/design.md, "Ranks")."""
        stream = self._mechanism.current_stream(tensors[0].device)
        self._order.follow(stream)
        try:
            entry.staging.fill(entry.inputs, tensors, immutable)
            if entry.offsets_per_call:
                self._write_offsets(entry, layout)
            output = torch.empty_like(entry.output)
            self._mechanism.replay(entry.graph)
        except BaseException:
            self._order.mark(stream)  # what was enqueued before the error reads staging on this stream
            raise
        output.copy_(entry.output)
        self._order.mark(stream)  # after the copy, which reads staging
        return output

    @staticmethod
    def _write_offsets(entry: Graph, layout: AttentionLayout) -> None:
        """A padded graph's offsets input: this call's, device-to-device on the caller's stream."""
        for name, offsets in entry.offsets.items():
            offsets.copy_(layout.cu_seqlens_tensor(offsets.device, name))

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


def _nothing() -> None:
    """No preparation before a warm-up or capture."""


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (NaNs too): what graph against eager promises."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
