"""The capture protocol: capture a call's layout inside that call, keep the graph only if its first
replay equals its warm-up bit for bit on every rank, and serve the call either way.

Invariants (docs/design.md, "Runner", "Ranks" and "Hazards"):
- captures run inside the caller's call, after an eager warm-up on the runner's stream: no thread of
  the runner's own touches the device while the server's do (that broke captures on HIP and CUDA);
- ranks never part ways: a failure on one rank is agreed before any rank takes a step the others
  would skip, and a forward that did not run here runs eagerly in its place;
- a ``capture_scope`` wraps only the capture and every rank leaves it together;
- a pool is released only once no local holds the warm-up's output.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from rocm_vit.graphs.admission import Admission
from rocm_vit.graphs.call import Call
from rocm_vit.graphs.forward import Forward
from rocm_vit.graphs.ranks import AgreeMax
from rocm_vit.graphs.store import Graph, GraphStore
from rocm_vit.graphs.torch_graphs import GraphMechanism
from rocm_vit.layout import AttentionLayout

logger = logging.getLogger(__name__)


@dataclass
class _Attempt:
    """A capture's outcome before the ranks agree on it."""

    entry: Graph | None
    reference: torch.Tensor | None  # the warm-up's output, which the first replay must equal; None if it did not run
    error: Exception | None
    pool_before: int  # the pool's bytes once room was made, before the capture
    # Graphs were let go of or pools released before the error: this rank's graphs may differ from the others'.
    room_failed: bool = False


