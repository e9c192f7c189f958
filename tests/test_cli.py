"""The rocm-vit command: doctor output, subcommand registration, entry points."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rocm_vit import __version__
from rocm_vit.cli import main as cli_main
from rocm_vit.cli.main import build_parser, main
from rocm_vit.graphs.padding import bucket_ladder
from rocm_vit.version import build_commit

ROOT = Path(__file__).resolve().parents[1]
DOCTOR_SECTIONS = {
    "rocm_vit",
    "python",
    "platform",
    "versions",
    "policy",
    "settings",
    "environment",
}


def _doctor_json(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict]:
    rc = main(["doctor", "--json", *extra])
    return rc, json.loads(capsys.readouterr().out)


def test_doctor_json_reports_every_section(capsys: pytest.CaptureFixture[str]) -> None:
    rc, report = _doctor_json(capsys)
    assert set(report) >= DOCTOR_SECTIONS | {"problems"}
    assert report["problems"] == []
    assert rc == 0
    assert report["rocm_vit"] == {"version": __version__, "commit": build_commit()}
    assert report["platform"]["name"] in {"cpu", "cuda", "rocm"}
    assert set(report["platform"]) == {"name", "device_name", "arch", "device_count"}
    versions = report["versions"]
    assert {"python", "torch", "torch_hip", "torch_cuda", "triton", "aiter", "sglang", "transformers"} <= set(versions)
    assert versions["python"] == ".".join(map(str, sys.version_info[:3]))
    assert versions["torch"] != "not installed"
    policy = report["policy"]
    assert {"backend", "why", "known"} <= set(policy["attention"])
    assert policy["attention"]["backend"] in policy["attention"]["known"]
    assert policy["rotary"]["implementation"] in {"triton", "compiled", "native"}
    assert policy["fused_ops"]["block_ops"] in {"fused", "plain"}
    for choice in ("gelu_epilogue", "side_stream"):
        assert policy[choice]["why"]
    assert policy["profile"]["in_force"]
    assert report["settings"]["graph_cache_capacity"] == 32
    padding = policy["graph_padding"]  # the ladder up to the runner's max tokens, and the rule on examples
    assert padding["buckets"] == ", ".join(map(str, bucket_ladder(policy["graph_runner"]["max_tokens"])))
    assert padding["per_layout"]["1x196 (a 224x224 image)"] == "padded to 256"
    assert padding["per_layout"]["1x4920 (a 1.3 MP photo)"] == "as it is"  # device-bound: nothing to save
    # 252 of 256 first, one image and two
    assert padding["captured_at_start"].startswith("25 calls (patches): 14x18, 14x8 + 14x10, 12x26, ")
    runner = policy["graph_runner"]  # RunnerOptions as the policy builds them for SGLang's Qwen3-VL-8B
    assert (runner["capacity"], runner["min_hits"], runner["max_tokens"]) == (32, 2, 8192)
    assert runner["admission"].startswith("by the cost model (27 blocks")
    assert runner["padding"] == f"buckets {bucket_ladder(8192)}"


def test_doctor_shows_sglang_and_rocm_vit_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SGLANG_VIT_CUDA_GRAPH_CACHE_CAPACITY", "5")
    monkeypatch.setenv("SGLANG_SOMETHING_ELSE", "x")
    monkeypatch.setenv("ROCM_VIT_ATTENTION_BACKEND", "sdpa")
    monkeypatch.setenv("UNRELATED_VARIABLE", "y")
    monkeypatch.delenv("ROCM_VIT_PROFILE", raising=False)
    rc, report = _doctor_json(capsys)
    assert rc == 0
    assert report["environment"] == {
        "ROCM_VIT_ATTENTION_BACKEND": "sdpa",
        "SGLANG_SOMETHING_ELSE": "x",
        "SGLANG_VIT_CUDA_GRAPH_CACHE_CAPACITY": "5",
    }
    assert report["settings"]["graph_cache_capacity"] == 5
    attention = report["policy"]["attention"]
    assert (attention["backend"], attention["why"]) == ("sdpa", "set by ROCM_VIT_ATTENTION_BACKEND")


def test_doctor_reports_bad_settings_and_still_prints(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROCM_VIT_FUSED_OPS", "maybe")
    rc, report = _doctor_json(capsys)
    assert rc == 1
    assert "ROCM_VIT_FUSED_OPS = 'maybe' is not a boolean" in report["settings"]["error"]
    assert any(problem.startswith("settings: ") for problem in report["problems"])
    assert report["platform"]["name"] in {"cpu", "cuda", "rocm"}  # the other sections still ran


def test_doctor_never_imports_aiter(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A stand-in aiter that fails loudly if imported: the real one runs rocminfo on import.
    (tmp_path / "aiter").mkdir()
    (tmp_path / "aiter" / "__init__.py").write_text("raise RuntimeError('doctor imported aiter')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    rc, report = _doctor_json(capsys)
    assert rc == 0
    assert report["versions"]["aiter"] == "installed (version unknown)"
    assert "aiter" not in sys.modules


def test_plain_doctor_prints_sections(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"rocm-vit {__version__}  commit {build_commit()}\n")
    for heading in ("platform:", "versions:", "policy:", "settings:", "environment:"):
        assert f"\n{heading}\n" in out
    for choice in ("attention:", "rotary:", "fused_ops:", "side_stream:", "graph_runner:", "profile:"):
        assert f"\n  {choice}\n" in out
    assert "torch" in out and "graph_cache_capacity" in out


def test_unknown_subcommand_exits_non_zero(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["no-such-command"])
    assert exited.value.code != 0
    assert "invalid choice" in capsys.readouterr().err


def test_missing_subcommand_exits_non_zero() -> None:
    with pytest.raises(SystemExit) as exited:
        main([])
    assert exited.value.code != 0


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"rocm-vit {__version__}"


def test_absent_subcommand_module_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(cli_main.SUBCOMMANDS, "later", ("rocm_vit.cli.not_written_yet", "a later subcommand"))
    parser = build_parser()
    assert parser.parse_args(["doctor"]).command == "doctor"
    with pytest.raises(SystemExit):
        parser.parse_args(["later"])


def test_broken_subcommand_module_reports_its_import_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "broken_subcommand.py").write_text("import rocm_vit.no_such_module\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli_main.SUBCOMMANDS, "broken", ("broken_subcommand", "a broken subcommand"))
    assert main(["broken", "--any", "arguments"]) == 1
    err = capsys.readouterr().err
    assert "rocm-vit broken: cannot import broken_subcommand" in err
    assert "rocm_vit.no_such_module" in err
    assert main(["doctor", "--json"]) == 0  # the others keep working


def test_every_registered_module_has_the_subcommand_interface() -> None:
    import importlib

    for name, (module_name, _) in cli_main.SUBCOMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name == module_name:
                continue  # not written yet
            raise
        assert callable(module.add_arguments) and callable(module.run), name


@pytest.mark.parametrize("module", ["rocm_vit.cli.main", "rocm_vit"])
def test_python_dash_m_runs_doctor_json(module: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, "-m", module, "doctor", "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert set(report) >= DOCTOR_SECTIONS


def test_presets_build_their_own_tower_class() -> None:
    import torch

    from rocm_vit.models import Qwen3VLVisionTower, Qwen25VLVisionTower
    from rocm_vit.workloads.workload import build_tower

    qwen3 = build_tower("tiny", torch.device("cpu"), torch.float32, "sdpa", seed=0)
    qwen25 = build_tower("qwen2.5-vl-tiny", torch.device("cpu"), torch.float32, "sdpa", seed=0)
    assert type(qwen3) is Qwen3VLVisionTower
    assert type(qwen25) is Qwen25VLVisionTower


def test_layouts_round_to_each_towers_merge_blocks() -> None:
    from rocm_vit.models import preset
    from rocm_vit.workloads.workload import parse_layouts

    # 32 px merge blocks for Qwen3-VL (patch 16), 28 px for Qwen2.5-VL (patch 14).
    assert parse_layouts("1x448x224", preset("tiny"))[0].grid_thw == ((1, 28, 14),)
    assert parse_layouts("1x448x224,1x448f4", preset("qwen2.5-vl-tiny"))[1].grid_thw == ((2, 32, 32),)
    assert parse_layouts("1x448x224", preset("qwen2.5-vl-tiny"))[0].grid_thw == ((1, 32, 16),)


def test_photos_sweep_holds_the_real_sizes_of_long_sequence_attention():
    from rocm_vit.models import preset
    from rocm_vit.workloads.workload import parse_layouts

    patches = [workload.patches for workload in parse_layouts("photos", preset("qwen3-vl-8b"))]
    assert patches == [8160, 16320, 14400, 12800, 47376]


def test_bench_runs_a_qwen25_preset_on_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--preset", "qwen2.5-vl-tiny", "--layouts", "1x224,1x64+1x300x200", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "preset qwen2.5-vl-tiny" in out
    assert out.count("finite") == 2


def test_bench_json_and_table_name_the_version_and_the_build_commit(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from rocm_vit import version
    from rocm_vit.cli.bench import format_report

    monkeypatch.setattr(version, "build_commit", lambda: "0123abcd-stamped")
    assert main(["bench", "--layouts", "1x64", "--repeats", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["rocm_vit"], report["commit"]) == (__version__, "0123abcd-stamped")
    assert format_report(report).startswith(f"rocm-vit {__version__} bench  ")
    assert "  commit 0123abcd-stamped  " in format_report(report).splitlines()[0]


def test_bench_rows_carry_what_an_eager_call_costs_the_host_and_the_device(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from rocm_vit.cli.bench import format_report

    assert main(["bench", "--layouts", "1x64,1x128", "--repeats", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    for row in report["rows"]:
        # On a CPU the host time is the call's wall time; the device columns have nothing to show.
        assert row["host_ms"] > 0 and row["busy_ahead"] is True
        assert row["device_ms"] is None and row["kernels"] is None and row["host_us_per_launch"] is None
    header, first = format_report(report).splitlines()[2:4]
    assert header.split()[:11] == [
        "layout",
        "patches",
        "tokens",
        "eager",
        "ms",
        "host",
        "ms",
        "device",
        "ms",
        "kernels",
        "host",
    ]
    assert first.split()[5:9] == ["-", "-", "-", "finite"]


def test_eager_cost_per_launch_is_host_time_over_the_kernels() -> None:
    from rocm_vit.workloads.launch_cost import EagerCost

    cost = EagerCost(host_ms=20.4, device_ms=1.72, kernels=235, busy_ahead=True)
    assert cost.fields() == {
        "host_ms": 20.4, "device_ms": 1.72, "kernels": 235, "busy_ahead": True,
        "host_us_per_launch": pytest.approx(86.8, abs=0.05),
    }  # fmt: skip
    assert EagerCost(1.0, None, None, True).host_us_per_launch is None


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        # Kernels the H200 ran (docs/benchmarks.md, "`rocm-vit bench --breakdown`") ...
        ("nvjet_sm90_tst_64x40_64x16_4x2_h_bz_bias_TNT", "gemm"),
        ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_bf16_64x128_64x3_tn_align2>", "gemm"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128", "attention"),
        ("_varlen_attn_fwd", "attention"),
        ("_add_norm_kernel", "norm"),
        ("_rotary_kernel", "rotary"),
        ("Memset (Device)", "memory"),
        ("_silu_mul_kernel", "other"),
        ("void at::native::vectorized_elementwise_kernel<8, at::native::GeluCUDAKernelImpl", "other"),
        # ... ROCm's (hipBLASLt / rocBLAS Tensile, aiter's CK attention) and aten operators on a CPU.
        ("Cijk_Alik_Bljk_BBS_BH_MT128x128x64_MI16x16x16x1_SN_1LDSB0", "gemm"),
        ("fmha_fwd_hd128_bf16_batch_b128x128x32", "attention"),
        ("aten::addmm", "gemm"),
        ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
        ("aten::native_layer_norm", "norm"),
        ("aten::mul", "other"),
    ],
)
def test_kernel_class_sorts_real_kernel_names(name: str, kind: str) -> None:
    from rocm_vit.cli.breakdown import kernel_class

    assert kernel_class(name) == kind


def test_bench_breakdown_splits_the_forward_by_kernel_class(capsys: pytest.CaptureFixture[str]) -> None:
    from rocm_vit.cli.breakdown import KERNEL_CLASSES

    assert main(["bench", "--layouts", "1x64,1x224", "--repeats", "1", "--breakdown", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    for row in rows:
        breakdown = row["breakdown"]
        assert set(breakdown) == {*KERNEL_CLASSES, "total", "kernels"}
        assert breakdown["total"] == pytest.approx(sum(breakdown[kind] for kind in KERNEL_CLASSES))
        assert breakdown["kernels"] >= 1
        # The tiny tower on a CPU: its linear layers and attention are there, and take time.
        assert breakdown["gemm"] > 0 and breakdown["attention"] > 0
    assert main(["bench", "--layouts", "1x64", "--repeats", "1", "--breakdown"]) == 0
    table = capsys.readouterr().out
    assert "kernel time per forward" in table and "attention" in table.splitlines()[-2]


# bench-memory -----------------------------------------------------------------------------------


def test_bench_memory_parses_its_arguments() -> None:
    args = build_parser().parse_args(["bench-memory"])
    assert (args.scenario, args.preset, args.budget_mib, args.calls, args.random_calls, args.max_side) == (
        "all",
        "qwen3-vl-8b",
        None,  # the runner's default budget
        1500,
        2000,
        1344,
    )
    assert args.churn_calls == 1200
    assert (args.seed, args.json, args.plot) == (0, False, None)
    given = "--scenario streams --budget-mib 256 --calls 30 --random-calls 40 --max-side 4032 --seed 3 --json"
    args = build_parser().parse_args(["bench-memory", *given.split(), "--plot", "memory.png"])
    assert (args.scenario, args.budget_mib, args.calls, args.random_calls, args.max_side, args.seed) == (
        "streams",
        256,
        30,
        40,
        4032,
        3,
    )
    assert args.json and args.plot == Path("memory.png")


@pytest.mark.parametrize(
    "bad", [["--scenario", "bursty"], ["--calls", "0"], ["--budget-mib", "-1"], ["--max-side", "128"]]
)
def test_bench_memory_rejects_bad_arguments(bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["bench-memory", *bad])
    assert exited.value.code == 2
    assert bad[0] in capsys.readouterr().err


def test_mixed_stream_is_deterministic_per_seed() -> None:
    from rocm_vit.models import preset
    from rocm_vit.workloads.workload import mixed_stream

    config = preset("qwen3-vl-8b")
    assert mixed_stream(300, 7, config) == mixed_stream(300, 7, config)
    assert mixed_stream(300, 7, config) != mixed_stream(300, 8, config)


@pytest.mark.parametrize(("preset_name", "seed"), [("qwen3-vl-8b", 0), ("qwen3-vl-8b", 1), ("qwen2.5-vl-7b", 0)])
def test_mixed_stream_sends_the_hot_share_to_small_hot_layouts_and_never_repeats_a_one_off(
    preset_name: str, seed: int
) -> None:
    from collections import Counter

    from rocm_vit.models import preset
    from rocm_vit.workloads.workload import mixed_stream, parse_layouts

    config = preset(preset_name)
    stream = mixed_stream(1500, seed, config)
    counts = Counter(stream)
    hot = {workload for workload, count in counts.items() if count > 1}
    one_offs = [workload for workload, count in counts.items() if count == 1]
    assert len(stream) == 1500
    assert len(hot) == 20
    assert abs(sum(counts[workload] for workload in hot) / len(stream) - 0.8) < 0.01
    assert all(workload.patches < 4096 for workload in hot)
    # A graph is keyed on the per-image patch counts: no one-off may share them with another call.
    lengths = [tuple(h * w for _, h, w in workload.grid_thw) for workload in counts]
    assert len(set(lengths)) == len(lengths)
    assert len(one_offs) == 300
    assert max(workload.patches for workload in one_offs) > 4096  # large photos among them
    assert min(workload.patches for workload in one_offs) < 256  # and thumbnails
    sides_px = [side * config.patch_size for workload in one_offs for _, *sides in workload.grid_thw for side in sides]
    assert max(sides_px) <= 1344  # --max-side's default: a multiple of both towers' merge blocks
    for workload in [*hot, *one_offs[:20]]:  # specs are pixel sizes that bench --layouts reads back
        assert parse_layouts(workload.spec, config)[0].grid_thw == workload.grid_thw


def test_churn_stream_repeats_hot_layouts_at_its_share_and_draws_the_rest_afresh() -> None:
    from collections import Counter

    from rocm_vit.models import preset
    from rocm_vit.workloads.workload import churn_stream

    config = preset("qwen3-vl-8b")
    stream = churn_stream(1200, 0, config)
    assert stream == churn_stream(1200, 0, config) != churn_stream(1200, 1, config)
    counts = Counter(stream)
    assert 700 < len(counts) < 900  # about 760 distinct layouts, as bench-memory's churn scenario draws
    sides = [side for workload in stream for _, *sides in workload.grid_thw for side in sides]
    assert min(sides) >= 4 and max(sides) <= 80 and all(side % 2 == 0 for side in sides)
    assert {len(workload.grid_thw) for workload in stream} == set(range(1, 7))


def test_a_shallow_tower_keeps_its_widths_and_scales_its_block_indexes() -> None:
    from rocm_vit.workloads.workload import build_tower

    tower = build_tower("qwen3-vl-8b", torch.device("meta"), torch.bfloat16, "sdpa", 0, depth=4)
    assert (tower.config.depth, tower.config.hidden_size, tower.config.deepstack_visual_indexes) == (4, 1152, (1, 2, 3))
    windowed = build_tower("qwen2.5-vl-7b", torch.device("meta"), torch.bfloat16, "sdpa", 0, depth=8)
    assert windowed.config.fullatt_block_indexes == (1, 3, 5, 7)


def test_revisiting_workloads_repeat_earlier_layouts_at_the_given_share() -> None:
    from rocm_vit.models import preset
    from rocm_vit.workloads.workload import revisiting_workloads

    config = preset("qwen3-vl-8b")
    stream = revisiting_workloads(2000, 0, config, max_side_px=1344)
    assert stream == revisiting_workloads(2000, 0, config, max_side_px=1344)
    repeats = len(stream) - len(set(stream))
    assert 0.45 < repeats / len(stream) < 0.55
    fresh_only = revisiting_workloads(200, 0, config, revisit_share=0.0)
    assert len(set(fresh_only)) == len(fresh_only)


def test_bench_memory_without_a_gpu_exits_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from rocm_vit.cli import bench_memory
    from rocm_vit.platform import PlatformInfo

    monkeypatch.setattr(bench_memory, "platform_info", lambda: PlatformInfo("cpu", "cpu", "", 0))
    assert main(["bench-memory"]) == 2
    assert "needs a GPU; none is visible" in capsys.readouterr().out


def test_bench_memory_plot_without_matplotlib_says_what_to_install(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # find_spec answers None: not installed
    assert main(["bench-memory", "--plot", "memory.png"]) == 2
    assert "pip install rocm-vit[bench]" in capsys.readouterr().err


def _bench_memory_report(
    hit_rate: float = 0.787,
    max_bytes_held: int = 600 << 20,
    mismatches: int = 0,
    ample_refused: int = 0,
    stall_p99_ms: float = 1.9,
) -> dict:
    runs = {"captures": 20, "evictions": 0, "pool_releases": 0, "graphs_held": 20}
    churn_run = {
        **runs,
        "eager_runs": {},
        "max_bytes_held": 3 << 30,
        "mismatches": 0,
        "refused_calls": 0,
        "smallest_refused_tokens": None,
        "over_budget_from_tokens": None,
        "replays": 1200,
        "capture_seconds": 40.0,
        "verify_seconds": 0.5,
        "pool_growth_prediction": {"captures": 400, "mean_absolute_error_bytes": 1 << 20, "worst_under_bytes": 0},
    }
    stall = {"iterations": 400, "p50_ms": 1.0, "captures": 24, "seconds": 3.0, "capture_ms_each": 90.0}
    timed = {"mean_ms": 6.0, "median_ms": 3.0, "total_s": 9.0, "peak_reserved_growth_bytes": 2 << 30}
    return {
        "rocm_vit": "0.1.0",
        "commit": "0123abcd-stamped",
        "date": "2026-01-01",
        "device": "NVIDIA H200",
        "torch": "2.9.0",
        "preset": "qwen3-vl-8b",
        "dtype": "bf16",
        "attention_backend": "sdpa",
        "budget_bytes": 1 << 30,
        "graph_defaults": {"capacity": 32, "min_hits": 2, "max_tokens": 4096},
        "max_side_px": 1344,
        "seed": 0,
        "scenarios": {
            "mixed": {
                "calls": 1500,
                "hot_layouts": 20,
                "hot_calls": 1200,
                "one_off_calls": 300,
                "replays": round(1500 * hit_rate),
                "hit_rate": hit_rate,
                "max_bytes_held": max_bytes_held,
                "final_bytes_held": 500 << 20,
                **runs,
                "eager_runs": {"below_min_hits": 254, "over_max_tokens": 66},
                "graph_run": timed,
                "eager_run": {**timed, "mean_ms": 15.0, "total_s": 22.5},
            },
            "random": {
                "calls": 2000,
                "distinct_layouts": 984,
                "warm_up_calls": 200,
                "replays": 330,
                "hit_rate": 0.165,
                "max_bytes_held": 650 << 20,
                "calls_over_budget": 0,
                **runs,
                "eager_runs": {},
                "reserved_after_warm_up_bytes": 8 << 30,
                "reserved_growth_after_warm_up_bytes": 0,
                "peak_reserved_growth_after_warm_up_bytes": 100 << 20,
                "reserved_after_warm_up_by_holder": {"graph pools": 512 << 20},
                "all_eager_peak_reserved_growth_after_warm_up_bytes": 60 << 20,
                "reserved_at_the_largest_sample": {"bytes": 9 << 30, "by_holder": {"graph pools": 1 << 30}},
            },
            "churn": {
                "depth": 4,
                "calls": 1200,
                "distinct_layouts": 817,
                "largest_tokens": 23328,
                "runs": {
                    "ample": {**churn_run, "budget_bytes": 64 << 30, "refused_calls": ample_refused},
                    "default": {
                        **churn_run,
                        "budget_bytes": 2 << 30,
                        "max_bytes_held": 2 << 30,
                        "refused_calls": 5,
                        "smallest_refused_tokens": 20000,
                        "over_budget_from_tokens": 19000,
                    },
                },
            },
            "capture-stall": {
                "layouts": 24,
                "loop": "4 x 4096^2 bf16 matmuls",
                "alone": {"iterations": 800, "p50_ms": 1.0, "p99_ms": 1.1},
                "before": {**stall, "p99_ms": 40.0, "verify_ms_each": 0.2},
                "now": {**stall, "p99_ms": stall_p99_ms, "verify_ms_each": 0.2},
            },
            "streams": {
                "threads": 4,
                "calls": 200,
                "hot_layouts": 4,
                "replays": 156,
                **runs,
                "eager_runs": {"below_min_hits": 44},
                "mismatches": mismatches,
                "mismatched_hot_calls": mismatches,
                "mismatched_layouts": [],
                "failed_calls": 0,
                "failures": [],
            },
        },
    }


def _met_column(table: str, metric: str, scenario: str = "") -> str:
    (line,) = [line for line in table.splitlines() if line.startswith(scenario) and metric in line]
    return line.split()[-1]


def test_bench_memory_table_shows_every_target_met() -> None:
    from rocm_vit.cli.bench_memory import exit_status, format_table

    report = _bench_memory_report()
    table = format_table(report)
    assert table.startswith("rocm-vit 0.1.0 bench-memory  2026-01-01  NVIDIA H200  commit 0123abcd-stamped  ")
    assert _met_column(table, "hit rate (replays / calls)") == "yes"
    assert "78.7% (1180 replays)" in table
    assert _met_column(table, "max bytes held", "mixed") == "yes"
    assert _met_column(table, "outputs unequal to eager", "streams") == "yes"
    assert _met_column(table, "calls refused over_budget", "churn, default") == "yes"  # measured over alone
    assert _met_column(table, "while 24 captures run, capture_begin") == "yes"
    assert "NO" not in table
    assert exit_status(report) == 0


@pytest.mark.parametrize(
    ("missed", "metric"),
    [
        ({"hit_rate": 0.70}, ("hit rate (replays / calls)", "mixed")),
        ({"max_bytes_held": (1 << 30) + 1}, ("max bytes held", "mixed")),
        ({"mismatches": 1}, ("outputs unequal to eager", "streams")),
        ({"ample_refused": 1}, ("calls refused over_budget", "churn, ample")),
        ({"stall_p99_ms": 2.5}, ("while 24 captures run, capture_begin", "capture-stall")),
    ],
)
def test_bench_memory_table_marks_a_missed_target_and_exits_1(missed: dict, metric: tuple[str, str]) -> None:
    from rocm_vit.cli.bench_memory import exit_status, format_table

    report = _bench_memory_report(**missed)
    assert _met_column(format_table(report), *metric) == "NO"
    assert exit_status(report) == 1


def test_bench_memory_table_covers_only_the_scenarios_run() -> None:
    from rocm_vit.cli.bench_memory import exit_status, format_table

    report = _bench_memory_report(hit_rate=0.5)
    del report["scenarios"]["mixed"]
    table = format_table(report)
    assert "mixed" not in table.split("\n", 2)[2]
    assert exit_status(report) == 0


@pytest.mark.parametrize(
    ("environment", "buckets", "padding"),
    [
        ({"SGLANG_VIT_CUDA_GRAPH_PADDING": "0"}, "none: exact layouts only", "exact layouts only"),
        ({"SGLANG_VIT_CUDA_GRAPH_MAX_TOKENS": "0"}, "", "buckets ()"),
    ],
)
def test_doctor_shows_the_padding_the_runner_will_use(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, environment: dict, buckets: str, padding: str
) -> None:
    """The padding section is the runner's own (``RunnerOptions.padding``): padding off shows none, and
    max tokens 0 (no call captured) is a setting doctor prints, not a problem."""
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    rc, report = _doctor_json(capsys)
    assert (rc, report["problems"]) == (0, [])
    assert report["policy"]["graph_padding"]["buckets"].startswith(buckets)
    assert report["policy"]["graph_runner"]["padding"] == padding
