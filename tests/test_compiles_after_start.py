"""Nothing compiles after the server started: SGLang's towers under the plugin, per configuration.

Runs tests/sglang_support/compiles.py in processes of their own (the plugin patches SGLang for the life
of a process) and reads its report: per configuration (graphs on and off, padding on and off,
Qwen3-VL and Qwen2.5-VL, requests under ``no_grad`` and ``inference_mode``, bf16 and fp16), the graphs
Dynamo compiled during 30 random requests after the plugin's start, with the compiled rotary.
Triton's compiles are a GPU matter: tests/gpu/test_graphs_gpu.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from scenario_process import scenario_environ

SCRIPT = Path(__file__).resolve().parent / "sglang_support" / "compiles.py"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="sglang is not installed (make venv)"),
]


# compiles.py processes side by side, each running every SHARDS-th configuration (~0.7 s each after
# ~5 s of imports): one per core, at most 2.
SHARDS = max(1, min(2, os.cpu_count() or 1))


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    directory = tmp_path_factory.mktemp("compiles")
    env = scenario_environ(CUDA_VISIBLE_DEVICES="", HIP_VISIBLE_DEVICES="")
    env.update(SGLANG_VIT_CUDA_GRAPH_MAX_TOKENS="256")  # the toy towers' staging
    env.update(OMP_NUM_THREADS="1")  # one thread a shard: two of two threads each thrash 2 cores (48 s)
    paths = [directory / f"report{index}.json" for index in range(SHARDS)]
    logs = [directory / f"output{index}.txt" for index in range(SHARDS)]  # files: no pipe fills up
    shards = []
    for index, (path, log) in enumerate(zip(paths, logs, strict=True)):
        command = [sys.executable, str(SCRIPT), str(path), "--shard", str(index), str(SHARDS)]
        with log.open("w") as output:
            shards.append(subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT))
    report = []
    try:
        for shard, path, log in zip(shards, paths, logs, strict=True):
            shard.wait(timeout=900)
            assert shard.returncode == 0 and path.exists(), f"compiles.py failed:\n{log.read_text()[-8000:]}"
            report += json.loads(path.read_text())
    finally:
        for shard in shards:
            shard.kill()  # a no-op on those that exited
            shard.wait()
    return report


def test_every_configuration_is_covered(report: list[dict[str, Any]]) -> None:
    seen = {(r["model"], r["graphs"], r["padding"], r["mode"], r["dtype"]) for r in report}
    assert len(seen) == len(report) == 16
    assert {r["mode"] for r in report} == {"no_grad", "inference_mode"}
    assert any(r["captured_at_start"] > 0 for r in report)  # the padded buckets, where graphs pad


def test_no_request_compiles_after_the_start_in_any_configuration(report: list[dict[str, Any]]) -> None:
    """The start compiles the rotary for both kinds of tensor (an inference tensor's dispatch keys
    differ, and Dynamo guards on them) and for any token count; the requests then compile nothing."""
    compiled = [r for r in report if r["compiled_in_requests"]]
    assert compiled == []
    assert all(r["compiled_at_start"] >= 1 for r in report)
