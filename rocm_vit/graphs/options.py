"""What a ``ViTGraphRunner`` is built with, besides the tower's callables: one value, checked once.

One value built by ``policy.runner_options`` for towers and the SGLang adapter alike, so ``doctor``
prints what the runner will use.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from rocm_vit.graphs.cost import CostModel
from rocm_vit.graphs.padding import Padding
from rocm_vit.settings import DEFAULT_CAPACITY, DEFAULT_MAX_TOKENS, DEFAULT_MIN_HITS


@dataclass(frozen=True)
class RunnerOptions:
    """The runner's limits, cost model and padding (docs/design.md, "Runner" and "Padding"); ``None``
    models mean every layout within the limits, exact only. Raises ``ValueError`` naming the option."""

    capacity: int = DEFAULT_CAPACITY
    min_hits: int = DEFAULT_MIN_HITS
    max_tokens: int = DEFAULT_MAX_TOKENS
    budget_bytes: int | None = None
    cost_model: CostModel | None = None
    padding_model: CostModel | None = None
    padding: Padding | None = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name, value, least in (
            ("capacity", self.capacity, 0),
            ("min_hits", self.min_hits, 1),
            ("max_tokens", self.max_tokens, 0),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ValueError(f"{name} = {value!r} must be an int >= {least}")
        budget = self.budget_bytes
        if budget is not None and (not isinstance(budget, int) or budget < 0):
            raise ValueError(f"budget_bytes = {budget!r} must be an int >= 0 or None (device default)")
        padding = None if self.padding_model is None else Padding(self.padding_model, self.max_tokens)
        object.__setattr__(self, "padding", padding)

    def with_max_tokens(self, max_tokens: int) -> RunnerOptions:
        """These options for calls of at most ``max_tokens`` patches: the padding's buckets follow."""
        return dataclasses.replace(self, max_tokens=max_tokens)

    def report(self) -> dict[str, Any]:
        """For ``rocm-vit doctor``: plain values, the cost model by its launch time and blocks."""
        model = self.cost_model
        return {
            "capacity": self.capacity,
            "min_hits": self.min_hits,
            "max_tokens": self.max_tokens,
            "budget_bytes": "1/64 of the device, 256 MiB .. 4 GiB" if self.budget_bytes is None else self.budget_bytes,
            "admission": "every layout within the limits"
            if model is None
            else f"by the cost model ({model.blocks} blocks, launch {model.launch_ms} ms until measured)",
            "padding": "exact layouts only" if self.padding is None else f"buckets {self.padding.buckets}",
        }
