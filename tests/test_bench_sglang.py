"""``rocm-vit bench-sglang``: its tables from workers' reports, the workers' command lines and
environments, SGLang's kernel names in the breakdown's classes, and real runs on this CPU (SGLang's
eager tower; rocm-vit's own tower on its weights and kernel). The measurement itself needs a GPU:
docs/sglang.md, "Side by side with SGLang's own ViT graphs"."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rocm_vit.cli import bench_sglang
from rocm_vit.cli.bench_sglang import (
    CONFIGS,
    OWN_LIMIT,
    format_report,
    skip_reason,
    worker_command,
    worker_environ,
    worker_timeout,
)

ROOT = Path(__file__).resolve().parents[1]
SUPPORT = ROOT / "tests" / "sglang_support"


def _row(layout: str, warm: float, first: float, equal: bool | None = None) -> dict:
    patches = {"1x224": 196, "1x512": 1024}[layout]
    row = {"layout": layout, "patches": patches, "warm_ms": warm, "first_ms": first}
    if equal is not None:
        row.update(bitwise_equal=equal, max_difference=0.0 if equal else 0.0625)
        row["max_difference_from_sglang_eager"] = 0.5  # the plugin's rows only, in a real report
    return row


def _result(label: str, rows: list[dict], stream: dict | None = None, **layouts: object) -> dict:
    result = {"label": label, "backend": "triton_attn", "runner": "x.ViTCudaGraphRunner", "sgl_kernel": "stand-in"}
    result["layouts"] = {"rows": rows, "graph_bytes": 3 * 2**20, "graphs": 2, **layouts}
    if stream is not None:
        result["stream"] = {"name": "chat, 1.3 MP cap", "calls": 1000, **stream}
    return result


def _report() -> dict:
    stream = {"mean_ms": 20.0, "p50_ms": 18.0, "p90_ms": 30.0, "p99_ms": 41.0, "graph_bytes": 2**30}
    return {
        "preset": "qwen3-vl-8b",
        "device": "cuda",
        "rocm_vit": "0.1.0",
        "stream_calls": 1000,
        "seed": 0,
        "configs": {
            "a": _result("SGLang eager", [_row("1x224", 5.0, 900.0), _row("1x512", 8.0, 9.0)], stream),
            "b": _result(
                "SGLang graphs",
                [_row("1x224", 2.0, 150.0, True), _row("1x512", 4.0, 120.0, True)],
                {
                    **stream,
                    "captures_in_calls": 612,
                    "capture_seconds_in_calls": 48.25,
                    "stopped": {"at_call": 700, "out_of_memory": True, "reserved_bytes": 80 * 2**30},
                },
            ),
            "c": _result(
                "rocm-vit",
                [_row("1x224", 2.02, 3.0, True), _row("1x512", 4.2, 5.0, False)],
                {**stream, "captures_in_calls": 40, "capture_seconds_in_calls": 2.0},
                start={"captured": 6, "seconds": 1.5},
            ),
            "d": {"label": "rocm-vit, ROCm decisions", "import_error": "No module named 'x'", "missing_module": "x"},
        },
    }


def test_tables_compare_each_plugin_configuration_with_sglangs_own_graphs() -> None:
    text = "\n".join(format_report(_report()))
    # Warm medians (first calls), and c against b on warm medians: 1.010 within the limit, 1.050 past it.
    assert "2.02 (3.00)" in text and "1.010" in text and "1.050" in text
    assert "c slower than b on 1x512: 4.20 vs 4.00 ms" in text and "slower than b on 1x224" not in text
    assert "b: graph == own eager on 2/2 layouts" in text
    assert "c: graph == own eager on 1/2 layouts: not 1x512 (max diff 0.0625)" in text
    assert "6 captured at start in 1.5 s); max diff from SGLang's eager forward 0.5" in text
    assert "d: rocm-vit, ROCm decisions: FAILED: No module named 'x' (missing module: x)" in text
    stream_table = text.split("\nStream: 1000 calls of chat, 1.3 MP cap, seed 0\n")[1].splitlines()
    stream_line = next(line for line in stream_table if line.strip().startswith("b: SGLang graphs"))
    assert (
        "48.2" in stream_line
        and "1024" in stream_line
        and "stopped at call 700 of 1000: out of memory, 81920 MiB reserved" in stream_line
    )
    assert "612" in stream_line and text.splitlines()[-1].strip().startswith("c: rocm-vit")  # the stream table last


def test_graph_configurations_skip_on_a_cpu_and_run_on_a_gpu() -> None:
    assert skip_reason(CONFIGS["a"], "cpu") is None
    assert all(skip_reason(CONFIGS[key], "cpu") for key in "bcd")
    assert not any(skip_reason(CONFIGS[key], "cuda") for key in "abcd")


def test_worker_gets_its_configuration_and_no_other(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SGLANG_USE_AITER", "1")  # left over from an earlier ROCm run
    monkeypatch.setenv("SGLANG_VIT_ENABLE_CUDA_GRAPH", "1")
    monkeypatch.setenv("ROCM_VIT_SGLANG_BLOCKS", "sglang")  # the caller's choice reaches s alone
    args = argparse.Namespace(preset="qwen3-vl-8b", layouts="1x224", seed=0, stream_max_pixels=None, breakdown=False)
    b, d = (worker_command(key, CONFIGS[key], "cuda", args, 20, 1000, tmp_path / "r.json", 240) for key in "bd")
    assert b[b.index("--attention") + 1] == "triton_attn" and "--graphs" in b and "--plugin" not in b
    assert d[d.index("--attention") + 1] == "aiter_attn" and {"--graphs", "--plugin"} <= set(d)
    assert b[b.index("--stream-calls") + 1] == "1000" and d[d.index("--stream-calls") + 1] == "0"
    assert b[b.index("--dtype") + 1] == "bfloat16" and b[b.index("--stream-deadline") + 1] == "220"
    standin = Path(b[b.index("--sgl-kernel-standin") + 1])
    assert (standin / "sgl_kernel" / "__init__.py").is_file()
    on_cpu = worker_command("a", CONFIGS["a"], "cpu", args, 20, 1000, tmp_path / "r.json", 240)
    assert on_cpu[on_cpu.index("--attention") + 1] == "sdpa" and on_cpu[on_cpu.index("--dtype") + 1] == "float32"
    environ_c, environ_d = worker_environ(CONFIGS["c"]), worker_environ(CONFIGS["d"])
    assert not {"SGLANG_USE_AITER", "SGLANG_VIT_ENABLE_CUDA_GRAPH", "ROCM_VIT_EMULATE", "ROCM_VIT_SGLANG_BLOCKS"} & set(
        environ_c
    )
    assert worker_environ(CONFIGS["s"])["ROCM_VIT_SGLANG_BLOCKS"] == "sglang"
    assert (environ_d["ROCM_VIT_EMULATE"], environ_d["SGLANG_USE_AITER"]) == ("rocm", "1")
    assert environ_c["PYTHONPATH"].split(os.pathsep)[0] == str(ROOT)


@pytest.mark.slow
def test_a_cpu_run_measures_sglangs_eager_tower_and_skips_the_graph_configurations(tmp_path: Path) -> None:
    if importlib.util.find_spec("sglang") is None:  # never imported here: it patches Triton for the process
        pytest.skip("sglang is not installed")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env["TORCHDYNAMO_DISABLE"] = "1"  # SGLang's compiled helpers eager: plumbing, not speed, is checked here
    command = [sys.executable, "-m", "rocm_vit", "bench-sglang", "--device", "cpu", "--preset", "tiny"]
    command += ["--layouts", "1x64,2x96", "--warm", "1", "--calls", "2", "--stream-max-pixels", "65536", "--json"]
    command += ["--breakdown"]
    command += ["--save", str(tmp_path / "saved.json")]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout)
    assert json.loads((tmp_path / "saved.json").read_text())["configs"]["a"] == report["configs"]["a"]
    a = report["configs"]["a"]
    assert "error" not in a and a["backend"] == "sdpa" and a["sgl_kernel"] == "absent", a
    assert [row["layout"] for row in a["layouts"]["rows"]] == ["1x64", "2x96"]
    assert all(row["warm_ms"] > 0 and row["first_ms"] > 0 for row in a["layouts"]["rows"])
    # On a CPU a call returns when its work is done: its host time is nearly its wall time.
    assert all(0 < row["warm_host_ms"] <= row["warm_ms"] for row in a["layouts"]["rows"])
    assert a["stream"]["served"] == a["stream"]["calls"] == 2 and a["stream"]["p90_ms"] > 0
    assert len(a["stream"]["times_ms"]) == 2
    assert all("needs a GPU" in report["configs"][key]["skipped"] for key in "bcd")
    assert "Layouts: warm median ms" in done.stderr and "a: SGLang eager" in done.stderr
    for row in a["layouts"]["rows"]:  # SGLang's eager forward by kernel class: its linears and its sdpa
        assert row["breakdown"]["gemm"] > 0 and row["breakdown"]["attention"] > 0 and row["breakdown"]["kernels"] > 0
    assert "kernel time per forward" in done.stderr and "1x64 a" in done.stderr
    assert "Host ms until a warm call returned (median):" in done.stderr


def test_a_budget_is_shared_by_the_configurations_left() -> None:
    c, b, a, d = (CONFIGS[key] for key in "cbad")
    assert worker_timeout(600, None, 0, [c, b, a, d]) == 600  # no budget: the limit
    assert worker_timeout(600, 350, 0, [c, b, a, d]) == 100  # 350 s over weights 1, 1, 1, 0.5
    assert worker_timeout(600, 350, 50, [b, a, d]) == 120  # c left 50 s to the others
    assert worker_timeout(600, 350, 300, [d]) == 50 and worker_timeout(40, 350, 300, [d]) == 40
    assert worker_timeout(600, 350, 349, [d]) == 30  # never less than the report's margin and 10 s


def test_unknown_configuration_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    bench_sglang.add_arguments(parser)
    assert bench_sglang.run(parser.parse_args(["--configs", "ax", "--device", "cpu"])) == 2
    assert "unknown configurations ['x']" in capsys.readouterr().err


# rocm-vit's own tower beside SGLang's, and the breakdown ----------------------------------------


def test_own_tower_configurations_run_in_their_twins_process(tmp_path: Path) -> None:
    args = argparse.Namespace(preset="qwen3-vl-8b", layouts="1x224", seed=0, stream_max_pixels=None, breakdown=True)
    commands = {
        key: worker_command(key, CONFIGS[key], "cuda", args, 20, 1000, tmp_path / "r.json", 240) for key in "cor"
    }
    for key, twin in (("o", "c"), ("r", "d")):
        own, sglang = (
            commands[key],
            worker_command(twin, CONFIGS[twin], "cuda", args, 20, 1000, tmp_path / "r.json", 240),
        )
        assert "--own" in own and "--own" not in sglang
        assert own[own.index("--attention") + 1] == sglang[sglang.index("--attention") + 1]
        assert {"--graphs", "--plugin", "--breakdown"} <= set(own)
        assert own[own.index("--stream-calls") + 1] == sglang[sglang.index("--stream-calls") + 1]
        assert worker_environ(CONFIGS[key]) == worker_environ(CONFIGS[twin])
    assert "--own" not in commands["c"] and commands["o"][commands["o"].index("--attention") + 1] == "triton_attn"
    assert all(skip_reason(CONFIGS[key], "cpu") and not skip_reason(CONFIGS[key], "cuda") for key in "or")


def _breakdown(gemm: float, attention: float, other: float, kernels: float) -> dict:
    classes = {"gemm": gemm, "attention": attention, "norm": 0.1, "rotary": 0.05, "memory": 0.02, "other": other}
    return {**classes, "total": sum(classes.values()), "kernels": kernels}


def test_tables_set_sglangs_tower_under_the_plugin_against_rocm_vits_own() -> None:
    def with_breakdown(row: dict, breakdown: dict) -> dict:
        return {**row, "breakdown": breakdown}

    c_rows = [_row("1x224", 3.72, 6.0, True), _row("1x512", 4.2, 5.0, True)]
    o_rows = [_row("1x224", 1.82, 3.0, True), _row("1x512", 4.0, 5.0, True)]
    report = {**_report(), "configs": {}}
    report["configs"]["c"] = _result("rocm-vit", [with_breakdown(c_rows[0], _breakdown(1.2, 0.3, 0.9, 690))])
    report["configs"]["c"]["layouts"]["rows"].append(c_rows[1])
    report["configs"]["o"] = _result(
        "rocm-vit's own tower", [with_breakdown(o_rows[0], _breakdown(1.0, 0.3, 0.1, 300))]
    )
    report["configs"]["o"]["layouts"]["rows"].append(o_rows[1])
    report["configs"]["r"] = {"label": "rocm-vit's own tower, ROCm decisions", "skipped": "needs a GPU"}
    text = "\n".join(format_report(report))
    header = next(line for line in text.splitlines() if line.startswith("layout"))
    assert "c/o" in header and "o/b" not in header and "d/r" not in header  # no b, and r did not run
    assert "2.044" in text and "1.050" in text  # c / o on warm medians
    assert "c slower than o on 1x224: 3.72 vs 1.82 ms" in text and "slower than o on 1x512" not in text
    assert 4.2 / 4.0 <= OWN_LIMIT < 3.72 / 1.82
    breakdown = [line.strip() for line in text.split("kernel time per forward")[1].splitlines()]
    difference = next(line for line in breakdown if line.startswith("1x224 c-o"))
    # c less o: 1.0 ms more in all (0.2 GEMMs, 0.8 other), 390 kernels more.
    assert difference.split()[2:4] == ["1.000", "390"] and "0.800 (80%)" in difference
    assert any(line.startswith("1x224 o ") for line in breakdown) and not any("1x512" in line for line in breakdown)


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        # SGLang's eager and graph forwards on CUDA: its Triton attention (context_attention_fwd) ...
        ("_fwd_kernel", "attention"),
        # ... its LayerNorm modules, residual adds and GELU (torch's own kernels) ...
        ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, true>", "norm"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, "
         "std::array<char*, 3ul> >", "other"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
         "at::native::GeluType)::{lambda()#3}::operator()() const", "other"),
        # ... the rotary SGLang compiles with Inductor (rotate-half: a cat of a negation), rocm-vit's ...
        ("triton_poi_fused__to_copy_add_cat_mul_neg_slice_0", "rotary"),
        ("_rotary_kernel", "rotary"),
        ("triton_poi_fused_add_mul_0", "other"),
        # ... and its copies: the merger's cat, host offsets to the device, dtype casts.
        ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous namespace)::"
         "OpaqueType<2u>, unsigned int, 2, 128, 1>", "memory"),
        ("Memcpy HtoD (Pageable -> Device)", "memory"),
        ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda("
         "at::TensorIteratorBase&)", "memory"),
    ],
)  # fmt: skip
def test_sglangs_kernel_names_land_in_their_classes(name: str, kind: str) -> None:
    from rocm_vit.cli.breakdown import kernel_class

    assert kernel_class(name) == kind


@pytest.mark.slow
def test_own_tower_on_a_cpu_runs_sglangs_kernel_on_sglangs_weights_and_equals_its_eager_forward(tmp_path: Path) -> None:
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.update(TORCHDYNAMO_DISABLE="1", TRITON_INTERPRET="1")  # SGLang's Triton kernel on this CPU
    out = tmp_path / "o.json"
    command = [sys.executable, "-m", "rocm_vit.cli.bench_sglang_worker", "--config", "o", "--own", "--out", str(out)]
    command += ["--preset", "tiny", "--device", "cpu", "--dtype", "float32", "--attention", "triton_attn"]
    command += ["--layouts", "1x64,2x96", "--warm", "1", "--path", str(SUPPORT)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    report = json.loads(out.read_text())
    assert done.returncode == 0 and "error" not in report, report.get("traceback", done.stderr[-4000:])
    assert report["backend"] == "sglang_triton_attn" and report["runner"] == "none (eager)"
    rows = report["layouts"]["rows"]
    assert [row["layout"] for row in rows] == ["1x64", "2x96"]
    # The same weights and kernel: SGLang's tower and rocm-vit's agree to fp32 rounding.
    assert all(row["max_difference_from_sglang_eager"] <= 1e-5 for row in rows), rows


def test_plot_draws_each_configuration_that_timed_layouts_by_patches() -> None:
    report = _report()
    report["configs"]["c"]["layouts"]["rows"].reverse()  # drawn by patches, whatever the order run
    series = bench_sglang.plot_series(report)
    # d failed to import: nothing to draw for it.
    assert list(series) == ["a: SGLang eager", "b: SGLang graphs", "c: rocm-vit"]
    assert series["c: rocm-vit"] == [(196, 2.02), (1024, 4.2)]


def test_a_saved_report_is_reported_again_without_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    saved = tmp_path / "report.json"
    saved.write_text(json.dumps(_report()))
    monkeypatch.setattr(bench_sglang, "_run_worker", lambda *a, **k: pytest.fail("--from-json ran a worker"))
    parser = argparse.ArgumentParser()
    bench_sglang.add_arguments(parser)
    status = bench_sglang.run(parser.parse_args(["--from-json", str(saved)]))
    assert status == 1  # d failed in the saved run, as it did then
    assert "c slower than b on 1x512: 4.20 vs 4.00 ms" in capsys.readouterr().out


def test_a_saved_report_is_reported_and_plotted_for_the_configurations_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    saved = tmp_path / "report.json"
    saved.write_text(json.dumps(_report()))
    drawn = []
    monkeypatch.setattr(bench_sglang, "plot_report", lambda report, path: drawn.append(list(report["configs"])) or True)
    parser = argparse.ArgumentParser()
    bench_sglang.add_arguments(parser)
    args = ["--from-json", str(saved), "--configs", "ca", "--plot", str(tmp_path / "plot.png")]
    assert bench_sglang.run(parser.parse_args(args)) == 0  # d, which failed, is left out
    assert drawn == [["c", "a"]]
    out = capsys.readouterr().out
    assert "  c: rocm-vit" in out and "  a: SGLang eager" in out and "b: SGLang graphs" not in out
    assert bench_sglang.run(parser.parse_args(["--from-json", str(saved), "--configs", "cx"])) == 2
    assert "holds no configuration ['x'] (it has abcd)" in capsys.readouterr().err


def test_streams_stopped_at_different_calls_are_also_compared_over_the_calls_all_served() -> None:
    report = _report()
    for key, times in (("a", [10.0, 20.0, 30.0]), ("b", [1.0, 2.0, 3.0, 400.0]), ("c", [5.0, 5.0, 5.0, 5.0, 5.0])):
        report["configs"][key]["stream"]["times_ms"] = times
    streamed = {key: result for key, result in report["configs"].items() if "stream" in result}
    assert bench_sglang.common_calls_lines(streamed) == [
        "  over the first 3 calls, which every configuration served (mean / p90 ms): "
        "a 20.00 / 30.00, b 2.00 / 3.00, c 5.00 / 5.00"
    ]
    report["configs"]["b"]["stream"]["times_ms"] = [1.0, 2.0, 3.0]
    report["configs"]["c"]["stream"]["times_ms"] = [5.0, 5.0, 5.0]
    assert bench_sglang.common_calls_lines(streamed) == []  # every stream served every call
    del report["configs"]["a"]["stream"]["times_ms"]  # a report saved before the times were kept
    assert bench_sglang.common_calls_lines(streamed) == []


def test_host_time_of_warm_calls_is_listed_per_layout_for_each_configuration_that_has_it() -> None:
    report = _report()
    rows = {key: report["configs"][key]["layouts"]["rows"] for key in "abc"}
    rows["a"][0]["warm_host_ms"], rows["c"][0]["warm_host_ms"], rows["c"][1]["warm_host_ms"] = 4.5, 0.25, 0.5
    ran = {key: report["configs"][key] for key in "abc"}
    assert bench_sglang.host_lines(ran) == [
        "",
        "Host ms until a warm call returned (median):",
        "  1x224: a 4.50, c 0.25",
        "  1x512: c 0.50",
    ]
    for key_rows in rows.values():
        for row in key_rows:
            row.pop("warm_host_ms", None)
    assert bench_sglang.host_lines(ran) == []  # a report saved before host times were kept
