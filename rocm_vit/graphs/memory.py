"""What a capture needs from the shared graph pool, bounded from what captures took.

Graphs hold nothing in the shared pool between calls. Each capture bounds its need by the pool after it;
a bound at T' >= T covers T; past the largest T seen the lowest bound per token is scaled up. Invariant:
a smaller capture's bound is never carried to a larger one (docs/design.md, "Hazards").
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field


@dataclass
class ScratchBounds:
    """Upper bounds on a capture's pool bytes ("scratch") by token count, from every capture observed."""

    # (tokens, bytes), increasing in both: a point with fewer tokens and more bytes is dominated.
    _staircase: list[tuple[int, int]] = field(default_factory=list)
    _bytes_per_token: float = math.inf

    def bound(self, tokens: int) -> int | None:
        """An upper bound on the scratch of a capture of ``tokens``; ``None`` before any capture."""
        if not self._staircase:
            return None
        index = bisect.bisect_left(self._staircase, (tokens, -1))
        if index < len(self._staircase):
            return self._staircase[index][1]
        return math.ceil(self._bytes_per_token * tokens)

    def observe(self, tokens: int, scratch_bytes: int) -> None:
        """Record that a capture of ``tokens`` needed at most ``scratch_bytes`` of the pool."""
        scratch_bytes = max(0, scratch_bytes)
        self._bytes_per_token = min(self._bytes_per_token, scratch_bytes / tokens)
        index = bisect.bisect_left(self._staircase, (tokens, -1))
        if index < len(self._staircase) and self._staircase[index][1] <= scratch_bytes:
            return  # a capture at least as large needed no more
        # Drop the points this one dominates: fewer or as many tokens, at least as many bytes.
        start = index
        while start > 0 and self._staircase[start - 1][1] >= scratch_bytes:
            start -= 1
        end = index + 1 if index < len(self._staircase) and self._staircase[index][0] == tokens else index
        self._staircase[start:end] = [(tokens, scratch_bytes)]


@dataclass
class PredictionErrors:
    """How far predicted pool growth was from measured growth, over the captures that had a prediction."""

    captures: int = 0
    total_absolute_bytes: int = 0
    worst_under_bytes: int = 0  # the largest growth beyond the prediction

    def add(self, predicted_bytes: int, measured_bytes: int) -> None:
        self.captures += 1
        self.total_absolute_bytes += abs(measured_bytes - predicted_bytes)
        self.worst_under_bytes = max(self.worst_under_bytes, measured_bytes - predicted_bytes)

    def summary(self) -> dict[str, int | float]:
        return {
            "captures": self.captures,
            "mean_absolute_error_bytes": self.total_absolute_bytes / self.captures if self.captures else 0.0,
            "worst_under_bytes": self.worst_under_bytes,
        }
