"""The GPU tests' deadline (tests/gpu_deadline.py): a block past it ends the process with tracebacks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).parent
# Children's code after the line that puts tests/ on sys.path (line 1): a sleep 60 times the deadline
# stands in for a host thread blocked in a device sync (it exits 0 where the deadline misses it).
BLOCKED = """import time
from gpu_deadline import deadline
with deadline(0.5):
    time.sleep(30)
"""
# The block does nothing, and the child lives past the deadline so that a watchdog left armed fires;
# the deadline leaves a busy machine seconds to run "pass" (the block's speed is not the subject).
FINISHED = """import time
from gpu_deadline import deadline
with deadline(3):
    pass
time.sleep(4)
print("done")
"""


def _child(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(TESTS)!r})\n{code}"],
        capture_output=True,
        text=True,
    )


def test_a_block_past_its_deadline_exits_with_the_tracebacks():
    child = _child(BLOCKED)
    assert child.returncode == 1, child
    assert "Timeout" in child.stderr and 'File "<string>", line 5' in child.stderr, child.stderr  # the sleep


def test_a_block_within_its_deadline_cancels_it():
    child = _child(FINISHED)
    assert child.returncode == 0 and child.stdout.strip() == "done", child


def test_the_deadline_comes_from_the_environment(monkeypatch):
    import gpu_deadline

    monkeypatch.setenv("ROCM_VIT_GPU_TEST_TIMEOUT_S", "42")
    assert gpu_deadline.gpu_test_timeout_s() == 42.0
    monkeypatch.delenv("ROCM_VIT_GPU_TEST_TIMEOUT_S")
    assert gpu_deadline.gpu_test_timeout_s() == gpu_deadline.DEFAULT_GPU_TEST_TIMEOUT_S
