"""The compiled-launch experiment's harness on a CPU (tiny preset): the product runs in a child process of
its own policy, the plain torch blocks in this one, both rounds after a warm-up; each row's output is
compared with its process's eager call. The compiled variants run on the GPU (Inductor takes ~10 s here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_SCRIPT = Path(__file__).resolve().parent / "gpu_compiled_launch_bench.py"


def test_product_and_plain_rows_for_both_rounds() -> None:
    command = [sys.executable, str(_SCRIPT), "--preset", "tiny", "--layout", "1x64", "--repeats", "2", "--compiled", ""]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    header, columns, *rows = done.stdout.strip().splitlines()
    assert header.startswith("tiny blocks + merger, 1x64, cpu") and columns.split()[:2] == ["variant", "round"]
    assert [row.split()[:2] for row in rows] == [["product", "1"], ["product", "2"], ["plain", "1"], ["plain", "2"]]
    assert all(float(row.split()[-1]) == 0 for row in rows)  # each process's output equals its eager reference