class Captures:
    """Captures for one runner into its ``store``, reporting to its ``admission``. ``shares_decisions``:
    other ranks run the same calls (``agree`` is their maximum)."""

    def __init__(
        self,
        forward: Forward,
        store: GraphStore,
        admission: Admission,
        mechanism: GraphMechanism,
        *,
        agree: AgreeMax,
        shares_decisions: bool,
        prepare_capture: Callable[[], None],
        capture_scope: Callable[[], contextlib.AbstractContextManager] | None = None,
    ) -> None:
        self._forward = forward
        self._store = store
        self._admission = admission
        self._mechanism = mechanism
        self._agree = agree
        self._shares_decisions = shares_decisions
        self._prepare_capture = prepare_capture
        self._capture_scope = capture_scope
        self._ready_agreed = False  # this attempt's ranks agreed they reached the capture (capture_scope)
        self.count = 0
        self.capture_seconds = 0.0
        self.verify_seconds = 0.0

    def serve(self, call: Call) -> tuple[torch.Tensor, str | None]:
        """Capture ``call``'s layout and serve the call: ``(output, None)`` by the new graph's first
        replay, or ``(output, reason)`` eagerly where the graph is not kept (``capture_failed``,
        ``capture_unverified``: that layout runs eagerly for good). Raises only what an eager run of
        the call raises."""
        output, failure, pool_before = self._capture_and_verify(call)
        # Here, not inside: a pool is released only once no local holds the warm-up's output.
        tokens = call.layout.num_patches
        if self._store.hold_budget(tokens, pool_before):
            self._admission.over_budget_from(tokens)
        return output, failure

    def _capture_and_verify(self, call: Call) -> tuple[torch.Tensor, str | None, int]:
        """Capture, keep the graph only if every rank captured it and its first replay equals its
        warm-up everywhere, and serve the call; also the pool's bytes before the capture.

        Every rank runs the same forwards in the same order, so their all-reduces pair: a failure
        on one rank is agreed first, and a forward that failed before launching runs eagerly."""
        store, layout, tensors = self._store, call.layout, call.run_tensors
        need = store.scratch.bound(layout.num_patches)
        started = time.perf_counter()
        self._ready_agreed = False
        attempt = self._capture(call)
        if attempt.reference is None and self._shares_decisions:
            self._forward.eager(tensors, layout)  # the warm-up's forward, in its place; raises if eager fails
        if self._capture_scope is not None and not self._ready_agreed:
            self._agree([1])  # the others' agreement before their capture (_scoped_capture): none captures
        try:
            measured = store.measured_pool_bytes()
        except Exception as error:  # the allocator cannot be read: treat it as a failed capture
            attempt, measured = replace(attempt, error=attempt.error or error), store.pool_bytes
        failed, room_failed, pool_bytes = self._agree(
            [int(attempt.error is not None), int(attempt.room_failed), measured]
        )
        store.record_pool_bytes(pool_bytes)
        if failed and attempt.entry is not None:
            store.let_go(attempt.entry)
        if room_failed:  # graphs went on one rank only: every rank starts again from none
            store.release_pools()
        if failed:
            output = self._forward.eager(tensors, layout)  # raises if eager fails too: nothing marked
            self._remember_failure(call, "capture_failed", attempt.error or "another rank's capture failed")
            return output, "capture_failed", attempt.pool_before
        store.add(call.key, attempt.entry, uses=self._admission.captured(call.key))
        self.count += 1
        self.capture_seconds += time.perf_counter() - started
        store.learn(attempt.entry, need, attempt.pool_before)
        output, failure = self._verify(call, attempt)
        return output, failure, attempt.pool_before

    def _verify(self, call: Call, attempt: _Attempt) -> tuple[torch.Tensor, str | None]:
        """Serve the call by the new graph's first replay, and keep the graph only if that replay ran
        and equals the warm-up bit for bit on every rank; else drop it and serve the call eagerly."""
        started, entry = time.perf_counter(), attempt.entry
        output, replay_error = self._first_replay(entry, call)
        differs = output is None or not _bitwise_equal(output, attempt.reference)
        replay_failed, unverified = self._agree([int(replay_error is not None), int(differs)])
        self.verify_seconds += time.perf_counter() - started
        if not (replay_failed or unverified):
            return output, None
        self._store.drop_new(call.key, entry)
        if replay_failed:
            reason, why = "capture_failed", replay_error or "another rank's first replay failed"
        else:
            reason, why = "capture_unverified", "its first replay differs from an eager run of its inputs"
        output = self._forward.eager(call.run_tensors, call.layout)
        self._remember_failure(call, reason, why)
        return output, reason

    def _first_replay(self, entry: Graph, call: Call) -> tuple[torch.Tensor | None, Exception | None]:
        """A new graph's first replay: its output, or the error that stopped it. A replay that raised
        before its launch runs eagerly in its place under tensor parallelism: the other ranks'
        replays wait in their all-reduces for this rank's."""
        tensors, layout = call.run_tensors, call.layout
        try:
            return self._forward.replay(entry, layout, tensors, call.immutable), None
        except Exception as error:  # raised before the replay launched: nothing can fail after it
            if self._shares_decisions:
                self._forward.eager(tensors, layout)
            return None, error

    def _capture(self, call: Call) -> _Attempt:
        """Make room, then capture on the runner's stream after an eager warm-up there, so what
        ``forward_blocks`` makes lazily (and compiles) is made outside the capture. Never raises."""
        layout, tensors, store, order = call.layout, call.run_tensors, self._store, self._forward.order
        device = tensors[0].device
        reference = None
        try:
            store.make_room(call.signature, layout.num_patches)
        except Exception as error:
            return _Attempt(None, reference, error, store.pool_bytes, room_failed=True)
        pool_before = store.pool_bytes
        try:
            offsets = _graph_offsets(layout, device)
            pool, stream = store.capture_target(device)
            with self._mechanism.on_stream(stream):
                order.follow(stream)
                try:
                    staging = store.staging_for(call.signature, device)
                    views = staging.views(tensors)
                    staging.fill(views, tensors, call.immutable)
                    forward = self._forward.on_staging(views, layout, offsets)
                    self._prepare_capture()
                    reference = self._mechanism.warm_up(forward, pool, stream)
                    output_view = staging.output_view(reference, layout.num_patches)

                    def forward_into_staging() -> torch.Tensor:
                        return output_view.copy_(forward())

                    graph, output = self._scoped_capture(forward_into_staging, pool, stream)
                finally:
                    # Warm-up reads staging on this stream, also when the capture then fails.
                    order.mark(stream)
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

    def _remember_failure(self, call: Call, reason: str, why: object) -> None:
        layout = call.layout
        self._admission.failed(call.key, reason)
        logger.warning(
            "graph capture of %d tokens in %d segments is not used (%s: %s); this layout runs eagerly",
            layout.num_patches,
            len(layout.segmentations["full"].seq_lens),
            reason,
            f"{type(why).__name__}: {why}" if isinstance(why, Exception) else why,
        )


def _graph_offsets(layout: AttentionLayout, device: torch.device) -> dict[str, torch.Tensor]:
    """A new graph's own offsets, made on the caller's stream before the capture stream takes over.

    An exact layout's are never written again (a host copy right before a replay can be read stale
    on ROCm); a padded layout's kernels read them from a copy a kernel of the graph makes. Never on
    the capture stream: a pinned block's free recorded there during a later capture would be a
    captured event, and the next pinned allocation of any thread fails (docs/design.md, "Hazards").
    """
    if layout.offsets_per_call:
        return {name: layout.cu_seqlens_tensor(device, name).clone() for name in layout.segmentations}
    return {
        name: torch.empty_like(host, device=device).copy_(host, non_blocking=True)
        for name in layout.segmentations
        for host in (layout.cu_seqlens_host(name),)
    }


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (NaNs too): what graph against eager promises."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
