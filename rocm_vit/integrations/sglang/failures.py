"""When the ranks of a tensor-parallel group stop serving a tower through rocm-vit's runner.

A failure inside rocm-vit that launched no collective (a replay whose staging could not be filled,
a layout that could not be built) is served on that rank by SGLang's eager blocks, whose
all-reduces pair with the other ranks' replay. That rank must not drop its runner alone: the others
would wait in its next capture's agreement. So every ``every`` calls the ranks agree whether any of
them failed, and if one did, all stop at that same call (docs/design.md, "Ranks").
"""

from __future__ import annotations

from rocm_vit.graphs.ranks import AgreeMax


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
