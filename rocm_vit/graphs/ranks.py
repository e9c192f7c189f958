"""Decisions every rank of a tensor-parallel group takes alike.

Under tensor parallelism a capture is a collective step: SGLang's custom all-reduce registers each
graph's buffers across ranks when a capture ends, so a rank that captures while another runs eagerly
hangs the group. The runner decides from the call sequence, which every rank sees alike, and from
what each rank measures (pool bytes, a failed or unverified capture), which it agrees on first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from rocm_vit.graphs.runner import AgreeMax


def group_max(group: Any = None) -> AgreeMax:
    """``agree_max`` over a ``torch.distributed`` group: one all-reduce of a few host ints.

    ``group`` should be a CPU (gloo) group, as SGLang's ``tp_group.cpu_group``: the values live on
    the host and the reduction must not queue behind the device's work. ``None``: the default group.
    """

    def agree(values: Sequence[int]) -> list[int]:
        tensor = torch.tensor(list(values), dtype=torch.int64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
        return tensor.tolist()

    return agree
