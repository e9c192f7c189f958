"""The SGLang plugin on a GPU: SGLang's own Qwen3-VL tower, graph output == the runner's eager output, bit for bit.

Runs tests/sglang_support/scenario.py with ``--device cuda`` in a process of its own (the plugin
patches SGLang for the life of a process): SGLang's ``Qwen3VLMoeVisionModel`` in bf16, eager
(``forward``) against graphs (``forward_with_cuda_graph`` -> the adapter -> rocm-vit's runner under
real CUDA/HIP graphs), twice over six images in four attention layouts; with SGLang's
``triton_attn`` everywhere, and with rocm-vit's ``aiter_attn`` on ROCm and emulating it
(``ROCM_VIT_EMULATE=rocm``, aiter's stand-in). On a CUDA torch without ``sglang-kernel`` the scenario
puts the test stand-in for ``sgl_kernel`` on the path (tests/sglang_support/sgl_kernel_standin), so
SGLang's own code runs and any call of its kernels fails. Skips, saying why, where SGLang is not
installed or its import fails; fails instead where ci/cuda.sh or ci/rocm.sh installed it from a
wheelhouse (``SGLANG_WHEELHOUSE``), naming the missing module.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch
from scenario_process import run_scenario, scenario_environ

pytestmark = pytest.mark.gpu

SCENARIO = Path(__file__).resolve().parents[1] / "sglang_support" / "scenario.py"
PASSED_SETTINGS = ("ROCM_VIT_EMULATE", "ROCM_VIT_ROTARY")


def _cannot_run(reason: str) -> None:
    """Skip, or fail where SGLang was installed from a wheelhouse for this run: it must load then."""
    wheelhouse = os.environ.get("SGLANG_WHEELHOUSE")
    if wheelhouse:
        pytest.fail(f"{reason}, though SGLANG_WHEELHOUSE={wheelhouse} was installed: the wheelhouse lacks a package")
    pytest.skip(reason)


def _scenario(tmp_path: Path, attention: str, **extra_env: str) -> dict:
    if importlib.util.find_spec("sglang") is None:
        _cannot_run("sglang is not installed in this environment (pip install 'rocm-vit[sglang]')")
    path = tmp_path / "report.json"
    # ROCM_VIT_EMULATE passes: emulating ROCm, the scenario takes every decision a ROCm machine takes;
    # ROCM_VIT_ROTARY too: the tiers' compiled-rotary pass runs SGLang's towers under it.
    env = scenario_environ(PASSED_SETTINGS, **extra_env)  # a profile tuned on this machine would move the padding rule
    # Every layout may be captured at its first call, as in the CPU scenario (tests/test_sglang_plugin.py):
    # what keeps a first call eager is then the payback rule alone, which the assertions below read.
    env.update(SGLANG_VIT_CUDA_GRAPH_MIN_HITS="1")
    run_scenario(SCENARIO, path, "--device", "cuda", "--attention", attention, env=env, timeout=900)
    result = json.loads(path.read_text())
    if "import_error" in result:
        missing = result.get("missing_module")
        _cannot_run(f"SGLang cannot be imported here: {result['import_error']} (missing module: {missing})")
    return result


def _assert_graph_equals_eager(report: dict, attention: str) -> None:
    assert report["runner_class"] == "rocm_vit.integrations.sglang.graph_runner.ViTGraphRunnerAdapter"
    assert report["backend"] == attention
    applied = {line.split()[3] for line in report["applied"]}
    assert {"aiter_attn", "rotary", "graph_runner", "qwen3_vl_graph_interpolation"} <= applied
    graphs = report["graph_vs_eager"]
    assert all(graphs["bitwise_equal"]) and len(graphs["bitwise_equal"]) == 12, graphs
    # rocm-vit's fused glue, against SGLang's eager blocks: the fused kernels sum rows in another
    # order (docs/numerics.md, "SGLang's blocks under the plugin"): a few bf16 steps of the outputs'
    # scale (~26 here, whose step is 0.125; 0.25 seen on an H100), as the CPU test bounds it.
    assert graphs["blocks"] == "rocm-vit: fused glue between SGLang's linear modules", graphs
    assert graphs["max_difference_from_sglangs_eager"] < 0.02 * graphs["sglangs_eager_max_abs"], graphs
    assert graphs["first_output_survives_replays"]
    # 6 images in 4 attention layouts, twice: 4 captures; a layout's calls run eagerly until their
    # savings repay a fifth of a capture (at most its first, at this host's launch time), then replay.
    assert (graphs["captures"], graphs["graphs"]) == (4, 4) and graphs["replays"] >= 8, graphs
    eager_runs = {reason: count for reason, count in graphs["eager_runs"].items() if count}
    assert set(eager_runs) <= {"below_payback"} and graphs["replays"] + sum(eager_runs.values()) == 12, graphs
    # The padded buckets captured as the server starts serve the first one-image requests.
    buckets = report["buckets_at_start"]
    assert buckets["captured"] == buckets["bucket_calls"] > 1 and buckets["captures_while_serving"] == 0, buckets
    assert all(buckets["bitwise_equal"]) and buckets["replays"] == buckets["requests"], buckets


def test_sglang_tower_with_triton_attn_graph_equals_eager_bitwise(tmp_path: Path) -> None:
    _assert_graph_equals_eager(_scenario(tmp_path, "triton_attn"), "triton_attn")


@pytest.mark.rocm
def test_sglang_tower_with_rocm_vits_aiter_attn_graph_equals_eager_bitwise(tmp_path: Path) -> None:
    if not (torch.version.hip or os.environ.get("ROCM_VIT_EMULATE")):
        pytest.skip("aiter_attn needs ROCm, or ROCm emulated (ROCM_VIT_EMULATE=rocm)")
    _assert_graph_equals_eager(_scenario(tmp_path, "aiter_attn", SGLANG_USE_AITER="1"), "aiter_attn")
