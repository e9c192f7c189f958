"""The ranks of a tensor-parallel group that run one tower's calls, and what keeps them in step.

``agreement_group``: who they are, read from SGLang's parallel state. ``RunnerFailures``: when they
stop using rocm-vit's runner. A failure inside rocm-vit that launched no collective (a replay whose
staging could not be filled, a layout that could not be built) is served on that rank by SGLang's
eager blocks, whose all-reduces pair with the other ranks' replay; where they would not (SGLang's
own custom all-reduce), the ranks agreed before the launch and every rank serves it so. That rank
must not drop its runner alone: the others would wait in its next capture's agreement. So every
``every`` calls the ranks agree whether any of them failed, and if one did, all stop at that call.
``ForwardFailedUnderTP``: a forward that may have launched collectives, never run again on one
rank (docs/design.md, "Ranks").
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from rocm_vit.graphs.ranks import AgreeMax

logger = logging.getLogger(__name__)


class ForwardFailedUnderTP(BaseException):
    """SGLang's forward raised on this rank under tensor parallelism, outside a capture: some of its
    all-reduces may have run, the others' are waited for by the other ranks. A ``BaseException``, so
    that no handler of the runner re-runs the forward on this rank alone (its all-reduces would pair
    with the other ranks' next calls); the adapter turns it into the request's error."""


def agreement_group(vit: nn.Module) -> Any | None:
    """SGLang's group of ranks that run the same calls of ``vit``, or ``None`` where a rank runs its own.

    The group the tower's row-parallel layers all-reduce over: with ``--enable-dp-attention`` the
    attention-TP group (each attention-DP rank encodes its own requests' images), else the TP group
    (an encode server's, in disaggregated serving: its own world). ``None`` for a data-parallel
    encoder (``--mm-enable-dp-encoder``: every rank its own images, nothing all-reduced), for a group of
    one, and outside a server. Read from SGLang's parallel state, as its layers read it."""
    if getattr(vit, "use_data_parallel", False):
        return None
    try:
        from sglang.srt.layers.dp_attention import is_dp_attention_enabled
        from sglang.srt.runtime_context import get_parallel

        parallel = get_parallel()
        group = parallel.attn_tp_group if is_dp_attention_enabled() else parallel.tp_group
    except Exception as error:  # no parallel state (a tower built outside a server): one rank
        logger.debug("rocm-vit graph runner: no SGLang parallel group (%s); deciding alone", error)
        return None
    return group if getattr(group, "world_size", 1) > 1 else None


class RunnerFailures:
    """One rank's failures and the agreement on them; ``agree`` is ``None`` for a rank alone."""

    def __init__(self, agree: AgreeMax | None, every: int) -> None:
        self._agree = agree
        self._every = every
        self._calls = 0
        self.count = 0  # calls rocm-vit failed on this rank
        self.serving = True

    def before_call(self) -> None:
        """Count a call of the runner; at every ``every``-th, agree and stop if any rank failed.

        Every rank of the group makes the same calls, so each reaches the agreement at the same one."""
        if not self.serving or self._agree is None:
            return
        self._calls += 1
        if self._calls % self._every:
            return
        (failed,) = self._agree([int(self.count > 0)])
        if failed:
            self.serving = False

    def failed(self) -> None:
        """This rank's runner failed a call before launching a collective. A rank alone stops now;
        under a group, at the next agreement, with every rank."""
        self.count += 1
        if self._agree is None:
            self.serving = False

    def stop(self) -> None:
        """Stop serving on every rank at once: only where every rank stops at this same call."""
        self.serving = False


def stream_capturing() -> bool:
    """Whether the caller's stream is capturing a graph: its kernels launch nothing now."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
