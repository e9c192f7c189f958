"""SGLang's Qwen3-VL blocks on rocm-vit's fused glue, against the real SGLang 0.5.23 package.

One process (tests/sglang_support/fused_scenario.py) runs SGLang's tower with rocm-vit's Triton kernels
interpreted on the CPU under a GPU's policy; the tests read its report. The tolerances against
transformers are those of docs/numerics.md, "SGLang's blocks under the plugin".
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from scenario_process import run_scenario, scenario_environ

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "tests" / "sglang_support" / "fused_scenario.py"
POLICIES = ("cuda", "rocm")
# fp32: the fused sums change only the order of fp32 row sums; bf16: a few bf16 steps of the outputs.
TRANSFORMERS_TOLERANCE = {"fp32": 1e-5, "bf16": 0.02}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="sglang is not installed (make venv)"),
]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("fused") / "report.json"
    env = scenario_environ(TRITON_INTERPRET="1", TORCHDYNAMO_DISABLE="1", CUDA_VISIBLE_DEVICES="")
    env.update(SGLANG_VIT_CUDA_GRAPH_MIN_HITS="1", SGLANG_VIT_CUDA_GRAPH_MAX_TOKENS="256")
    run_scenario(SCENARIO, path, env=env, timeout=900)
    return json.loads(path.read_text())


def _runs(report: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (policy, dtype, one) for policy in POLICIES for dtype, one in report[policy].items() if isinstance(one, dict)
    ]


def test_the_fused_kernels_run_under_both_policies(report: dict[str, Any]) -> None:
    for policy in POLICIES:
        assert report[policy]["fused_ops"] is True
    for policy, dtype, one in _runs(report):
        assert one["blocks"] == "rocm-vit: fused glue between SGLang's linear modules", (policy, dtype)


def test_every_residual_add_is_fused_with_the_norm_after_it(report: dict[str, Any]) -> None:
    """3 blocks, one deepstack tap: norm1 of block 0 alone, two fused adds a block (the last one with
    the merger's norm), the tap's post-shuffle norm alone; SGLang's LayerNorm never runs."""
    for policy, dtype, one in _runs(report):
        assert one["kernels"] == {"add_norm": 8, "add_norm_with_add": 6, "layer_norm": 0}, (policy, dtype)


def test_graph_replays_equal_the_fused_eager_calls_bitwise_in_both_grad_modes(report: dict[str, Any]) -> None:
    for policy, dtype, one in _runs(report):
        for grad_mode in ("no_grad", "inference_mode"):
            equal = one[f"graph_vs_eager_{grad_mode}"]
            assert equal and all(equal), (policy, dtype, grad_mode, equal)


def test_fused_blocks_are_as_close_to_transformers_as_sglangs_own(report: dict[str, Any]) -> None:
    for policy, dtype, one in _runs(report):
        fused, sglang = one["fused_vs_transformers"], one["sglang_vs_transformers"]
        assert fused["max_relative"] < TRANSFORMERS_TOLERANCE[dtype], (policy, dtype, fused)
        assert fused["mean_abs"] < 1.5 * sglang["mean_abs"], (policy, dtype, fused, sglang)
        assert one["fused_vs_sglang"]["max_abs"] > 0, "the fused kernels did not run"  # interpreted, not plain


def test_sglang_blocks_setting_keeps_sglangs_eager_bits(report: dict[str, Any]) -> None:
    kept = report["sglang_setting"]
    assert kept["blocks"] == "sglang: ROCM_VIT_SGLANG_BLOCKS=sglang"
    assert kept["bitwise_equal"] and all(kept["bitwise_equal"])


def test_an_unrecognised_block_runs_sglangs_blocks_and_says_why(report: dict[str, Any]) -> None:
    kept = report["unrecognised"]
    assert kept["blocks"] == "sglang: block 2: norm2 is a RMSNorm, not an affine nn.LayerNorm"
    assert kept["bitwise_equal"] and all(kept["bitwise_equal"])


def test_qwen2_5_vl_windowed_blocks_run_fused_and_replay_their_eager_bits(report: dict[str, Any]) -> None:
    """RMSNorm blocks attending within windows and items: the fused glue, graphs equal to its eager
    calls; against SGLang's blocks, whose RMSNorm scales before rounding, within bf16 steps."""
    for dtype, one in report["qwen2_5_vl"].items():
        assert one["blocks"] == "rocm-vit: fused glue between SGLang's linear modules", dtype
        assert one["replays"] == 3 and all(one["graph_vs_eager"]) and len(one["graph_vs_eager"]) == 6, (dtype, one)
        assert 0 < one["fused_vs_sglang"]["max_relative"] < TRANSFORMERS_TOLERANCE[dtype], (dtype, one)


def test_qwen3_vls_mlp_takes_the_gelu_in_fc1s_gemm_only_where_that_gemm_is_all_fc1_does(
    report: dict[str, Any],
) -> None:
    # The epilogue runs on CUDA alone (its GELU is the tanh form there, erf on a CPU): on a GPU,
    # tests/gpu/test_sglang_fused_gpu.py counts its kernels. Here: which MLPs may take it.
    problems = report["gelu_epilogue"]
    assert problems["qwen3_vl"] is None and problems["blocks_taking_it"] == problems["depth"], problems
    assert problems["erf_gelu"] == "its activation is GELU, not transformers' GELUTanh", problems
    assert problems["python_tanh_gelu"] == "its GELUTanh is the Python formula, not torch's tanh-GELU", problems
    assert problems["quantized"] == "linear_fc1 runs Fp8LinearMethod", problems
    assert problems["bias_returned"] == "linear_fc1 does not add its bias to its output", problems
    assert problems["qwen2_5_vl"] is not None, problems
