"""Which calls of the graph runner get a graph: the deciding half of the runner, apart from the doing.

It holds no tensor and touches no device, so its rules are tested as tables; it learns the host's
launch time from timed eager runs, which the cost model needs (docs/design.md, "Runner").
"""

from __future__ import annotations

import logging
import statistics
import threading
from collections import OrderedDict, deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from rocm_vit.graphs.cost import PAYBACK_SHARE, launch_from_eager
from rocm_vit.graphs.options import RunnerOptions
from rocm_vit.graphs.ranks import AgreeMax
from rocm_vit.layout import AttentionLayout
from rocm_vit.recent import remember

logger = logging.getLogger(__name__)

# Why a call runs eagerly: what ``Admission.decide`` answers, and the runner's own (no GPU, a failed capture).
EAGER_REASONS = (
    "no_gpu",
    "over_capacity",
    "over_max_tokens",
    "no_saving",
    "below_min_hits",
    "below_payback",
    "over_budget",
    "capture_failed",
    "capture_unverified",
)

# Bounded so endless new sizes stay flat.
_MAX_TRACKED_LAYOUTS = 4096
# Call counts are halved every this many calls per graph of capacity: old popularity fades.
_AGING_CALLS_PER_GRAPH = 16
# The launch time is the median host time of this many recent eager runs, once there are enough.
_LAUNCH_SAMPLES = 64
_MIN_LAUNCH_SAMPLES = 8
_LAUNCH_REFRESH = 16
# Launch-bound: predicted device time under half the host time, or under 0.9 of the layout's recent
# median (docs/benchmarks.md, "Figures behind constants").
_LAUNCH_BOUND_SHARE = 0.9
_CLEARLY_LAUNCH_BOUND_SHARE = 0.5
_LAYOUT_RUNS_KEPT = 5  # recent host times per layout
_LAYOUT_RUNS_NEEDED = 3
_LAYOUTS_TIMED_KEPT = 256
# A learned launch time this far from the model's is worth one warning: padding and the start-up
# buckets follow the model's. It promises nothing of tuning, which did not close the gap on drifting
# H100 hosts (docs/benchmarks.md, "Figures behind constants").
_LAUNCH_MISMATCH = 1.5


@dataclass(frozen=True)
class LaunchSample:
    """An eager run that taught the launch time, kept so a benchmark can show where a learned one came from."""

    host_ms: float
    device_ms: float | None
    launch_ms: float


