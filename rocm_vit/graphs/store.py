"""The graphs a runner holds and the memory they take: staging, the graph pools, the byte budget.

It learns from each capture what the next will take, so the budget holds without a device query per
call (docs/design.md, "Pool and budget"); it never decides, captures or replays.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from rocm_vit.graphs.memory import PredictionErrors, ScratchBounds
from rocm_vit.graphs.options import RunnerOptions
from rocm_vit.graphs.ranks import AgreeMax
from rocm_vit.graphs.staging import Signature, Staging
from rocm_vit.graphs.torch_graphs import GraphMechanism

logger = logging.getLogger(__name__)

# Default budget: 1/64 of the device's memory, between 256 MiB and 4 GiB (H200: 2.2 GB; MI355X: 4 GiB).
_BUDGET_FRACTION = 64
_MIN_DEFAULT_BUDGET = 256 << 20
_MAX_DEFAULT_BUDGET = 4 << 30


def default_budget_bytes(total_memory_bytes: int) -> int:
    """The byte budget used when none is given: ``total / 64``, clamped to 256 MiB .. 4 GiB."""
    return min(_MAX_DEFAULT_BUDGET, max(_MIN_DEFAULT_BUDGET, total_memory_bytes // _BUDGET_FRACTION))


@dataclass
class Graph:
    """A captured layout: the graph, the staging views it reads and writes, the offsets it reads."""

    graph: Any
    output: torch.Tensor  # a view of staging's output buffer
    pool: Any  # the pool it was captured into (a failed capture moves later ones to a fresh pool)
    staging: Staging
    inputs: tuple[torch.Tensor, ...]  # views of staging.inputs, one per per-call tensor
    # Written once, or before each replay where offsets are a per-call input.
    offsets: dict[str, torch.Tensor]
    tokens: int
    offsets_per_call: bool = False
    uses: int = 1  # calls served or counted towards it, halved with admission's counts

    @property
    def offsets_bytes(self) -> int:
        return sum(offsets.nbytes for offsets in self.offsets.values())


class GraphStore:
    """At most ``options.capacity`` graphs and their memory within the budget (default: the smallest
    rank's device's, fixed at the first capture)."""

    def __init__(
        self,
        mechanism: GraphMechanism,
        options: RunnerOptions,
        *,
        agree_max: AgreeMax | None,
    ) -> None:
        self._mechanism = mechanism
        self._agree_max = agree_max
        self._capacity = options.capacity
        self._max_tokens = options.max_tokens
        self.budget_bytes = options.budget_bytes
        # By key, least recently used first.
        self.graphs: OrderedDict[tuple, Graph] = OrderedDict()
        self.staging: dict[Signature, Staging] = {}
        self.device: torch.device | None = None
        self.pool: Any = None  # where captures go
        self.stream: Any = None  # warm-ups and captures run on it
        self._retired_pools: list[Any] = []  # pools of failed captures: no graph, memory still reserved
        # The last graph let go of in ``pool``, held until a capture has begun there (``let_go``).
        self.pool_keeper: Any = None
        self._pool_bytes = 0  # reserved by the live and retired pools, as agreed after the last capture
        self.scratch = ScratchBounds()
        self._prediction_errors = PredictionErrors()
        self.evictions = 0
        self.pool_releases = 0
        self._staging_warned = False

    def use_device(self, device: torch.device) -> None:
        """Fix the device and the default budget at the first capture."""
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
                self._max_tokens,
                fixed_bytes / 2**20,
                self.budget_bytes / 2**20,
            )
        return True

    def staging_for(self, signature: Signature, device: torch.device) -> Staging:
        staging = self.staging.get(signature)
        if staging is None:
            staging = self.staging[signature] = Staging(signature, self._max_tokens, device)
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
        """Evict the least used graph at capacity; release the pool when a capture is predicted to
        grow it past the budget (graphs hold nothing there between calls, so evicting frees nothing).
        Only a measurement refuses a capture that may not fit alone."""
        fixed_bytes = self._fixed_bytes(signature)
        while len(self.graphs) >= self._capacity:
            self._evict_least_used()
        need = self.scratch.bound(tokens)
        if need is not None and self.pool_bytes and fixed_bytes + max(self.pool_bytes, need) > self.budget_bytes:
            self.release_pools()

    def add(self, key: tuple, entry: Graph, uses: int) -> None:
        """Hold ``entry`` as ``key``'s graph, with the calls that led to it counted as its ``uses``."""
        entry.uses = uses
        self.graphs[key] = entry

    def graph_to_replay(self, key: tuple) -> Graph | None:
        """``key``'s graph with this call counted as one more use, or ``None`` where none is held."""
        entry = self.graphs.get(key)
        if entry is not None:
            entry.uses += 1
            self.graphs.move_to_end(key)
        return entry

    def uses_to_beat(self) -> int | None:
        """At capacity, the uses of the graph a capture would evict; ``None`` while there is room."""
        if not self.graphs or len(self.graphs) < self._capacity:
            return None
        return self.graphs[self._least_used()].uses

    def halve_uses(self) -> None:
        """Age the uses with admission's call counts (``Admission.called``)."""
        for entry in self.graphs.values():
            entry.uses //= 2

    def drop_new(self, key: tuple, entry: Graph) -> None:
        """A graph just added that is not kept (its first replay failed or differed)."""
        del self.graphs[key]
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
        self._pool_bytes = 0
        self.pool_releases += 1

    def live_pools(self) -> list[Any]:
        """The pool new captures go to, the older ones live graphs were captured into, and retired ones."""
        pools = [] if self.pool is None else [self.pool]
        for pool in (*(entry.pool for entry in self.graphs.values()), *self._retired_pools):
            if all(pool is not known for known in pools):
                pools.append(pool)
        return pools

    @property
    def pool_bytes(self) -> int:
        """What the live and retired pools reserve, as the ranks agreed after the last capture."""
        return self._pool_bytes

    def record_pool_bytes(self, agreed_bytes: int) -> None:
        """After a capture, the pools' bytes, the largest of all ranks', so all make room alike."""
        self._pool_bytes = agreed_bytes

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

    def hold_budget(self, tokens: int, pool_before: int) -> bool:
        """After a capture: past the budget, release the pools. Returns whether the capture was alone
        in an empty pool and over the budget: by measurement, so is every larger one."""
        held = self.bytes_held()
        if held <= self.budget_bytes:
            return False
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
        return alone

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

    def _least_used(self) -> tuple:
        """The held graph called least often (the least recently used among equals): the one to evict."""
        return min(self.graphs, key=lambda key: self.graphs[key].uses)

    def _evict_least_used(self) -> None:
        key = self._least_used()
        entry = self.graphs.pop(key)
        try:
            self.let_go(entry)
        except BaseException:
            self.graphs[key] = entry  # still held: the pools are released only once it is retired
            raise
        self.evictions += 1
        logger.debug("evicted the graph of %d tokens (least used)", entry.tokens)

    def _retire_all_graphs(self) -> None:
        while self.graphs:
            _, entry = self.graphs.popitem()
            self._mechanism.retire(entry.graph)

    def _fixed_bytes(self, signature: Signature) -> int:
        """Staging and offsets once ``signature``'s staging exists."""
        fixed_bytes = self._staging_bytes() + self._offsets_bytes()
        if signature not in self.staging:
            fixed_bytes += Staging.planned_bytes(signature, self._max_tokens)
        return fixed_bytes

    def _staging_bytes(self) -> int:
        return sum(staging.nbytes for staging in self.staging.values())

    def _offsets_bytes(self) -> int:
        return sum(entry.offsets_bytes for entry in self.graphs.values())
