"""The graphs a runner holds and the memory they take: staging, the graph pools, the byte budget.

``GraphStore`` keeps the graphs by key, makes room before a capture
(evicting the graph admission names, releasing the pools when a capture may not fit), learns from
each capture what the next will take, and holds the budget after it (docs/design.md, "Pool and
budget"). It never decides which layout deserves a graph (``admission.py``) and never captures or
replays (``runner.py``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from rocm_vit.graphs.admission import Admission
from rocm_vit.graphs.capture import GraphMechanism
from rocm_vit.graphs.memory import PredictionErrors, ScratchBounds
from rocm_vit.graphs.ranks import AgreeMax
from rocm_vit.graphs.staging import Signature, Staging
from rocm_vit.layout import AttentionLayout

logger = logging.getLogger(__name__)

# Default budget: 1/64 of the device's memory, between 256 MiB and 4 GiB (H200: 2.2 GB; MI355X: 4 GiB).
_BUDGET_FRACTION = 64
_MIN_DEFAULT_BUDGET = 256 << 20
_MAX_DEFAULT_BUDGET = 4 << 30


def default_budget_bytes(total_memory_bytes: int) -> int:
    """The byte budget used when none is given: ``total / 64``, clamped to 256 MiB .. 4 GiB."""
    return min(_MAX_DEFAULT_BUDGET, max(_MIN_DEFAULT_BUDGET, total_memory_bytes // _BUDGET_FRACTION))


def graph_offsets(layout: AttentionLayout, device: torch.device) -> dict[str, torch.Tensor]:
    """A new graph's own offsets, made on the caller's stream before the capture stream takes over.

    An exact layout's are copied from pinned host memory and never written again (a host-to-device
    copy right before a replay can be read stale on ROCm: docs/rocm.md, "Hazards"). A padded layout's are copied
    device-to-device here and before each replay, and the kernels read them from a copy that a
    kernel of the graph makes (``ViTGraphRunner._capture``'s ``forward``), never from what a copy wrote. Never
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


@dataclass
class Graph:
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


class GraphStore:
    """At most ``admission.capacity`` graphs by key and their memory, within ``budget_bytes``
    (``None``: ``default_budget_bytes`` of the device, fixed at the first capture), staging at
    ``admission.max_tokens`` rows. ``agree_max``: the element-wise maximum over the ranks that must
    decide alike, for the smallest device's budget."""

    def __init__(
        self,
        mechanism: GraphMechanism,
        admission: Admission,
        *,
        budget_bytes: int | None,
        agree_max: AgreeMax | None,
    ) -> None:
        self._mechanism = mechanism
        self._admission = admission
        self._agree_max = agree_max
        self.budget_bytes = budget_bytes
        # By key. Which graph is used least, and least recently, is admission's to know (``least_used``).
        self.graphs: dict[tuple, Graph] = {}
        self.staging: dict[Signature, Staging] = {}
        self.device: torch.device | None = None
        self.pool: Any = None  # where captures go
        self.stream: Any = None  # warm-ups and captures run on it
        self._retired_pools: list[Any] = []  # pools of failed captures: no graph, memory still reserved
        # The last graph let go of in ``pool``, held until a capture has begun there (``let_go``).
        self.pool_keeper: Any = None
        self.pool_bytes = 0  # reserved by the live and retired pools, as agreed after the last capture
        self.scratch = ScratchBounds()
        self._prediction_errors = PredictionErrors()
        self.evictions = 0
        self.pool_releases = 0
        self._staging_warned = False

    def use_device(self, device: torch.device) -> None:
        """Fix the device at the first capture, and the default budget from its memory (the smallest
        device of the group under tensor parallelism)."""
        if self.device is not None:
            return
        self.device = device
        if self.budget_bytes is None:
            total = self._mechanism.total_memory(device)
            if self._agree_max is not None:
                total = -self._agree_max([-total])[0]
            self.budget_bytes = default_budget_bytes(total)
            logger.info("graph memory budget %.0f MiB (1/64 of %s)", self.budget_bytes / 2**20, device)

    def staging_over_budget(self, signature: Signature) -> bool:
        """Whether staging alone is over the budget: the only refusal before a measurement."""
        fixed_bytes = self._fixed_bytes(signature)
        if fixed_bytes <= self.budget_bytes:
            return False
        if not self._staging_warned:
            self._staging_warned = True
            logger.warning(
                "graph staging for %d tokens needs %.0f MiB, over the %.0f MiB budget; calls run eagerly",
                self._admission.max_tokens,
                fixed_bytes / 2**20,
                self.budget_bytes / 2**20,
            )
        return True

    def staging_for(self, signature: Signature, device: torch.device) -> Staging:
        staging = self.staging.get(signature)
        if staging is None:
            staging = self.staging[signature] = Staging(signature, self._admission.max_tokens, device)
        return staging

    def capture_target(self, device: torch.device) -> tuple[Any, Any]:
        """The pool and stream the next capture goes to: fresh ones after a failed capture."""
        if self.pool is None:
            self.pool = self._mechanism.new_pool(device)
            self.stream = self._mechanism.new_stream(device)
        return self.pool, self.stream

    def retire_pool(self) -> None:
        """After a failed capture: later captures get a fresh pool and stream (a failed capture can
        leave the old ones mid-capture); graphs captured before keep the memory of theirs."""
        if self.pool is not None:
            self._retired_pools.append(self.pool)
        self.pool = None

    def make_room(self, signature: Signature, tokens: int) -> None:
        """Evict the least used graph when at capacity; release the pool when a capture of
        ``tokens`` is predicted to grow it past the budget (graphs hold nothing in it between calls,
        so evicting them would free nothing there). A capture whose bound says it may not fit even
        alone is tried alone: only a measurement refuses it (``Admission.over_budget_from``)."""
        fixed_bytes = self._fixed_bytes(signature)
        while len(self.graphs) >= self._admission.capacity:
            self._evict_least_used()
        need = self.scratch.bound(tokens)
        if need is not None and self.pool_bytes and fixed_bytes + max(self.pool_bytes, need) > self.budget_bytes:
            self.release_pools()

    def add(self, key: tuple, entry: Graph) -> None:
        self.graphs[key] = entry
        self._admission.captured(key)

    def drop_new(self, key: tuple, entry: Graph) -> None:
        """A graph just added that is not kept (its first replay failed or differed)."""
        del self.graphs[key]
        self._admission.dropped(key)
        self.let_go(entry)

    def let_go(self, entry: Graph) -> None:
        """Retire ``entry``'s graph, which no longer is in ``graphs``; the last graph of the pool later
        captures go to is held instead until the next capture there has begun. torch >= 2.11 keeps a
        pinned-host pool beside each graph pool that dies with its last graph; a capture into the
        pool then fails an internal assert (``use_count > 0``, seen on the H200), so every other
        capture of a runner that evicts its pool's last graph would fail."""
        if entry.pool is not self.pool or any(other.pool is entry.pool for other in self.graphs.values()):
            self._mechanism.retire(entry.graph)
            return
        self.release_pool_keeper()
        self.pool_keeper = entry.graph

    def release_pool_keeper(self) -> None:
        if self.pool_keeper is not None:
            self._mechanism.retire(self.pool_keeper)
            self.pool_keeper = None

    def release_pools(self) -> None:
        """Drop every graph and hand the pools' memory back; later captures start a fresh pool."""
        pools = self.live_pools()
        self._retire_all_graphs()  # in a call of its own: no local may keep an output in the pools alive
        self.release_pool_keeper()
        self.pool = None
        self._retired_pools = []
        if pools:
            self._mechanism.release_pools(pools, self.device)
        self.pool_bytes = 0
        self.pool_releases += 1

    def live_pools(self) -> list[Any]:
        """The pool new captures go to, the older ones live graphs were captured into, and retired ones."""
        pools = [] if self.pool is None else [self.pool]
        for pool in (*(entry.pool for entry in self.graphs.values()), *self._retired_pools):
            if all(pool is not known for known in pools):
                pools.append(pool)
        return pools

    def measured_pool_bytes(self) -> int:
        """What the live and retired pools reserve now, read from the allocator (may raise)."""
        return sum(self._mechanism.pool_bytes(pool, self.device) for pool in self.live_pools())

    def learn(self, entry: Graph, need: int | None, pool_before: int) -> None:
        """Learn from a capture what the next ones will take; log the prediction beside the measurement."""
        pool_after = self.pool_bytes
        self.scratch.observe(entry.tokens, pool_after)  # it used at most the whole pool
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

    def hold_budget(self, tokens: int, pool_before: int) -> None:
        """After a capture: past the budget, release the pools; a capture that was alone in an empty
        pool is over the budget by measurement, and so is every larger one."""
        held = self.bytes_held()
        if held <= self.budget_bytes:
            return
        alone = pool_before == 0
        logger.warning(
            "graph memory %.0f MiB after capturing %d tokens is over the %.0f MiB budget; graphs dropped and "
            "the pool released%s",
            held / 2**20,
            tokens,
            self.budget_bytes / 2**20,
            f"; layouts of {tokens} tokens or more run eagerly" if alone else "",
        )
        self.release_pools()
        if alone:
            self._admission.over_budget_from(tokens)

    def bytes_held(self) -> int:
        return self.pool_bytes + self._staging_bytes() + self._offsets_bytes()

    def stats(self) -> dict[str, Any]:
        """What ``ViTGraphRunner.stats`` reports of the graphs and their memory."""
        staging_bytes, offsets_bytes = self._staging_bytes(), self._offsets_bytes()
        return {
            "evictions": self.evictions,
            "pool_releases": self.pool_releases,
            "graphs": len(self.graphs),
            "pool_bytes": self.pool_bytes,
            "staging_bytes": staging_bytes,
            "offsets_bytes": offsets_bytes,
            "bytes_held": self.pool_bytes + staging_bytes + offsets_bytes,
            "budget_bytes": self.budget_bytes,
            "pool_growth_prediction": self._prediction_errors.summary(),
        }

    def _evict_least_used(self) -> None:
        key = self._admission.least_used()
        entry = self.graphs.pop(key)
        try:
            self.let_go(entry)
        except BaseException:
            self.graphs[key] = entry  # still held: the pools are released only once it is retired
            raise
        self._admission.dropped(key)
        self.evictions += 1
        logger.debug("evicted the graph of %d tokens (least used)", entry.tokens)

    def _retire_all_graphs(self) -> None:
        while self.graphs:
            key, entry = self.graphs.popitem()
            self._admission.dropped(key)
            self._mechanism.retire(entry.graph)

    def _fixed_bytes(self, signature: Signature) -> int:
        """Staging and offsets once ``signature``'s staging exists."""
        fixed_bytes = self._staging_bytes() + self._offsets_bytes()
        if signature not in self.staging:
            fixed_bytes += Staging.planned_bytes(signature, self._admission.max_tokens)
        return fixed_bytes

    def _staging_bytes(self) -> int:
        return sum(staging.nbytes for staging in self.staging.values())

    def _offsets_bytes(self) -> int:
        return sum(entry.offsets_bytes for entry in self.graphs.values())