class Admission:
    """Decisions of one runner; without a cost model every layout within the limits is captured at its
    ``min_hits``-th call. ``agree`` makes ranks agree on the launch time."""

    def __init__(self, options: RunnerOptions, *, agree: AgreeMax) -> None:
        self.capacity = options.capacity
        self.min_hits = options.min_hits
        self.max_tokens = options.max_tokens
        self.cost_model = options.cost_model
        self._agree = agree
        self._hits: OrderedDict[Hashable, int] = OrderedDict()  # calls of layouts without a graph
        self._failed: OrderedDict[Hashable, str] = OrderedDict()  # key -> capture_failed / capture_unverified
        self._calls = 0
        # Token count from which a capture was measured, alone in an empty pool, over the budget.
        self._over_budget_tokens: int | None = None
        self._lock = threading.Lock()  # eager runs are timed outside the runner's lock
        self._launch_samples: deque[LaunchSample] = deque(maxlen=_LAUNCH_SAMPLES)
        self._launch_samples_seen = 0
        self._layout_host_ms: OrderedDict[Hashable, deque[float]] = OrderedDict()  # recent runs, by layout
        # The launch time agreed across ranks, and how many samples had been seen then.
        self._launch_agreed: tuple[float, int] | None = None
        self._warned_launch = False

    def decide(self, key: Hashable, layout: AttentionLayout, uses_to_beat: int | None = None) -> str | None:
        """Why a call of ``layout`` without a graph runs eagerly now (``EAGER_REASONS``), or ``None`` to
        capture it. Counts the call."""
        tokens = layout.num_patches
        if key in self._failed:
            return self._failed[key]
        if self._over_budget_tokens is not None and tokens >= self._over_budget_tokens:
            return "over_budget"
        if self.capacity == 0:
            return "over_capacity"
        if tokens > self.max_tokens:
            return "over_max_tokens"
        saving_ms = self._predicted_saving_ms(layout)
        if saving_ms is not None and saving_ms <= 0:
            return "no_saving"  # under MIN_SAVING_SHARE of the eager call: the model's error margin
        hits = remember(self._hits, key, self._hits.get(key, 0) + 1, _MAX_TRACKED_LAYOUTS)
        # A padded graph serves every layout of its bucket: worth capturing at the bucket's first call.
        if hits < (1 if layout.offsets_per_call else self.min_hits):
            return "below_min_hits"
        exact = saving_ms is not None and not layout.offsets_per_call
        if exact and hits * saving_ms < PAYBACK_SHARE * self.cost_model.capture_ms:
            return "below_payback"
        if self.cost_model is not None and uses_to_beat is not None and hits <= uses_to_beat:
            return "over_capacity"  # every graph held is called at least as often
        return None

    def called(self) -> bool:
        """One more call: halve every count once per period, so old popularity makes way; returns
        whether it did (the store halves its graphs' uses then too)."""
        self._calls += 1
        if self._calls % (_AGING_CALLS_PER_GRAPH * max(1, self.capacity)):
            return False
        for key in self._hits:
            self._hits[key] //= 2
        return True

    def captured(self, key: Hashable) -> int:
        """``key`` has a graph now: its calls so far, which count as its graph's first uses."""
        return self._hits.pop(key, 1)

    def failed(self, key: Hashable, reason: str) -> None:
        """``key``'s capture failed or was not verified: it runs eagerly for good, for ``reason``."""
        self._hits.pop(key, None)
        remember(self._failed, key, reason, _MAX_TRACKED_LAYOUTS)

    def over_budget_from(self, tokens: int) -> None:
        """A capture of ``tokens`` alone in an empty pool was over the budget: none that large again."""
        self._over_budget_tokens = min(tokens, self._over_budget_tokens or tokens)

    def timed(self, layout: AttentionLayout, host_ms: float) -> None:
        """An eager run took ``host_ms``: a launch-time sample if it was launch-bound. Thread-safe."""
        with self._lock:
            if self.cost_model is None:
                self._launch_samples.append(LaunchSample(host_ms, None, host_ms))
            else:
                device_ms = self.cost_model.device_ms(layout.segmentations["full"].seq_lens)
                if self._launch_bound(device_ms, host_ms, self._recent_runs(layout, host_ms)):
                    # The launch time under which the model gives this run's host time, not the host
                    # time itself: a launch-bound run with device work takes longer than the launches.
                    self._launch_samples.append(LaunchSample(host_ms, device_ms, launch_from_eager(host_ms, device_ms)))
            self._launch_samples_seen += 1  # every timed run, so that ranks agree at the same call

    def launch_ms(self) -> float:
        """The host's launch time of an eager run: the median of recent ones, agreed across ranks
        once enough were seen and again every ``_LAUNCH_REFRESH`` more (a collective per admission
        would cost every eager call; ranks see the same calls, so they agree at the same one)."""
        seen = self._launch_samples_seen
        due = self._launch_agreed is None or seen - self._launch_agreed[1] >= _LAUNCH_REFRESH
        if seen >= _MIN_LAUNCH_SAMPLES and due:
            with self._lock:
                samples = [sample.launch_ms for sample in self._launch_samples]
            samples = samples or [self.cost_model.launch_ms]  # none launch-bound yet
            microseconds = round(statistics.median(samples) * 1e3)
            self._launch_agreed = (self._agree([microseconds])[0] / 1e3, seen)
            self._warn_once_if_far_from_the_model(self._launch_agreed[0])
        return self.cost_model.launch_ms if self._launch_agreed is None else self._launch_agreed[0]

    def _warn_once_if_far_from_the_model(self, launch_ms: float) -> None:
        """Warn once that this machine's launch time is far from the one the model and padding assume."""
        model_ms = self.cost_model.launch_ms
        if self._warned_launch or max(launch_ms / model_ms, model_ms / launch_ms) < _LAUNCH_MISMATCH:
            return
        self._warned_launch = True
        logger.warning(
            "the launch time learned from this machine's eager ViT runs is %.1f ms, the graph cost "
            "model's %.1f ms: admission follows the learned one, but padding and the buckets captured "
            "at start follow the model's. `rocm-vit tune` fits the model to this GPU from calls timed "
            'alone, which a busy host can still outrun (docs/tuning.md, "Launch time")',
            launch_ms,
            model_ms,
        )

    def launch_samples(self) -> list[LaunchSample]:
        """The eager runs the launch time is the median of, oldest first. Thread-safe."""
        with self._lock:
            return list(self._launch_samples)

    def stats(self) -> dict[str, Any]:
        """What ``ViTGraphRunner.stats`` reports of admission; runs no collective."""
        launch_ms = self._launch_agreed[0] if self._launch_agreed else getattr(self.cost_model, "launch_ms", None)
        return {
            "failed_layouts": len(self._failed),
            "over_budget_from_tokens": self._over_budget_tokens,
            "capacity": self.capacity,
            "min_hits": self.min_hits,
            "max_tokens": self.max_tokens,
            "launch_ms": launch_ms,
        }

    def _predicted_saving_ms(self, layout: AttentionLayout) -> float | None:
        """A replay's saving by the cost model at this host's launch time; ``None`` without a model."""
        if self.cost_model is None:
            return None
        model = self.cost_model.with_launch_ms(self.launch_ms())
        return model.capturable_saving_ms(layout.segmentations["full"].seq_lens)

    def _recent_runs(self, layout: AttentionLayout, host_ms: float) -> Sequence[float]:
        """The host ms of ``layout``'s last runs, this one included (bounded, by layout)."""
        runs = self._layout_host_ms.get(layout.graph_key) or deque(maxlen=_LAYOUT_RUNS_KEPT)
        runs.append(host_ms)  # most recent last
        return remember(self._layout_host_ms, layout.graph_key, runs, _LAYOUTS_TIMED_KEPT)

    @staticmethod
    def _launch_bound(device_ms: float, host_ms: float, runs: Sequence[float]) -> bool:
        """Whether a run timed the host's launches: its predicted device time is well below its host
        time, or below the layout's recent runs' (judged by one run, noise would pass the slow runs of
        a device-bound layout, whose host waits for the launch queue)."""
        if device_ms < _CLEARLY_LAUNCH_BOUND_SHARE * host_ms:
            return True
        return len(runs) >= _LAYOUT_RUNS_NEEDED and device_ms < _LAUNCH_BOUND_SHARE * statistics.median(runs)
