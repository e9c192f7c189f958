"""The settings a GPU tier's pass puts in force reach the processes its SGLang scenario runs in.

ci/cuda.sh and ci/rocm.sh run tests/gpu/test_sglang_gpu.py again under ``ROCM_VIT_ROTARY=compiled``
(and emulating ROCm under ``ROCM_VIT_EMULATE``); the scenario runs in a process of its own, whose
environment the test builds. Checked here with the process replaced, no GPU needed.
"""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path
from typing import Any

import pytest

GPU_TEST = Path(__file__).resolve().parent / "gpu" / "test_sglang_gpu.py"

pytestmark = pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="sglang is not installed")


def test_the_sglang_scenario_runs_under_the_rotary_and_the_emulation_in_force(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    spec = importlib.util.spec_from_file_location("gpu_test_sglang_gpu", GPU_TEST)
    gpu_test = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_test)
    monkeypatch.setenv("ROCM_VIT_ROTARY", "compiled")
    monkeypatch.setenv("ROCM_VIT_EMULATE", "rocm")
    monkeypatch.setenv("ROCM_VIT_PROFILE", "/a/tuned/profile.yaml")
    environments: list[dict[str, str]] = []

    def scenario_process(command: list[str], env: dict[str, str], **kwargs: Any) -> subprocess.CompletedProcess:
        environments.append(env)
        Path(command[2]).write_text("{}")  # the report path
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(subprocess, "run", scenario_process)
    gpu_test._scenario(tmp_path, "triton_attn")
    (env,) = environments
    assert env["ROCM_VIT_ROTARY"] == "compiled" and env["ROCM_VIT_EMULATE"] == "rocm"
    assert env["ROCM_VIT_PROFILE"] == "off"  # a machine's tuned profile stays out
