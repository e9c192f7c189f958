"""tests/gpu_launch_bench.py's table on a CPU: before and after side by side per mode, "-" where a tree
had no value, and a tree measured from another checkout on the path."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

_SCRIPT = Path(__file__).resolve().parent / "gpu_launch_bench.py"


def _bench_module():
    spec = importlib.util.spec_from_file_location("gpu_launch_bench", _SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _report(label: str, mode: str, host_ms: float, kernels: int | None) -> dict:
    row = {"layout": "1x224", "patches": 196, "eager_ms": 19.2, "host_ms": host_ms, "device_ms": 1.72}
    row |= {"kernels": kernels, "host_us_per_launch": None if kernels is None else host_ms * 1e3 / kernels}
    row |= {"replay_ms": 1.83, "check": "exact"}
    return {"label": label, "mode": mode, "device": "H100", "torch": "2.11", "triton": "3.6.0", "rows": [row]}


def test_comparison_puts_before_and_after_side_by_side_per_mode() -> None:
    table = _bench_module().format_comparison(
        [
            _report("before", "native", 20.4, 235),
            _report("after", "native", 8.1, 235),
            _report("after", "rocm", 9.0, None),
        ]
    )
    header, native, rocm = table.splitlines()[1:]
    assert "host ms before/after" in header and "kernels before/after" in header
    assert native.split()[:3] == ["native", "1x224", "196"]
    assert "20.40/8.10" in native and "235/235" in native and "86.8/34.5" in native
    assert "-/9.00" in rocm and "-/-" in rocm  # before was not measured in that mode; no kernel count


def test_measure_runs_against_the_tree_on_the_path(tmp_path: Path) -> None:
    out = tmp_path / "tiny.json"
    command = [sys.executable, str(_SCRIPT), "measure", "--label", "here", "--out", str(out)]
    command += ["--preset", "tiny", "--layouts", "1x64", "--repeats", "1"]
    subprocess.run(command, check=True, capture_output=True, timeout=300)
    report = json.loads(out.read_text())
    assert (report["label"], report["mode"], report["rows"][0]["check"]) == ("here", "native", "exact")
    assert report["rows"][0]["host_ms"] > 0 and report["rows"][0]["kernels"] is None  # a CPU: no device columns


def test_host_profile_lists_the_ops_of_one_eager_call() -> None:
    command = [sys.executable, str(_SCRIPT), "host-profile", "--preset", "tiny", "--layouts", "1x64", "--top", "4"]
    done = subprocess.run(command, check=True, capture_output=True, text=True, timeout=300)
    header, *ops = done.stdout.strip().splitlines()
    assert header.startswith("== native 1x64: host ") and "ops' self CPU" in header
    assert len(ops) == 4 and all(" calls " in op and op.endswith(" us a call") for op in ops)
    assert any("aten::" in op for op in ops)


def test_python_profile_ranks_the_towers_functions_both_ways() -> None:
    command = [sys.executable, str(_SCRIPT), "python-profile", "--preset", "tiny", "--layouts", "1x64", "--top", "5"]
    done = subprocess.run(command, check=True, capture_output=True, text=True, timeout=300)
    by_own, by_cumulative = done.stdout.split("== native 1x64, 20 calls, by ")[1:]
    assert by_own.startswith("tottime") and by_cumulative.startswith("cumulative")
    # The tower's forward is among the functions with the most time including callees.
    assert "(forward)" in by_cumulative and by_cumulative.count("\n") >= 6
