"""rocm-vit's work before the blocks on SGLang's graph path against SGLang's own.

Hooks ``qwen3_vl_prepare_from_cache`` and ``qwen3_vl_graph_forward_from_cache`` (Qwen3-VL's
``_prepare_graph_inputs`` and ``forward_with_cuda_graph``), ``qwen2_5_vl_graph_forward_from_cache``
(Qwen2.5-VL's ``forward_with_cuda_graph``).

The real SGLang 0.5.23 runs in a process of its own (tests/sglang_support/prepare_scenario.py: the
hooks patch SGLang's class for the life of a process); the tests read its report.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch
from scenario_process import run_scenario, scenario_environ

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "tests" / "sglang_support" / "prepare_scenario.py"
DTYPES = ("float32", "bfloat16")
LAYOUT_COUNT = 7  # prepare_scenario.LAYOUTS

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("sglang") is None,
    reason="sglang is not installed (make venv installs ci/requirements-sglang.txt)",
)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("prepare") / "report.pt"
    env = scenario_environ(TORCHDYNAMO_DISABLE="1", CUDA_VISIBLE_DEVICES="", HIP_VISIBLE_DEVICES="")
    run_scenario(SCENARIO, path, env=env, timeout=300)
    return torch.load(path)


def _layout_results(report: dict[str, Any]) -> dict[str, dict]:
    return {key: value for key, value in report.items() if key.endswith(DTYPES)}


def test_the_hook_fits_the_tested_release_and_replaces_sglangs_function(report: dict[str, Any]) -> None:
    assert report["mismatch"] is None
    assert report["installed"] == "rocm_vit.integrations.sglang.prepare._prepare_graph_inputs"


def test_the_forward_hook_fits_the_tested_release_and_replaces_sglangs_function(report: dict[str, Any]) -> None:
    assert report["forward_mismatch"] is None
    assert report["forward_installed"] == "rocm_vit.integrations.sglang.prepare.forward_with_cuda_graph"


def test_the_graph_forward_hands_the_runner_sglangs_arguments_with_the_offsets_cached(report: dict[str, Any]) -> None:
    # SGLang copies its host offsets to the device at every call (a blocking copy); rocm-vit hands
    # over the layout's cached device offsets: the same tensor object on every call of a layout.
    results = report["graph_forward"]
    assert len(results) == 3 * len(DTYPES)
    assert all(result["same"] for result in results.values()), results
    assert all(result["offsets_cached"] for result in results.values()), results


def test_without_the_interpolation_hook_the_graph_forward_is_sglangs(report: dict[str, Any]) -> None:
    assert report["forward_without_interpolation_hook"] is True


def test_every_layout_prepares_sglangs_inputs_bit_for_bit_built_and_from_the_cache(report: dict[str, Any]) -> None:
    results = _layout_results(report)
    assert len(results) == LAYOUT_COUNT * len(DTYPES)
    differing = {
        f"{key} {when} {output}": equal
        for key, result in results.items()
        for when, outputs in result.items()
        for output, equal in outputs.items()
        if equal is not True
    }
    assert not differing, differing


def test_a_layout_with_anothers_token_count_and_offsets_gets_its_own_taps(report: dict[str, Any]) -> None:
    # (1, 8, 4) right after (1, 4, 8): one segment of 32 patches each, other interpolation taps.
    for dtype in DTYPES:
        assert report[f"tall_image_same_offsets_{dtype}"]["cached"]["x"] is True


def test_a_known_layout_runs_as_many_ops_for_sixteen_images_as_for_one(report: dict[str, Any]) -> None:
    ops = report["ops_on_a_known_layout"]
    assert ops["1"] == ops["16"], ops


def test_prepared_layouts_stay_within_the_byte_budget_and_an_evicted_one_is_rebuilt(report: dict[str, Any]) -> None:
    held = report["byte_budget"]
    assert held["layouts"] == 2 and held["bytes"] <= held["budget"], held
    assert held["evicted_again"] is True


def test_a_table_split_over_ranks_is_looked_up_by_sglangs_module_at_the_cached_taps(report: dict[str, Any]) -> None:
    assert report["split_table"] == [True, True]  # bf16, built then cached; no fallback (next test)


def test_without_the_interpolation_hook_sglangs_function_runs_with_one_log_line(report: dict[str, Any]) -> None:
    assert report["without_interpolation_hook"] == [True, True]
    reasons = [message.partition("are SGLang's: ")[2] for message in report["logs"]]
    assert reasons == [
        "hook qwen3_vl_graph_interpolation is not applied, so SGLang's graph path interpolates by its own rule"
    ]


def test_qwen2_5_vl_forward_hook_fits_the_tested_release_and_replaces_sglangs_function(
    report: dict[str, Any],
) -> None:
    windows = report["windows"]
    assert windows["mismatch"] is None
    assert windows["installed"] == "rocm_vit.integrations.sglang.prepare_windows.forward_with_cuda_graph"


def test_qwen2_5_vl_graph_forward_hands_the_runner_sglangs_arguments_with_everything_cached(
    report: dict[str, Any],
) -> None:
    # The window permutation, its inverse, cos/sin and both offsets, bit for bit, at int64 and int32
    # grids; the offsets tensor the runner gets is the layout's own on every call.
    results = {key: value for key, value in report["windows"].items() if key.endswith(DTYPES)}
    assert len(results) == LAYOUT_COUNT * len(DTYPES)
    assert all(result["same"] for result in results.values()), results
    assert all(result["offsets_cached"] for result in results.values()), results


def test_a_known_qwen2_5_vl_layout_runs_as_many_ops_for_sixteen_images_as_for_one(report: dict[str, Any]) -> None:
    ops = report["windows"]["ops_on_a_known_layout"]
    assert ops["1"] == ops["16"], ops


def test_rocm_vits_adapter_gets_the_patches_and_the_cached_inputs_and_embeds_them_as_sglang_does(
    report: dict[str, Any],
) -> None:
    # Its runner embeds the patches inside the graph (prepare.embed_patches): the same x, bit for bit.
    embedding = report["embedding_in_graph"]
    for dtype in DTYPES:
        assert all(embedding[dtype].values()), (dtype, embedding[dtype])


def test_with_the_position_table_split_over_ranks_the_adapter_gets_sglangs_embedded_x(report: dict[str, Any]) -> None:
    # SGLang's module looks the rows up (its all-reduce) before the graph: run, not run_embedding.
    assert report["embedding_in_graph"]["split_table_runs"] != ["run_embedding"]
    assert "x" in report["embedding_in_graph"]["split_table_runs"]
