"""SGLang's Qwen3-VL-8B tower on a GPU: rocm-vit's fused glue launches fewer kernels than SGLang's blocks.

Runs tests/sglang_support/fused_kernels.py in a process of its own: the eager forward through rocm-vit's
adapter (no graph), under the torch profiler, with ``ROCM_VIT_SGLANG_BLOCKS=sglang`` and with the fused
glue. Predicted (docs/sglang.md, "What the plugin changes"): SGLang's block 13 launches with
``triton_attn`` (16 with ``aiter_attn``, which copies q/k/v), the fused one 9, or 8 where the policy
puts the GELU in fc1's epilogue (CUDA); per forward 4 x 27 - 2 fewer (cos/sin widened once, the
merger's norm fused, block 0's norm1 alone), 27 more with the epilogue. Asserted: 3 a block, 4 with it.
Run with ``-s`` to see the counts and the difference between the two outputs.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from scenario_process import run_scenario, scenario_environ

pytestmark = pytest.mark.gpu

SCRIPT = Path(__file__).resolve().parents[1] / "sglang_support" / "fused_kernels.py"


def test_fused_glue_launches_at_least_three_fewer_kernels_a_block(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed in this environment (pip install 'rocm-vit[sglang]')")
    path = tmp_path / "report.json"
    run_scenario(SCRIPT, path, "--attention", "triton_attn", env=scenario_environ(), timeout=900)
    report = json.loads(path.read_text())
    print(json.dumps(report, indent=1))
    per_block = 4 if report["gelu_epilogue"] else 3
    for layout in ("1x224", "1x512"):
        kernels = report[layout]["kernels"]
        assert kernels["rocm-vit"] <= kernels["sglang"] - per_block * report["depth"], (layout, kernels, report)
        # bf16 through 27 random blocks: a few bf16 steps of outputs of order 1.
        assert report[layout]["max_abs"] < 0.5, report[layout]
