"""The SGLang plugin against the real SGLang 0.5.23 package (installed by ci/requirements-sglang.txt).

Everything that needs SGLang itself runs once, in a process of its own (tests/sglang_support/
scenario.py: the plugin patches SGLang for the life of a process), and the tests here read its
report. What needs no SGLang import (the doctor on a tested release, ``load`` switched off, the
import hooks) runs here.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import logging
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from scenario_process import run_scenario, scenario_environ

from rocm_vit.cli.doctor import collect
from rocm_vit.integrations.sglang import hooks, imports
from rocm_vit.integrations.sglang.graph_runner import ViTGraphRunnerAdapter

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "tests" / "sglang_support" / "scenario.py"
OURS = "rocm_vit.integrations.sglang"
STAGING_TOKENS = 256
BUDGET_MB = 512
HOOK_NAMES = {hook.name for hook in hooks.HOOKS}

needs_sglang = pytest.mark.skipif(
    importlib.util.find_spec("sglang") is None,
    reason="sglang is not installed (make venv installs ci/requirements-sglang.txt)",
)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("sglang") / "report.json"
    # SGLang's eager rotary is torch.compile'd: Inductor would spend a minute building C++ on a CPU.
    env = scenario_environ(TORCHDYNAMO_DISABLE="1", CUDA_VISIBLE_DEVICES="", HIP_VISIBLE_DEVICES="")
    # Capture every layout at its first call, and size staging for the scenario's small layouts.
    env.update(SGLANG_VIT_CUDA_GRAPH_MIN_HITS="1", SGLANG_VIT_CUDA_GRAPH_MAX_TOKENS=str(STAGING_TOKENS))
    env.update(SGLANG_VIT_CUDA_GRAPH_MEMORY_BUDGET_MB=str(BUDGET_MB), SGLANG_VIT_CUDA_GRAPH_CACHE_CAPACITY="16")
    run_scenario(SCENARIO, path, env=env, timeout=300)
    return json.loads(path.read_text())


@needs_sglang
def test_load_plugins_finds_rocm_vit_and_hooks_land_on_sglangs_objects(report: dict[str, Any]) -> None:
    targets = report["targets"]
    for key in (
        "aiter_class",
        "rotary",
        "rotary_eager",
        "runner",
        "runner_in_qwen3_vl",
        "runner_in_qwen2_5_vl",
        "qwen2_5_vl_init",
        "tp_worker",
        "init_cuda_graphs",
        "encoder_precompile",
    ):
        assert targets[key].startswith(OURS), (key, targets[key])
    loading = "sglang.srt.model_executor.model_runner_components.load_model_utils"
    assert targets["runner_precompile"] == f"{loading}.maybe_precompile_model_kernels_after_loading"
    assert targets["tp_worker_in_runtime"] == targets["tp_worker"]  # rebound where it was imported
    assert report["aiter_in_table"] == f"{OURS}.attention.AiterVisionAttention"
    assert report["interpolation"] == f"{OURS}.qwen3_vl.fast_pos_embed_interpolate"
    assert report["runner_class"] == f"{OURS}.graph_runner.ViTGraphRunnerAdapter"
    assert report["backend_class"] == f"{OURS}.attention.AiterVisionAttention"
    assert report["load"]["pending_imports"] == []


@needs_sglang
def test_replacements_take_sglangs_parameters(report: dict[str, Any]) -> None:
    assert report["same_parameters"] and all(report["same_parameters"].values()), report["same_parameters"]


@needs_sglang
def test_language_model_rotary_stays_sglangs(report: dict[str, Any]) -> None:
    utils = "sglang.srt.layers.rotary_embedding.utils"
    assert report["targets"]["llm_rotary"] == f"{utils}.apply_rotary_pos_emb_native"
    assert report["targets"]["llm_rotary_eager"] == f"{utils}.apply_rotary_pos_emb_native_eager"


@needs_sglang
def test_sglang_plugins_without_rocm_vit_leaves_sglang_untouched(report: dict[str, Any]) -> None:
    excluded = report["excluded"]
    gate = excluded.pop("qwen2_5_vl_gate")
    assert excluded == {"untouched": True, "aiter_in_table": True, "rocm_vit_loaded": False, "pending_imports": []}
    assert gate == {"enable_cg": False, "runner": None}  # SGLang's _is_cuda gate, as SGLang left it


@needs_sglang
def test_untested_release_leaves_out_only_the_mismatching_hook(report: dict[str, Any]) -> None:
    warnings = report["load"]["warnings"]
    assert len(warnings) == 2, warnings
    assert "SGLang 0.5.99 is not a release rocm-vit was tested with (0.5.23)" in warnings[0]
    assert warnings[1].startswith("rocm-vit: not applying hook encoder_dp_worker: ")
    assert "launch_dp_worker takes (server_args, dp_rank), rocm-vit expects (server_args, dp_rank, " in warnings[1]
    applied = {line.split()[3] for line in report["load"]["applied"]}
    assert applied == HOOK_NAMES - {"encoder_dp_worker"}
    assert report["targets"]["dp_worker"].endswith("<locals>.launch_dp_worker")  # the stand-in, left alone


@needs_sglang
def test_doctor_checks_each_target_on_an_untested_release(report: dict[str, Any]) -> None:
    doctor = report["doctor"]
    assert doctor["installed"] == "0.5.99"
    assert doctor["verdict"].startswith("untested release (tested: 0.5.23)")
    assert doctor["loads"] == "yes"
    assert {name for name, verdict in doctor["hooks"].items() if verdict.startswith("applies: ")} == HOOK_NAMES - {
        "encoder_dp_worker"
    }
    assert doctor["hooks"]["encoder_dp_worker"].startswith("left out: ")


@needs_sglang
def test_spawned_encoder_worker_loads_the_plugin_before_sglangs_entry(report: dict[str, Any]) -> None:
    worker = report["worker"]
    assert worker["exitcode"] == 0
    facts = worker["facts"]
    assert facts is not None, "the spawned worker wrote no report: its probe plugin did not run"
    assert facts.pop("rank") == 1
    assert all(value.startswith(OURS) for value in facts.values()), facts


@needs_sglang
def test_eager_output_is_unchanged_by_the_plugin(report: dict[str, Any]) -> None:
    assert report["eager_unchanged"] == 0.0


@needs_sglang
def test_aiter_attn_replacement_matches_sglangs_sdpa(report: dict[str, Any]) -> None:
    assert report["aiter_vs_sdpa"] < 1e-5


@needs_sglang
def test_graph_path_through_the_adapter_equals_eager_bitwise(report: dict[str, Any]) -> None:
    graphs = report["graph_vs_eager"]
    assert all(graphs["bitwise_equal"]) and len(graphs["bitwise_equal"]) == 12
    # rocm-vit's fused glue, on a CPU's plain ops: SGLang's eager forward, bit for bit.
    assert graphs["blocks"] == "rocm-vit: fused glue between SGLang's linear modules"
    assert all(graphs["equal_to_sglangs_eager"]) and len(graphs["equal_to_sglangs_eager"]) == 12
    assert graphs["first_output_survives_replays"]
    # Equal token counts with other boundaries get their own graph. A layout's first call runs eagerly:
    # what it saves does not yet repay a fifth of a capture (PAYBACK_SHARE); every later call replays.
    assert (graphs["captures"], graphs["graphs"], graphs["replays"]) == (4, 4, 8)
    assert {reason: count for reason, count in graphs["eager_runs"].items() if count} == {"below_payback": 4}


@needs_sglang
def test_tuned_profile_on_rocm_picks_a_kernel_per_layout_in_sglangs_aiter_slot(report: dict[str, Any]) -> None:
    tuned = report["tuned"]
    assert tuned["backend"] == "rocm_vit.attention.AutoAttention"
    # 6 calls x 3 blocks: the four single-segment layouts on SDPA, the two of three segments on aiter.
    assert tuned["eager_calls"] == {"sdpa": 12, "aiter": 6}
    assert tuned["graph_calls"]["sdpa"] > 0 and tuned["graph_calls"]["aiter"] > 0
    assert all(tuned["bitwise_equal"]) and len(tuned["bitwise_equal"]) == 12
    assert tuned["vs_sdpa"] < 1e-5
    # Eager with SGLang's metadata (device offsets on a GPU): one host read per forward, not per layer.
    assert tuned["host_reads_after_each_forward"] == [1, 2]
    assert tuned["metadata_path_vs_sdpa"] < 1e-5


@needs_sglang
def test_adapter_leaves_a_tower_it_does_not_fit_to_sglang(report: dict[str, Any]) -> None:
    assert report["adapter_safety"]["refused"] == {"stopped": True, "graphs": None}


@needs_sglang
def test_first_failure_in_rocm_vits_path_hands_the_tower_to_sglangs_eager_blocks_for_good(
    report: dict[str, Any],
) -> None:
    safety = report["adapter_safety"]
    # Three calls: rocm-vit's runner is tried once and fails; SGLang's eager blocks serve all three,
    # and SGLang's runner (it raises for aiter_attn) is never called.
    assert (safety["runner_calls"], safety["handed_over"]) == (1, 0)
    assert safety["served_equal_to_eager"] == [True, True, True]
    assert (safety["failures"], safety["stopped"]) == (1, True)


@needs_sglang
def test_the_fallback_after_a_failure_midway_starts_from_the_callers_untouched_input(report: dict[str, Any]) -> None:
    """SGLang's blocks add into their input in place; the runner's eager run takes a copy of it."""
    assert report["adapter_safety"]["untouched_input"] is True


@needs_sglang
def test_after_a_runner_failure_every_request_is_served_equal_to_sglangs_eager_forward(
    report: dict[str, Any],
) -> None:
    """aiter_attn on the emulation's aiter stand-in, SGLang's real ViTCudaGraphRunner behind the
    adapter: a replay fails, and that request and the rest are served, bit for bit as eager."""
    fallback = report["fallback"]
    assert fallback["stand_in"].startswith("installed: the aiter stand-in")
    assert fallback["upstream_runner"] == "sglang.srt.multimodal.vit_cuda_graph_runner.ViTCudaGraphRunner"
    assert (fallback["error"], fallback["served"]) == (None, 51)
    assert fallback["bitwise_equal"] == [True] * 51
    assert (fallback["failures"], fallback["serves_graphs"]) == (1, False)
    # The fallback is SGLang's own blocks, not rocm-vit's fused glue.
    assert fallback["blocks_after"] == "sglang: rocm-vit's runner stopped serving after a failure"


@needs_sglang
def test_sglangs_aiter_slot_compiles_nothing_inside_a_request(report: dict[str, Any]) -> None:
    """bf16 lands on a module SGLang's ROCm image ships; fp16, which it lacks, is built while the
    model is constructed (emulation stand-in's module table: tests/test_aiter_modules.py)."""
    builds = report["fallback"]["aiter_builds"]
    assert (builds["compiled_at_construction"], builds["compiled_in_requests"]) == ([], [])
    assert builds["loaded"] == ["mha_varlen_fwd_bf16_nlogits_nbias_nmask_lse_ndropout_nskip_nqscale"]
    fp16 = builds["fp16"]
    assert fp16["compiled_at_construction"] == ["mha_varlen_fwd_fp16_nlogits_nbias_nmask_lse_ndropout_nskip_nqscale"]
    assert fp16["compiled_in_requests"] == []


@needs_sglang
def test_a_backend_sglang_cannot_capture_runs_sglangs_eager_blocks_through_the_graph_path(
    report: dict[str, Any],
) -> None:
    # SGLang's sdpa reads its offsets back: no runner, and SGLang's runner would fail on a CPU.
    assert report["sdpa_graph_path"] == {"bitwise_equal": [True] * 6, "serves_graphs": False}


@needs_sglang
def test_adapter_takes_admission_and_budget_from_sglang_variables(report: dict[str, Any]) -> None:
    graphs = report["graph_vs_eager"]
    assert (graphs["capacity"], graphs["min_hits"], graphs["max_tokens"]) == (16, 1, STAGING_TOKENS)
    assert graphs["budget_bytes"] == BUDGET_MB << 20


@needs_sglang
def test_graph_staging_follows_the_sizing_formula_of_the_docs(report: dict[str, Any]) -> None:
    # docs/sglang.md, Memory, for the scenario's fp32 tower: its patches 96 wide (the embedding runs
    # in the graph) with their position taps (4 int64) and weights (4 fp32), head dim 16 (cos and sin
    # of 8 fp32 values), output 48 wide with one deepstack merger per 4 patches, staging for
    # SGLANG_VIT_CUDA_GRAPH_MAX_TOKENS patches; offsets are each graph's own.
    patch_width, head_dim, out, mergers, dtype_bytes = 96, 16, 48, 1, 4
    embedding = dtype_bytes * patch_width + 8 * 4 + 4 * 4
    per_patch = embedding + 2 * 4 * head_dim // 2 + dtype_bytes * out * (1 + mergers) // 4
    assert report["graph_vs_eager"]["staging_bytes"] == per_patch * STAGING_TOKENS


@needs_sglang
def test_qwen2_5_vl_eager_output_is_unchanged_by_the_plugin(report: dict[str, Any]) -> None:
    assert report["qwen2_5_vl"]["eager_unchanged"] == 0.0
    assert report["qwen2_5_vl"]["aiter_vs_sdpa"] < 1e-5


@needs_sglang
def test_qwen2_5_vl_windowed_graph_path_through_the_adapter_equals_eager_bitwise(report: dict[str, Any]) -> None:
    graphs = report["qwen2_5_vl"]["graph_vs_eager"]
    assert all(graphs["bitwise_equal"]) and len(graphs["bitwise_equal"]) == 14
    # 7 grids, 6 attention layouts: (1, 4, 8) and (1, 8, 4) share one graph, each its own window order.
    # Each layout's first call runs eagerly, until its savings repay a fifth of a capture.
    assert (graphs["captures"], graphs["graphs"], graphs["replays"]) == (6, 6, 8)
    assert {reason: count for reason, count in graphs["eager_runs"].items() if count} == {"below_payback": 6}


@needs_sglang
def test_qwen2_5_vl_graph_gate_is_lifted_on_rocm_only_under_rocm_vits_runner(report: dict[str, Any]) -> None:
    gate = report["qwen2_5_vl"]["gate"]
    assert gate["aiter_attn"] == {"enable_cg": True, "runner": f"{OURS}.graph_runner.ViTGraphRunnerAdapter"}
    off = {"enable_cg": False, "runner": None}
    # Not capturable (SGLang's sdpa), not ROCm, graphs not asked for, or no runner built (settings it
    # refuses): SGLang's decision stands.
    assert gate["sglang_default"] == gate["aiter_attn_on_cpu"] == gate["aiter_attn_graphs_off"] == off
    assert gate["aiter_attn_no_runner"] == off


def test_adapter_run_takes_the_parameters_the_gate_expects_of_sglang() -> None:
    (graph_runner,) = (hook for hook in hooks.HOOKS if hook.name == "graph_runner")
    expected = graph_runner.signatures["ViTCudaGraphRunner.run"]
    assert tuple(inspect.signature(ViTGraphRunnerAdapter.run).parameters) == expected


@needs_sglang
def test_doctor_on_the_tested_release_reports_every_hook_without_importing_sglang(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    monkeypatch.delenv("ROCM_VIT_DISABLE", raising=False)
    # Tests before this one may have imported SGLang: hide it, so what collect() imports shows.
    for name in [name for name in sys.modules if name == "sglang" or name.startswith("sglang.")]:
        monkeypatch.delitem(sys.modules, name)
    section = collect()["sglang"]
    assert (section["installed"], section["verdict"], section["loads"]) == ("0.5.23", "tested release", "yes")
    assert section["entry_point"] == "rocm_vit.integrations.sglang:load"
    assert set(section["hooks"]) == HOOK_NAMES
    assert all(verdict.startswith("applies: sglang.srt.") for verdict in section["hooks"].values())
    assert "sglang" not in sys.modules


@needs_sglang
@pytest.mark.parametrize(
    ("variable", "value", "loads"),
    [
        ("SGLANG_PLUGINS", "another, third", "no: SGLANG_PLUGINS='another, third' does not name rocm_vit"),
        ("SGLANG_PLUGINS", "another, rocm_vit", "yes"),
        ("ROCM_VIT_DISABLE", "1", "no: ROCM_VIT_DISABLE=1"),
        ("ROCM_VIT_PROFILE", "/no/such.yaml", "no: ROCM_VIT_PROFILE = '/no/such.yaml' does not exist"),
    ],
)
def test_doctor_says_whether_sglang_would_load_the_plugin(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, loads: str
) -> None:
    monkeypatch.setenv(variable, value)
    assert collect()["sglang"]["loads"] == loads


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("ROCM_VIT_DISABLE", "1"),
        ("ROCM_VIT_FUSED_OPS", "maybe"),
        ("ROCM_VIT_ROTARY", "fast"),
        ("ROCM_VIT_PROFILE", "/no/such/profile.yaml"),
    ],
)
def test_load_registers_nothing_when_off_or_misconfigured(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, variable: str, value: str
) -> None:
    import rocm_vit.integrations.sglang as plugin

    monkeypatch.setattr(plugin, "_loaded", False)
    monkeypatch.setattr(imports, "_finder", None)
    monkeypatch.setenv(variable, value)
    with caplog.at_level(logging.INFO, logger="rocm_vit"):
        plugin.load()  # never raises
    assert imports.pending() == ()
    assert "the SGLang plugin is off" in caplog.text


