"""A deadline for GPU tests: a kernel that never finishes fails the tier instead of hanging it.

A GPU kernel that deadlocks (an mbarrier phase that never completes, as a miscounted ``k_free`` did
in gluon_attn's three-consumer schedule) blocks the test's host thread in a device sync forever,
and with it ``make gpu-test`` or ``make rocm-test``. ``faulthandler``'s watchdog runs on its own C
thread: after the deadline it prints every thread's Python traceback (which test, which call) and
ends the process with exit status 1, whatever the main thread is blocked in.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
from collections.abc import Iterator

# Seconds one GPU test may take; the slowest seen on an H200 take under a minute, compilation included.
DEFAULT_GPU_TEST_TIMEOUT_S = 600.0


def gpu_test_timeout_s() -> float:
    """``ROCM_VIT_GPU_TEST_TIMEOUT_S``, else ``DEFAULT_GPU_TEST_TIMEOUT_S``."""
    return float(os.environ.get("ROCM_VIT_GPU_TEST_TIMEOUT_S", DEFAULT_GPU_TEST_TIMEOUT_S))


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Exit the process with status 1 and all tracebacks if the block runs longer than ``seconds``."""
    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
