"""ViTGraphRunner: graphs for a server's small, repeated calls, within a memory budget, for any caller.

Invariants, each against a hazard of docs/design.md ("Runner", "Hazards"):
- the key holds every offset and per-call tensor shape, so a replay never serves another layout;
  a padded graph takes its offsets per call, read from a copy a kernel of the graph makes;
- each exact graph owns its offsets, written once (a host copy before a replay is read stale on ROCm);
- staging is allocated once per signature at the token ceiling and the pool holds nothing between
  calls, so memory stays within the budget;
- a graph is kept only if its first replay equals its warm-up bit for bit; captures run inside the
  caller's call, on its thread (``capture.py``);
- calls are decided, captured and replayed one at a time under the lock, eager ones outside it;
- admission follows the call sequence and rank-agreed figures, so tensor-parallel ranks decide alike.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from rocm_vit.graphs.admission import EAGER_REASONS, Admission, LaunchSample
from rocm_vit.graphs.call import Call
from rocm_vit.graphs.capture import Captures
from rocm_vit.graphs.forward import Forward, ForwardBlocks, LayoutArgs
from rocm_vit.graphs.options import RunnerOptions
from rocm_vit.graphs.padding import Padding
from rocm_vit.graphs.ranks import AgreeMax
from rocm_vit.graphs.store import GraphStore
from rocm_vit.graphs.torch_graphs import CudaGraphs, GraphMechanism
from rocm_vit.layout import AttentionLayout

__all__ = ["ForwardBlocks", "LayoutArgs", "ViTGraphRunner"]

logger = logging.getLogger(__name__)

_DEFAULT_OPTIONS = RunnerOptions()  # frozen, and without padding: nothing in it is shared state


class ViTGraphRunner:
    """Runs ``forward_blocks(x, attn_args, cos, sin, *inputs)`` under graphs keyed by the exact layout.

    ``layout_args(layout, cu_seqlens)`` must reference the given offsets and read nothing back from
    the device. ``run`` returns a tensor the caller owns, ready on its stream, and raises only what
    eager ``forward_blocks`` would. ``agree_max``: the element-wise maximum over ranks that must
    decide alike; ``prepare_capture`` runs on the runner's stream before each warm-up, so what
    ``forward_blocks`` makes lazily is made outside the pool; ``capture_scope`` wraps each capture,
    never its warm-up, and every rank leaves it together (a custom all-reduce registers there);
    ``agree_before_replay``: one more ``agree_max`` before every replay's launch, where an eager call
    on one rank does not pair with a replay on the others (``Forward``'s ``launch_agreement``).
    """

    def __init__(
        self,
        forward_blocks: ForwardBlocks,
        layout_args: LayoutArgs,
        options: RunnerOptions = _DEFAULT_OPTIONS,
        *,
        mechanism: GraphMechanism | None = None,
        prepare_capture: Callable[[], None] | None = None,
        agree_max: AgreeMax | None = None,
        capture_scope: Callable[[], contextlib.AbstractContextManager] | None = None,
        agree_before_replay: bool = False,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if agree_before_replay and agree_max is None:
            raise ValueError("agree_before_replay=True needs agree_max: the ranks that replay together")
        self.options = options
        self._mechanism = mechanism or CudaGraphs()
        self._agree_max = agree_max
        launch_agreement = agree_max if agree_before_replay else None
        self._forward = Forward(forward_blocks, layout_args, self._mechanism, launch_agreement)
        self._admission = Admission(options, agree=self._agree)
        self._store = GraphStore(self._mechanism, options, agree_max=agree_max)
        self._captures = Captures(
            self._forward,
            self._store,
            self._admission,
            self._mechanism,
            agree=self._agree,
            shares_decisions=agree_max is not None,
            prepare_capture=prepare_capture or _nothing,
            capture_scope=capture_scope,
        )
        self._clock = clock
        self._lock = threading.Lock()
        self._counts_lock = threading.Lock()  # eager runs counted without the runner's lock
        self._padded_calls = 0
        self._replays = 0
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
        """Forward ``x`` ``[N, ...]`` laid out as ``layout``; ``cos``/``sin`` ``[N, head_dim]``.

        ``inputs``: further tensors ``forward_blocks`` reads, copied into staging before each replay
        like ``x``. ``immutable=True`` promises ``cos``, ``sin`` and ``inputs`` are never written
        after they are passed, so the very same tensor is not copied again. The output is freshly
        allocated: no later call changes it. Raises ``ValueError`` before anything runs when a
        tensor's rows or device do not fit ``layout``.
        """
        call = Call.of((x, cos, sin, *inputs), layout, self.options.padding, immutable)
        if call.layout.offsets_per_call:
            with self._counts_lock:
                self._padded_calls += 1
        with self._lock:
            output, reason = self._serve(call)
        if output is None:  # outside the lock: threads run it at once
            output = self._timed_eager(call, timed=reason != "no_gpu")
        return call.callers_rows(output)

    def run_eager(
        self, x: torch.Tensor, layout: AttentionLayout, cos: torch.Tensor, sin: torch.Tensor, *inputs: torch.Tensor
    ) -> torch.Tensor:
        """What ``run`` computes, without graphs and without counting: a layout the padding pads runs
        padded here too, so this is the eager reference a replay equals bit for bit."""
        call = Call.of((x, cos, sin, *inputs), layout, self.options.padding, immutable=False)
        return call.callers_rows(self._forward.eager(call.run_tensors, call.layout))

    def _serve(self, call: Call) -> tuple[torch.Tensor | None, str | None]:
        """Under the runner's lock: replay the call's graph, or capture it (on this thread, inside this
        call); either way ``(output, None)``. Else ``(None, why it runs eagerly)``."""
        if self._admission.called():
            self._store.halve_uses()
        entry = self._store.graph_to_replay(call.key)
        if entry is not None:
            output = self._forward.replay(entry, call.layout, call.tensors, call.immutable)
            self._replays += 1
            return output, None
        reason = self._admit(call)
        if reason is not None:
            self._eager_runs[reason] += 1
            return None, reason
        output, failure = self._captures.serve(call)
        if failure is None:
            self._replays += 1  # the new graph's first replay served it
        else:
            self._eager_runs[failure] += 1
        return output, None

    def _admit(self, call: Call) -> str | None:
        """Why the call runs eagerly now, or ``None`` to capture it; the first capture fixes the device
        and its default budget."""
        device = call.tensors[0].device
        if not self._mechanism.available(device):
            if not self._warned_no_gpu:
                self._warned_no_gpu = True
                logger.warning("graphs need a CUDA/ROCm device; running %s eagerly", device)
            return "no_gpu"
        reason = self._admission.decide(call.key, call.layout, self._store.uses_to_beat())
        if reason is not None:
            return reason
        self._store.use_device(device)
        return "over_budget" if self._store.staging_over_budget(call.signature) else None

    def _timed_eager(self, call: Call, timed: bool) -> torch.Tensor:
        started = self._clock()
        output = self._forward.eager(call.run_tensors, call.layout)
        if timed:  # outside the runner's lock: other threads time theirs
            self._admission.timed(call.layout, (self._clock() - started) * 1e3)
        return output

    def _agree(self, values: list[int]) -> list[int]:
        """``values`` as every rank sees them: the element-wise maximum over the group."""
        return values if self._agree_max is None else self._agree_max(values)

    @property
    def capacity(self) -> int:
        return self.options.capacity

    @property
    def min_hits(self) -> int:
        return self.options.min_hits

    @property
    def max_tokens(self) -> int:
        """The most patches a captured call has: the admission guard and the staging's rows."""
        return self.options.max_tokens

    @property
    def padding(self) -> Padding | None:
        """The static rule of which layouts run padded (``None``: none do)."""
        return self.options.padding

    def launch_samples(self) -> list[LaunchSample]:
        """The eager runs behind the launch time learned so far (``Admission.launch_samples``)."""
        return self._admission.launch_samples()

    def counters(self) -> dict[str, int]:
        """Calls served so far by kind; unlike ``stats``, read without the runner's lock, so another
        thread never waits for a capture to read them."""
        with self._counts_lock:
            return {"replays": self._replays, "captures": self._captures.count, **self._eager_runs,
                    "padded": self._padded_calls}  # fmt: skip

    def stats(self) -> dict[str, Any]:
        """Counters, bytes held against the budget, and the pool growth predicted against taken."""
        with self._lock:
            return {
                "captures": self._captures.count,
                "replays": self._replays,
                "eager_runs": dict(self._eager_runs),
                "padded_calls": self._padded_calls,
                "capture_seconds": self._captures.capture_seconds,
                "verify_seconds": self._captures.verify_seconds,
                **self._store.stats(),
                **self._admission.stats(),
            }


def _nothing() -> None:
    """No preparation before a warm-up or capture."""