@pytest.fixture
def fresh_imports(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """``imports`` with no finder and no originals; ``tmp_path`` importable; sys.meta_path restored."""
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setattr(imports, "_finder", None)
    monkeypatch.setattr(imports, "_originals", {})
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_hook_waits_for_its_module_and_runs_before_importers_bind_names(fresh_imports: Path) -> None:
    (fresh_imports / "rocm_vit_test_target.py").write_text("def entry():\n    return 'sglang'\n")
    (fresh_imports / "rocm_vit_test_importer.py").write_text("from rocm_vit_test_target import entry\n")
    seen = []

    def install(module: types.ModuleType) -> None:
        seen.append(module.__name__)
        imports.replace_attribute(module, "entry", lambda: "rocm-vit")

    imports.when_imported("rocm_vit_test_target", install)
    assert seen == [] and imports.pending() == ("rocm_vit_test_target",)
    import rocm_vit_test_importer  # imports the target, whose hook runs before the name is bound

    assert seen == ["rocm_vit_test_target"] and imports.pending() == ()
    assert rocm_vit_test_importer.entry() == "rocm-vit"
    assert imports.original("rocm_vit_test_target", "entry")() == "sglang"
    # The wrapped loader still serves the source (tracebacks, inspect).
    assert "return 'sglang'" in sys.modules["rocm_vit_test_target"].__loader__.get_source("rocm_vit_test_target")


def _sglang_function() -> str:
    return "sglang"


def _rocm_vit_function() -> str:
    return "rocm-vit"


def _sglang_modules(monkeypatch: pytest.MonkeyPatch, *others: types.ModuleType) -> tuple[types.ModuleType, ...]:
    """An SGLang module owning ``entry`` and one importing it, on ``sys.modules`` with ``others``."""
    owner = types.ModuleType("sglang.rocm_vit_test_owner")
    owner.entry = _sglang_function
    importer = types.ModuleType("sglang.rocm_vit_test_importer")
    for module in (owner, importer, *others):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    return owner, importer


def test_hook_on_an_imported_module_runs_at_once_and_rebinds_sglang_references(
    fresh_imports: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original, replacement = _sglang_function, _rocm_vit_function
    outsider = types.ModuleType("rocm_vit_test_outsider")
    outsider.entry = original
    owner, importer = _sglang_modules(monkeypatch, outsider)
    importer.entry = original
    importer.table = {"slot": original, "other": len}

    imports.when_imported(owner.__name__, lambda module: imports.replace_attribute(module, "entry", replacement))
    assert owner.entry is replacement and importer.entry is replacement
    assert importer.table == {"slot": replacement, "other": len}
    assert outsider.entry is original  # only SGLang's modules are rebound
    imports.replace_attribute(importer, "table", {}, rebind=False)
    assert imports.original(importer.__name__, "table") == {"slot": replacement, "other": len}


class _LazyTable(dict):
    """A table that loads on iteration, as transformers' lazy auto mappings import every model's config."""

    def items(self):
        raise AssertionError("the rebind iterated a lazy table")


def test_rebinding_reads_a_tables_own_entries_without_iterating_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A module of SGLang holding transformers' lazy mappings: iterated, they import hundreds of
    configs (seconds in every SGLang process at the plugin's load)."""
    owner, importer = _sglang_modules(monkeypatch)
    importer.table = _LazyTable(slot=_sglang_function)
    imports.replace_attribute(owner, "entry", _rocm_vit_function)
    assert dict(importer.table) == {"slot": _rocm_vit_function}


def test_windowed_offsets_come_from_sglangs_layout_key_without_reading_the_tensors() -> None:
    from rocm_vit.integrations.sglang.blocks import host_offsets

    unreadable = torch.empty(3, dtype=torch.int32, device="meta")  # .tolist() would raise
    key = ((0, 0, 32), (0, 16, 32))
    assert host_offsets(unreadable, unreadable, key) == key
    assert host_offsets(unreadable, None, ((0, 0, 32), None)) == ((0, 0, 32), None)


def test_windowed_offsets_without_a_key_are_read_from_the_tensors_in_one_go() -> None:
    from rocm_vit.integrations.sglang.blocks import host_offsets

    full, window = torch.tensor([0, 0, 16, 48], dtype=torch.int32), torch.tensor([0, 16, 32, 48], dtype=torch.int32)
    assert host_offsets(full, window, None) == ((0, 0, 16, 48), (0, 16, 32, 48))
    assert host_offsets(full, window, ((0, 0, 16, 48), None)) == ((0, 0, 16, 48), (0, 16, 32, 48))


@needs_sglang
def test_padded_graphs_through_the_adapter_equal_the_runners_padded_eager_calls(report: dict[str, Any]) -> None:
    """Small layouts of one or two images run padded to a shared bucket: replays equal the padded
    eager calls bit for bit, fewer graphs serve the same calls, and SGLang's unpadded eager forward
    stays within fp32 noise. The two calls of three segments (an image and a two-frame video) are
    not padded (MAX_PADDED_SEGMENTS): eager at their first call, where their predicted saving has not
    yet repaid a fifth of a capture, and captured at their second."""
    graphs = report["graph_vs_eager_padded"]
    assert all(graphs["bitwise_equal"]) and len(graphs["bitwise_equal"]) == 12
    assert graphs["captures"] < report["graph_vs_eager"]["captures"]
    assert (graphs["replays"], graphs["eager_runs"]["below_payback"]) == (10, 2)
    assert graphs["max_difference_from_sglangs_eager"] < 1e-5


@needs_sglang
def test_padded_buckets_captured_at_server_start_serve_the_first_requests_bit_for_bit(report: dict[str, Any]) -> None:
    """After SGLang's own graphs, each bucket of SGLang's tower is captured once; the first one-image
    requests then replay those graphs, capture nothing, and equal the padded eager calls."""
    buckets = report["buckets_at_start"]
    assert buckets["captured"] == buckets["bucket_calls"] == buckets["captures_at_start"] > 0
    assert buckets["captures_while_serving"] == 0 and buckets["replays"] == buckets["requests"]
    assert all(buckets["bitwise_equal"]) and len(buckets["bitwise_equal"]) == buckets["requests"]
    assert buckets["bucket_calls"] > 1
    assert buckets["switched_off"] == [0, 0]  # SGLANG_VIT_CUDA_GRAPH_CAPTURE_BUCKETS=0: none at start


@needs_sglang
def test_with_vit_graphs_off_the_server_start_runs_one_eager_call_that_compiles_what_requests_use(
    report: dict[str, Any],
) -> None:
    """Graphs off, SGLang's eager forward serves the tower, and a compiled rotary (where chosen)
    would compile in the first request: the start's eager call must make every rotary call pattern the
    requests use, under ``no_grad`` and ``inference_mode`` alike, and capture nothing."""
    warm_up = report["eager_warm_up_at_start"]
    assert warm_up["captured"] == 0 and warm_up["patterns_at_start"] >= 1
    assert warm_up["rotary_calls_in_requests"] > 0 and warm_up["patterns_new_in_requests"] == 0


class _FailingAdapter:
    """Stands for an adapter whose tower raises in SGLang's forward; its tower holds it, as SGLang's
    ``graph_runners`` does."""

    captures_buckets_at_start = True

    def __init__(
        self, vit: torch.nn.Module, calls: list, warm_up_fails: bool = True, shares_decisions: bool = False
    ) -> None:
        self.vit, self.calls, self.warm_up_fails, self.shares_decisions = vit, calls, warm_up_fails, shares_decisions
        vit.graph_runners = self

    def held_by_its_tower(self) -> bool:
        return self.vit.graph_runners is self

    def capture_padded_buckets(self) -> int:
        self.calls.append("buckets")
        raise RuntimeError("a forward that fails")

    def warm_up(self) -> None:  # no bucket captured: the eager call compiles what requests would
        self.calls.append("warm-up")
        if self.warm_up_fails:
            raise RuntimeError("a forward that fails")


class _Tower(torch.nn.Module):
    pass


def test_bucket_captures_follow_sglangs_graphs_and_a_failure_never_stops_the_server(caplog) -> None:
    from rocm_vit.integrations.sglang import graph_runner, startup

    calls = []

    def init_cuda_graphs(self, capture_decode_cuda_graph: bool = True) -> None:
        calls.append(("sglang", capture_decode_cuda_graph))

    model, elsewhere = torch.nn.ModuleDict({"visual": _Tower()}), _Tower()
    adapters = [_FailingAdapter(model["visual"], calls), _FailingAdapter(elsewhere, calls)]  # the first is the model's
    graph_runner._ADAPTERS.update(adapters)
    try:
        hooked = startup.capture_buckets_after(init_cuda_graphs, startup.model_runner_model)
        assert list(inspect.signature(hooked).parameters) == ["self", "capture_decode_cuda_graph"]
        with caplog.at_level(logging.ERROR, logger=startup.__name__):
            hooked(types.SimpleNamespace(model=model), capture_decode_cuda_graph=False)
    finally:
        graph_runner._ADAPTERS.difference_update(adapters)
    assert calls == [("sglang", False), "buckets", "warm-up"]
    assert "capturing the padded buckets of _Tower at start failed" in caplog.text
    assert "the eager warm-up of _Tower at start failed" in caplog.text


def test_the_encode_server_captures_its_buckets_once_its_weights_are_loaded(caplog) -> None:
    """EPD's encode server builds no ModelRunner: its buckets are captured after SGLang's own
    post-load step in ``MMEncoder.__init__``, and a failure there never stops the server."""
    from rocm_vit.integrations.sglang import graph_runner, startup

    calls = []

    def maybe_precompile_model_kernels_after_loading(model, device: str) -> None:
        calls.append(("sglang", device))

    model = torch.nn.ModuleDict({"visual": _Tower()})
    adapter = _FailingAdapter(model["visual"], calls, warm_up_fails=False)
    graph_runner._ADAPTERS.add(adapter)
    try:
        hooked = startup.capture_buckets_after(maybe_precompile_model_kernels_after_loading, startup.loaded_model)
        assert list(inspect.signature(hooked).parameters) == ["model", "device"]
        with caplog.at_level(logging.ERROR, logger=startup.__name__):
            hooked(model, "cuda")
    finally:
        graph_runner._ADAPTERS.discard(adapter)
    assert calls == [("sglang", "cuda"), "buckets", "warm-up"]
    assert "capturing the padded buckets of _Tower at start failed" in caplog.text


@pytest.mark.parametrize("failing", ["buckets", "warm-up"])
def test_under_tensor_parallelism_a_failure_at_start_fails_this_ranks_start(failing: str, caplog) -> None:
    """A failure the runner did not agree on is one rank's: its peers wait in the tower's collectives
    for calls it would skip. Raised, it ends this rank's start (SGLang stops the group); swallowed,
    the group hangs."""
    from rocm_vit.integrations.sglang import graph_runner, startup

    calls: list = []
    model = torch.nn.ModuleDict({"visual": _Tower()})
    adapter = _FailingAdapter(model["visual"], calls, shares_decisions=True)
    adapter.captures_buckets_at_start = failing == "buckets"
    graph_runner._ADAPTERS.add(adapter)
    try:
        with caplog.at_level(logging.ERROR, logger=startup.__name__), pytest.raises(RuntimeError):
            startup.capture_vit_buckets(model)
    finally:
        graph_runner._ADAPTERS.discard(adapter)
    assert calls == [failing]  # nothing after the failure on this rank
    assert "at start failed" in caplog.text


def test_the_start_serves_only_the_adapter_each_tower_holds_in_the_models_module_order() -> None:
    """Every rank of a TP group must make the start's calls, and their collectives, in the same
    order: not the order of this process's set of adapters, and never through an adapter its tower
    no longer holds (a rebuilt tower's), which would add calls on one rank only."""
    from rocm_vit.integrations.sglang import graph_runner

    calls: list = []
    towers = [_Tower() for _ in range(6)]
    model = torch.nn.ModuleDict({f"tower{index}": tower for index, tower in enumerate(towers)})
    stale = [_FailingAdapter(tower, calls) for tower in towers[:3]]
    serving = [_FailingAdapter(tower, calls) for tower in towers]  # the towers now hold these
    graph_runner._ADAPTERS.update(stale + serving)
    try:
        assert graph_runner.adapters_in(model) == serving
    finally:
        graph_runner._ADAPTERS.difference_update(stale + serving)


class _RowParallel(torch.nn.Module):
    """What ``plan_all_reduce`` reads of SGLang's RowParallelLinear: it all-reduces its output."""

    def __init__(self, output_size: int) -> None:
        super().__init__()
        self.reduce_results, self.output_size = True, output_size


def _group(ca_comm: Any = None, qr_comm: Any = None) -> Any:
    """A group that routes each all-reduce by SGLang's own ``_resolve_outplace_all_reduce_method``."""
    import types

    from sglang.srt.distributed.parallel_state import GroupCoordinator

    group = types.SimpleNamespace(world_size=2, ca_comm=ca_comm, qr_comm=qr_comm, pymscclpp_comm=None,
                                  pcie_ipc_comm=None, torch_symm_mem_comm=None)  # fmt: skip
    group._resolve_outplace_all_reduce_method = types.MethodType(
        GroupCoordinator._resolve_outplace_all_reduce_method, group
    )
    return group


def _all_reducing_vit() -> torch.nn.Module:
    """A tower whose block all-reduces [tokens, 64] bf16 and whose merger [tokens / 4, 96]."""
    vit = torch.nn.Module()
    vit.blocks = torch.nn.ModuleList([torch.nn.Module()])
    vit.blocks[0].proj = _RowParallel(64)
    vit.merger = _RowParallel(96)
    vit.spatial_merge_size, vit.dtype = 2, torch.bfloat16
    return vit


def test_under_tensor_parallelism_graphs_stop_where_the_captured_all_reduces_do() -> None:
    """A block all-reduces [tokens, 64] bf16 (128 bytes a token), a merger [tokens / 4, 96] (48): a
    16 KiB custom all-reduce takes 128 tokens, SGLang's own registers at its capture()'s exit, a
    quick all-reduce takes what it declines; without either, NCCL would be captured: no graphs."""
    sys.path.extend([str(SCENARIO.parent), str(SCENARIO.parent.parent)])
    from custom_all_reduce import AiterCustomAllreduce, UnknownCustomAllreduce, quick_allreduce, sglang_custom_allreduce

    from rocm_vit.integrations.sglang.all_reduce import RegisteringScope, plan_all_reduce

    vit = _all_reducing_vit()
    aiter = AiterCustomAllreduce(_group(), capturing=lambda: False, max_size=16 << 10)
    group = _group(aiter)
    plan = plan_all_reduce(vit, group, max_tokens=8192)
    assert (plan.communicator, plan.max_tokens, plan.capture_scope, plan.problem) == (
        "aiter's CustomAllreduce",
        128,
        None,
        None,
    )
    assert plan_all_reduce(vit, group, max_tokens=100).max_tokens == 100
    group.device_group = None
    group.qr_comm = quick_allreduce(group, min_bytes=1 << 10)  # takes from 8 tokens' block all-reduce up
    assert plan_all_reduce(vit, group, max_tokens=8192).max_tokens == 8192
    aiter.max_size = 32  # not even one token's
    assert "NCCL/RCCL" in plan_all_reduce(vit, _group(aiter), max_tokens=8192).problem
    assert "NCCL/RCCL, which rocm-vit does not capture" in plan_all_reduce(vit, _group(), max_tokens=8192).problem
    cpu_group = _group()  # the stand-in's own group: nothing is exchanged here
    cpu_group.cpu_group, cpu_group.device_group, cpu_group.rank_in_group = None, None, 0
    for variant, name in (("rocm", "ROCm"), ("cuda", "CUDA"), ("deterministic", "ROCm, deterministic 1-stage")):
        plan = plan_all_reduce(vit, _group(sglang_custom_allreduce(cpu_group, lambda: False, variant, 16 << 10)), 8192)
        assert plan.communicator == f"SGLang's CustomAllreduce ({name})" and isinstance(
            plan.capture_scope, RegisteringScope
        )
        assert plan.max_tokens == (8192 if variant == "deterministic" else 128)  # the 1-stage kernel takes any size
    plan = plan_all_reduce(vit, _group(UnknownCustomAllreduce(cpu_group)), 8192)
    assert "CustomAllReduceV2" in plan.problem and "rocm-vit knows" in plan.problem


def _pynccl(available: bool) -> Any:
    """SGLang's ``PyNcclCommunicator`` (the real class, its ``change_state`` included) as its
    ``__init__`` leaves it: disabled, ``available`` where it found NCCL (no communicator is opened)."""
    from sglang.srt.distributed.device_communicators.pynccl import PyNcclCommunicator

    pynccl = object.__new__(PyNcclCommunicator)
    pynccl.available, pynccl.disabled = available, True
    return pynccl


def test_under_tensor_parallelism_nccl_is_captured_through_sglangs_pynccl_enabled_for_the_capture() -> None:
    """What no custom all-reduce takes goes to SGLang's in-place all-reduce: PyNccl where it is
    enabled, as inside SGLang's graph_capture. A capture runs with it enabled (its kernel is then on
    the capturing stream) and leaves it as it was; without NCCL (``available`` False) graphs stay off."""
    sys.path.extend([str(SCENARIO.parent), str(SCENARIO.parent.parent)])
    from custom_all_reduce import AiterCustomAllreduce, sglang_custom_allreduce

    from rocm_vit.integrations.sglang.all_reduce import plan_all_reduce

    vit = _all_reducing_vit()
    group = _group()
    group.pynccl_comm = _pynccl(available=True)
    plan = plan_all_reduce(vit, group, max_tokens=8192)
    assert (plan.communicator, plan.max_tokens, plan.problem) == ("PyNccl", 8192, None)
    with plan.capture_scope():
        assert not group.pynccl_comm.disabled
    assert group.pynccl_comm.disabled
    group.ca_comm = AiterCustomAllreduce(_group(), capturing=lambda: False, max_size=16 << 10)
    plan = plan_all_reduce(vit, group, max_tokens=8192)  # past aiter's 128 tokens, PyNccl's
    assert (plan.communicator, plan.max_tokens) == ("aiter's CustomAllreduce + PyNccl", 8192)
    cpu_group = _group()
    cpu_group.cpu_group, cpu_group.device_group, cpu_group.rank_in_group = None, None, 0
    group.ca_comm = sglang_custom_allreduce(cpu_group, lambda: False, "cuda", 16 << 10)
    exchanges: list[bool] = []  # capture()'s exit registers with the peers: none here
    group.ca_comm.register_graph_buffers = lambda: exchanges.append(group.pynccl_comm.disabled)
    plan = plan_all_reduce(vit, group, max_tokens=8192)
    with plan.capture_scope():  # SGLang's capture() and PyNccl enabled, both
        assert group.ca_comm._IS_CAPTURING and not group.pynccl_comm.disabled
    assert not group.ca_comm._IS_CAPTURING and group.pynccl_comm.disabled and exchanges == [True]
    group.ca_comm, group.pynccl_comm = None, _pynccl(available=False)
    assert "NCCL/RCCL, which rocm-vit does not capture" in plan_all_reduce(vit, group, max_tokens=8192).problem


@pytest.mark.parametrize(
    ("platform", "environ", "says"),
    [
        ("cuda", {}, "CustomAllReduceV2 (SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2 on, the default): not an all-reduce"),
        ("cuda", {"SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2": "0"}, "SGLang's CustomAllreduce (CUDA): captured inside"),
        ("rocm", {"SGLANG_USE_1STAGE_ALLREDUCE": "1"}, "deterministic 1-stage): captured inside"),
        ("rocm", {"SGLANG_ENABLE_DETERMINISTIC_INFERENCE": "1"}, "deterministic 1-stage): captured inside"),
        ("rocm", {"SGLANG_ENABLE_DETERMINISTIC_INFERENCE": "1", "SGLANG_USE_1STAGE_ALLREDUCE": "0"}, "aiter missing"),
        ("rocm", {"SGLANG_USE_AITER_AR": "0"}, "SGLang's CustomAllreduce (ROCm: SGLANG_USE_AITER_AR=0"),
    ],
)
def test_doctor_says_which_all_reduce_sglang_picks_and_what_graphs_do_with_it(
    platform: str, environ: dict[str, str], says: str
) -> None:
    """As SGLang 0.5.23's dispatch_custom_allreduce picks (aiter is not installed here)."""
    from rocm_vit.integrations.sglang.status import all_reduce_verdict

    assert says in all_reduce_verdict(environ, platform)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (None, "rocm-vit's fused glue between SGLang's linear modules (ROCM_VIT_SGLANG_BLOCKS=rocm-vit)"),
        ("sglang", "SGLang's own blocks (ROCM_VIT_SGLANG_BLOCKS=sglang)"),
        ("fused", "unknown: ROCM_VIT_SGLANG_BLOCKS = 'fused' is not one of rocm-vit, sglang"),
    ],
)
def test_doctor_says_which_blocks_the_plugin_runs(value: str | None, says: str) -> None:
    from rocm_vit.integrations.sglang.status import blocks_verdict

    assert blocks_verdict({} if value is None else {"ROCM_VIT_SGLANG_BLOCKS": value}).startswith(says)


def test_captures_inside_sglangs_all_reduce_stop_before_its_table_overflows() -> None:
    """Each capture inside SGLang's ``capture()`` takes one ``rank_data`` entry (64 bytes) per
    all-reduce for good: once another capture would not fit, entering raises (on every rank alike,
    as they capture the same layouts) instead of registering pointers past the table."""
    import contextlib
    import types

    from rocm_vit.integrations.sglang.all_reduce import RegisteringScope

    exits = []

    @contextlib.contextmanager
    def capture() -> Iterator[None]:
        yield
        exits.append("exchange")

    ca_comm = types.SimpleNamespace(rank_data=torch.empty(5 * 64, dtype=torch.uint8), capture=capture)
    scope = RegisteringScope(ca_comm, entries_per_capture=2)
    for _ in range(2):
        with scope():
            pass
    full = r"table of graph inputs is full \(4 of 5 entries, 2 a capture\)"
    with pytest.raises(RuntimeError, match=full), scope():
        pass
    assert exits == ["exchange", "exchange"]
