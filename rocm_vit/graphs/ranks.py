"""Decisions every rank of a tensor-parallel group takes alike.

Under TP a graph's all-reduces wait for every rank's: a rank that captured, replayed or ran a warm-up
alone would leave the others waiting. What ranks measure differently is agreed on first
(docs/design.md, "Ranks").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

# The element-wise maximum of a list of ints over every rank that shares the runner's decisions.
AgreeMax = Callable[[Sequence[int]], list[int]]


def group_max(group: Any = None) -> AgreeMax:
    """``agree_max`` over a CPU (gloo) group such as ``tp_group.cpu_group``: not queued behind device work."""

    def agree(values: Sequence[int]) -> list[int]:
        tensor = torch.tensor(list(values), dtype=torch.int64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
        return tensor.tolist()

    return agree
