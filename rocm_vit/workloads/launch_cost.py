"""What one eager call costs the host and the device: ``rocm-vit bench``'s host, device and kernel columns.

Host ms is timed while a ``torch.cuda._sleep`` queued ahead keeps the device busy, so the host never
waits on it (a sample the device caught up with is retried with a longer sleep; ``busy_ahead`` says
whether all held); device ms is events around the same call.

benchmarks/launch_bench.py loads this file by path to measure a tree whose bench lacks these columns;
that tree needs ``rocm_vit.workloads.workload`` (90789ee or later).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from rocm_vit.workloads.workload import median_ms

# The sleep queued ahead of a timed call: at least this long, doubled while a sample's call started
# on the device before its host returned.
FIRST_AHEAD_MS = 50.0
MAX_AHEAD_MS = 800.0


@dataclass(frozen=True)
class EagerCost:
    """Medians over the timed calls; ``device_ms`` and ``kernels`` are ``None`` off the GPU."""

    host_ms: float
    device_ms: float | None
    kernels: int | None
    busy_ahead: bool

    @property
    def host_us_per_launch(self) -> float | None:
        return None if not self.kernels else self.host_ms * 1e3 / self.kernels

    def fields(self) -> dict:
        """The bench row's fields: ``host_ms``, ``device_ms``, ``kernels``, ``host_us_per_launch``, ``busy_ahead``."""
        return {**asdict(self), "host_us_per_launch": self.host_us_per_launch}


def eager_cost(call: Callable[[], object], device: torch.device, repeats: int) -> EagerCost:
    """Host and device time of ``call`` (one warm-up first), and the device activities it launches."""
    if device.type != "cuda":
        return EagerCost(median_ms(call, device, repeats), None, None, True)
    call()
    host, dev, busy, ahead_ms = [], [], True, FIRST_AHEAD_MS
    while len(host) < repeats:
        host_ms, device_ms, held = _timed_behind_sleep(call, device, ahead_ms)
        if not held and ahead_ms < MAX_AHEAD_MS:
            ahead_ms *= 2
            continue
        busy = busy and held
        host.append(host_ms)
        dev.append(device_ms)
    return EagerCost(statistics.median(host), statistics.median(dev), count_device_activities(call, device), busy)


def count_device_activities(call: Callable[[], object], device: torch.device) -> int:
    """Device kernels, memsets and copies of one ``call``, from the torch profiler."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        call()
        torch.cuda.synchronize(device)
    return sum(event.count for event in profiler.key_averages() if event.device_type == torch.autograd.DeviceType.CUDA)


def _timed_behind_sleep(call: Callable[[], object], device: torch.device, ahead_ms: float) -> tuple[float, float, bool]:
    """``(host ms, device ms, whether the device was still busy ahead when the host returned)``."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(device)
    torch.cuda._sleep(int(ahead_ms * _sleep_cycles_per_ms(device.index or torch.cuda.current_device())))
    start.record()
    started = time.perf_counter()
    call()
    host_ms = (time.perf_counter() - started) * 1e3
    held = not start.query()  # the call's first kernel had not begun: the host never waited
    end.record()
    torch.cuda.synchronize(device)
    return host_ms, start.elapsed_time(end), held


@functools.cache
def _sleep_cycles_per_ms(index: int) -> float:
    """``torch.cuda._sleep`` cycles per millisecond on GPU ``index``, measured once."""
    cycles = 10_000_000
    with torch.cuda.device(index):
        torch.cuda._sleep(cycles // 10)  # warm-up
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        torch.cuda.synchronize()
    return cycles / start.elapsed_time(end)
