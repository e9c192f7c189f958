"""Hook ``qwen3_vl_prepare_from_cache`` on a GPU: SGLang's own ``_prepare_graph_inputs``, bit for bit.

Runs tests/sglang_support/prepare_scenario.py with ``--device cuda``: the taps built by SGLang's ops
on the GPU (its ``linspace`` there) and the position embedding added by rocm-vit's Triton kernel with
SGLang's rounding, against SGLang's function on the same tower, at fp32 and bf16. Hook
``qwen3_vl_graph_forward_from_cache`` likewise: the graph runner gets SGLang's arguments, and a warm
call waits for the device nowhere (``torch.cuda.set_sync_debug_mode("error")``), where SGLang's copies
its offsets to the device with a blocking copy. Hook ``qwen2_5_vl_graph_forward_from_cache`` the same.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from scenario_process import run_scenario, scenario_environ

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU (torch.cuda.is_available() is False)"
    ),
    pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="sglang is not installed"),
]

SCENARIO = Path(__file__).resolve().parents[1] / "sglang_support" / "prepare_scenario.py"
DTYPES = ("float32", "bfloat16")


def test_prepared_inputs_equal_sglangs_on_a_gpu_through_the_fused_kernel(tmp_path: Path) -> None:
    path = tmp_path / "report.pt"
    run_scenario(SCENARIO, path, "--device", "cuda", env=scenario_environ(), timeout=600)
    report = torch.load(path)
    assert report["fused_ops"] == "fused"
    results = {key: value for key, value in report.items() if key.endswith(DTYPES)}
    differing = {
        f"{key} {when} {output}": equal
        for key, result in results.items()
        for when, outputs in result.items()
        for output, equal in outputs.items()
        if equal is not True
    }
    assert results and not differing, differing
    assert report["ops_on_a_known_layout"]["1"] == report["ops_on_a_known_layout"]["16"]
    for forward in (report["graph_forward"], report["windows"]):
        calls = {key: value for key, value in forward.items() if key.endswith(DTYPES)}
        assert calls and all(call["same"] and call["offsets_cached"] for call in calls.values()), calls
        assert all(call["synchronized"] is None for call in calls.values()), calls
