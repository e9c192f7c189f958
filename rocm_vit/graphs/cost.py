"""What a graph saves on one call, predicted from the call's layout.

A replay costs the device time D plus a little host work; eager at least max(L, D), L the host's
launch time. Launch-bound calls (D up to 0.8 L) sat well above max(L, D), so eager is the soft maximum
(L^3 + D^3)^(1/3) there (docs/cost-model.md). Past 0.8 L hosts disagree (docs/benchmarks.md, "Figures
behind constants"), so the model stays flat at 1.15 L until D is larger: a call past about 1.1 L is
predicted to save under the 5 % margin. D is linear in tokens and in the sum of squared segment lengths.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

# A graph must be predicted to save at least this share of the eager call (the model's error margin).
MIN_SAVING_SHARE = 0.05
# An exact layout is captured once its predicted savings add up to this share of a capture's cost:
# seen n times, it is taken to come back at least n / PAYBACK_SHARE times, so a one-off is not captured for a
# sliver. Fitted in `bench-traffic` over 0.1-1 at launch times of 10-22 ms (86ff825).
PAYBACK_SHARE = 0.2
# Qwen3-VL-8B on an H200, 27 blocks (docs/cost-model.md, "Eager against replay by patch count").
_H200_8B_BLOCKS = 27
_SOFT_MAX_POWER = 3  # of the eager time's soft maximum of launch and device time
# Device over launch time up to which eager is the soft maximum of the two.
_SOFT_UNTIL = 0.8


@dataclass(frozen=True)
class CostModel:
    """Eager and replay milliseconds of one call through ``blocks`` blocks, from its segment lengths
    (``device_*`` per block; ``capture_ms`` includes the verification)."""

    blocks: int = _H200_8B_BLOCKS
    launch_ms: float = 10.0
    device_base_ms: float = 1.02 / _H200_8B_BLOCKS
    device_ms_per_token: float = 1.66e-3 / _H200_8B_BLOCKS
    device_ms_per_square: float = 3.89e-7 / _H200_8B_BLOCKS
    replay_host_ms: float = 0.1
    capture_ms: float = 60.0

    def for_blocks(self, blocks: int) -> CostModel:
        """The same per-block costs for a tower of ``blocks`` blocks (launch time and a capture, which
        launches the forward and checks a replay, scale with them)."""
        scale = blocks / self.blocks
        return replace(self, blocks=blocks, launch_ms=self.launch_ms * scale, capture_ms=self.capture_ms * scale)

    def with_launch_ms(self, launch_ms: float) -> CostModel:
        return replace(self, launch_ms=launch_ms)

    def device_ms(self, seq_lens: Sequence[int]) -> float:
        tokens = sum(seq_lens)
        squares = sum(length * length for length in seq_lens)
        per_block = self.device_base_ms + self.device_ms_per_token * tokens + self.device_ms_per_square * squares
        return self.blocks * per_block

    def eager_ms(self, seq_lens: Sequence[int]) -> float:
        return _eager_ms(self.launch_ms, self.device_ms(seq_lens))

    def replay_ms(self, seq_lens: Sequence[int]) -> float:
        return self.device_ms(seq_lens) + self.replay_host_ms

    def saving_ms(self, seq_lens: Sequence[int]) -> float:
        """Eager minus replay: negative where the device is the bottleneck."""
        return self.eager_ms(seq_lens) - self.replay_ms(seq_lens)

    def capturable_saving_ms(self, seq_lens: Sequence[int]) -> float:
        """What admission counts a graph of this layout to save (``capturable``)."""
        return capturable(self.saving_ms(seq_lens), self.eager_ms(seq_lens))


def capturable(saving_ms: float, eager_ms: float) -> float:
    """``saving_ms`` where it is over ``MIN_SAVING_SHARE`` of the eager call's ``eager_ms``, else 0:
    the one rule of what a graph, exact or padded, is worth capturing for."""
    return saving_ms if saving_ms > MIN_SAVING_SHARE * eager_ms else 0.0


def fit_cost_model(timings: Sequence[tuple[int, float, float]], blocks: int) -> CostModel | None:
    """The model fitted to one-image ``(patches, eager_ms, graph_ms)`` timings; ``None`` with fewer than three."""
    if len(timings) < 3:
        return None
    columns = torch.tensor([[1.0, patches, patches**2] for patches, _, _ in timings], dtype=torch.float64)
    device = torch.tensor([graph_ms - CostModel.replay_host_ms for _, _, graph_ms in timings], dtype=torch.float64)
    terms = _non_negative_least_squares(columns, device)
    _, eager_ms, graph_ms = min(timings)  # the smallest call: its eager time is nearly all launch
    return CostModel(
        blocks=blocks,
        launch_ms=launch_from_call(eager_ms, graph_ms),
        device_base_ms=terms[0] / blocks,
        device_ms_per_token=terms[1] / blocks,
        device_ms_per_square=terms[2] / blocks,
    )


def launch_from_call(eager_ms: float, graph_ms: float) -> float:
    """The launch time under which the model gives ``eager_ms`` for a call replayed in ``graph_ms``."""
    return launch_from_eager(eager_ms, max(0.0, graph_ms - CostModel.replay_host_ms))


def launch_from_eager(eager_ms: float, device_ms: float) -> float:
    """``_eager_ms`` solved for the launch time (0 where eager is no slower than the device): a
    launch-bound call's eager time is the soft maximum, above the launch time itself."""
    if eager_ms <= device_ms:
        return 0.0
    power = _SOFT_MAX_POWER
    soft = (eager_ms**power - device_ms**power) ** (1 / power)
    if device_ms <= _SOFT_UNTIL * soft:
        return soft
    return eager_ms / (1 + _SOFT_UNTIL**power) ** (1 / power)


def _eager_ms(launch_ms: float, device_ms: float) -> float:
    """Eager time of a call from its launch and device times (the module docstring says why)."""
    power = _SOFT_MAX_POWER
    launch_bound = min(device_ms, _SOFT_UNTIL * launch_ms)
    return max(device_ms, (launch_ms**power + launch_bound**power) ** (1 / power))


def _non_negative_least_squares(columns: torch.Tensor, target: torch.Tensor) -> list[float]:
    """Least squares with coefficients >= 0, by trying column subsets (exact for a handful of columns)."""
    best: tuple[float, list[float]] = (math.inf, [0.0] * columns.shape[1])
    for size in range(1, columns.shape[1] + 1):
        for subset in itertools.combinations(range(columns.shape[1]), size):
            solution = torch.linalg.lstsq(columns[:, subset], target.unsqueeze(1)).solution.flatten()
            if (solution < 0).any():
                continue
            residual = float(torch.linalg.vector_norm(columns[:, subset] @ solution - target))
            if residual < best[0]:
                coefficients = [0.0] * columns.shape[1]
                for index, value in zip(subset, solution.tolist(), strict=True):
                    coefficients[index] = value
                best = (residual, coefficients)
    return best[1]
