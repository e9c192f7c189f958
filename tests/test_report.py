"""``rocm-vit report``: every section and heading on a CPU, each hazard check able to report what it
is there to find (fed a stand-in that misbehaves), a part that crashes or hangs reported while the
rest still runs, and (GPU tier) every hazard check passing on the GPU at hand."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rocm_vit.cli.main import main
from rocm_vit.emulation import aiter_standin
from rocm_vit.graphs.cost import CostModel
from rocm_vit.models import preset
from rocm_vit.platform import PlatformInfo
from rocm_vit.report import collect as collect_module
from rocm_vit.report.collect import SECTIONS, collect, exit_status
from rocm_vit.report.hazards import (
    HAZARD_FOUND,
    HAZARDS,
    NOT_APPLICABLE,
    OK,
    SKIPPED,
    Reading,
    check_aiter_kernels,
    check_capture_errors,
    check_graph_equals_eager,
    check_host_copy_offsets,
)
from rocm_vit.report.parts import FAILED, TIMED_OUT, Part, PartResult, plan, run_part
from rocm_vit.report.probes import aiter_calls, aiter_install
from rocm_vit.report.render import HEADINGS, to_markdown

MI355X = PlatformInfo("rocm", "AMD Instinct MI355X", "gfx950", 1)


# The whole report on a CPU ------------------------------------------------------------------------


def test_quick_report_on_a_cpu_has_every_section_and_heading_and_writes_only_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["report", "--quick"]) == 0
    (folder,) = tmp_path.iterdir()  # the default folder, and nothing else
    assert folder.name.startswith("rocm-vit-report-")
    assert f"{folder}/report.md" in capsys.readouterr().out
    document = json.loads((folder / "report.json").read_text())
    assert set(document) >= {"report_format", "rocm_vit", "created", "options", "sections", "plots", "problems"}
    sections = document["sections"]
    assert tuple(sections) == SECTIONS
    assert document["problems"] == []
    assert sections["versions"]["data"]["platform"]["name"] == "cpu"
    assert sections["doctor"]["status"] == "ok"
    assert sections["doctor"]["data"]["policy"]["attention"]["backend"] == "sdpa"
    assert sections["bench"]["status"] == "ok"
    assert [row["layout"] for row in sections["bench"]["data"]["rows"]][:2] == ["1x64", "1x128"]
    assert sections["tune"] == {**sections["tune"], "status": "skipped", "detail": "not part of a --quick report"}
    for key in ("verify_inference", "verify_no_grad", "bench_attn"):
        assert (sections[key]["status"], sections[key]["detail"][:6]) == ("skipped", "no GPU")
    checks = sections["hazards"]["checks"]
    assert set(checks) == set(HAZARDS)
    assert checks["aiter_kernels"]["status"] == NOT_APPLICABLE
    assert all(checks[name]["status"] == SKIPPED for name in HAZARDS if name != "aiter_kernels")
    assert all(check["summary"] for check in checks.values())  # every check says what it found
    markdown = (folder / "report.md").read_text()
    for heading in HEADINGS.values():
        assert f"\n## {heading}\n" in markdown
    assert sorted(path.name for path in folder.iterdir()) == ["logs", "report.json", "report.md"]


def test_report_refuses_a_folder_that_is_not_empty(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "other.txt").write_text("mine")
    assert main(["report", "--quick", "--out", str(tmp_path)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert [path.name for path in tmp_path.iterdir()] == ["other.txt"]


# Each hazard check reports a failure --------------------------------------------------------------


@pytest.fixture
def no_real_aiter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "aiter", raising=False)
    monkeypatch.delenv("AITER_JIT_DIR", raising=False)


def _fake_aiter(root: Path, built: set[str]) -> Path:
    """An aiter package folder (never imported) whose jit folder holds ``built`` modules."""
    (root / "aiter" / "jit").mkdir(parents=True)
    (root / "aiter" / "__init__.py").write_text("raise RuntimeError('the report must not import aiter')\n")
    for module in built:
        (root / "aiter" / "jit" / f"{module}.so").write_bytes(b"")
    return root / "aiter" / "jit"


def test_aiter_check_names_the_module_a_jit_dir_lacks(tmp_path, monkeypatch, no_real_aiter) -> None:
    calls = aiter_calls(preset("qwen3-vl-8b"), MI355X.arch)
    modules = {call.module for call in calls}
    missing = "mha_varlen_fwd_bf16_nlogits_nbias_nmask_lse_ndropout_nskip_nqscale"
    assert missing in modules  # head dim 72: CK, with the LSE, as backends/aiter_attn.py calls it
    jit = _fake_aiter(tmp_path, modules - {missing})
    monkeypatch.syspath_prepend(str(tmp_path))
    verdict = check_aiter_kernels(calls, *aiter_install(MI355X))
    assert verdict.status == HAZARD_FOUND
    assert verdict.summary.startswith(f"would compile on first request: {missing} ")
    built = {row["module"]: row["built"] for row in verdict.details["calls"]}
    assert built[missing] is None
    assert built["module_fmha_v3_varlen_fwd"] == str(jit / "module_fmha_v3_varlen_fwd.so")  # pad128: assembly
    assert "aiter" not in sys.modules

    (jit / f"{missing}.so").write_bytes(b"")
    assert check_aiter_kernels(calls, *aiter_install(MI355X)).status == OK


def test_aiter_check_reads_aiter_jit_dir_and_modules_already_loaded(tmp_path, monkeypatch, no_real_aiter) -> None:
    calls = aiter_calls(preset("qwen3-vl-2b"), MI355X.arch)
    _fake_aiter(tmp_path / "site", set())
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    (tmp_path / "jit").mkdir()
    monkeypatch.setenv("AITER_JIT_DIR", str(tmp_path / "jit"))
    (tmp_path / "jit" / f"{calls[0].module}.so").write_bytes(b"")
    monkeypatch.setitem(sys.modules, calls[1].module, object())
    verdict = check_aiter_kernels(calls, *aiter_install(MI355X))
    assert verdict.status == OK
    assert [row["built"] for row in verdict.details["calls"]] == [
        str(tmp_path / "jit" / f"{calls[0].module}.so"),
        f"loaded in this process ({calls[1].module})",
    ]


def test_aiter_check_against_the_standins_table(no_real_aiter) -> None:
    aiter_standin.install()
    try:
        calls = aiter_calls(preset("qwen3-vl-8b"), "gfx950")
        aiter_standin.reset_builds()  # SGLang's ROCm image: everything rocm-vit loads is prebuilt
        verdict = check_aiter_kernels(calls, *aiter_install(MI355X))
        assert verdict.status == OK
        assert "stand-in" in verdict.details["install"]
        aiter_standin.reset_builds(prebuilt=frozenset({"module_fmha_v3_varlen_fwd"}))  # an image lacking CK
        verdict = check_aiter_kernels(calls, *aiter_install(MI355X))
        assert verdict.status == HAZARD_FOUND
        assert "mha_varlen_fwd_bf16_nlogits_nbias_nmask_lse" in verdict.summary
    finally:
        aiter_standin.reset_builds()
        sys.modules.pop("aiter", None)


def test_aiter_check_is_not_applicable_off_rocm_or_without_aiter(no_real_aiter) -> None:
    calls = aiter_calls(preset("tiny"), "sm_90")
    verdict = check_aiter_kernels(calls, *aiter_install(PlatformInfo("cuda", "NVIDIA H200", "sm_90", 1)))
    assert (verdict.status, verdict.summary) == (NOT_APPLICABLE, "aiter runs on ROCm only; this platform is cuda")
    verdict = check_aiter_kernels(calls, *aiter_install(MI355X))
    assert verdict.status == NOT_APPLICABLE
    assert verdict.summary.startswith("aiter is not installed")


def test_offsets_check_counts_stale_reads_after_host_copies() -> None:
    def stale_now_and_then(round_index: int) -> Reading:
        return Reading(offsets_current=round_index % 100 != 7, output_current=round_index % 50 != 7)

    verdict = check_host_copy_offsets(stale_now_and_then, rounds=300)
    assert verdict.status == HAZARD_FOUND
    assert verdict.details == {"rounds": 300, "stale_offsets": 3, "stale_outputs": 6, "first_stale_round": 7}
    assert "offsets in 3, attention output in 6 of 300 replays" in verdict.summary
    assert check_host_copy_offsets(lambda _: Reading(True, True), rounds=300).status == OK
    assert check_host_copy_offsets(None, rounds=300, why_not="no GPU").status == SKIPPED


def test_capture_error_check_reports_a_build_that_swallows_the_error() -> None:
    verdict = check_capture_errors(lambda: None, "tensor.item()")
    assert verdict.status == HAZARD_FOUND
    assert verdict.summary.startswith("swallowed: a capture around tensor.item() ended without an error")
    error = RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore")
    verdict = check_capture_errors(lambda: error, "tensor.item()")
    assert (verdict.status, verdict.details["raised"]) == (
        OK,
        "RuntimeError: CUDA error: operation not permitted when stream is capturing",
    )


def _encoder(flip_at_call: int | None):
    """Outputs per layout, the graph path flipping one bit of its ``flip_at_call``-th output."""
    graph_calls = 0

    def encode(index: int, use_graphs: bool) -> torch.Tensor:
        nonlocal graph_calls
        out = torch.randn(4, 8, generator=torch.Generator().manual_seed(index)).to(torch.bfloat16)
        if use_graphs:
            graph_calls += 1
            if graph_calls == flip_at_call:
                out.view(torch.int16)[2, 3] ^= 1  # the last bit of one element
        return out

    return encode


def _stats(**eager_runs: int):
    return lambda: {"captures": 6, "replays": 6, "eager_runs": {"capture_unverified": 0, **eager_runs}}


def test_graph_check_fails_on_one_bit_in_one_replay() -> None:
    layouts = [f"layout{i}" for i in range(6)]
    verdict = check_graph_equals_eager(_encoder(flip_at_call=9), layouts, _stats())
    assert verdict.status == HAZARD_FOUND
    assert verdict.details["mismatched"] == ["layout3"]  # the 9th graph call: layout 3, second visit
    assert verdict.summary == "1 of 12 runs differ from eager (first: layout3)"
    assert check_graph_equals_eager(_encoder(None), layouts, _stats()).status == OK


def test_graph_check_fails_when_the_runner_caught_a_capture_or_captured_nothing() -> None:
    layouts = ["a", "b"]
    verdict = check_graph_equals_eager(_encoder(None), layouts, _stats(capture_unverified=1, capture_failed=2))
    assert verdict.status == HAZARD_FOUND
    assert "1 captures replayed differently from eager" in verdict.summary
    assert "2 captures failed where eager worked" in verdict.summary
    verdict = check_graph_equals_eager(_encoder(None), layouts, lambda: {"captures": 0, "eager_runs": {}})
    assert verdict.summary == "no layout was captured, so graphs never ran"


# A part that fails is reported and the rest still runs -------------------------------------------


def test_a_crashing_part_is_reported_with_its_signal_and_stderr(tmp_path: Path) -> None:
    crash = "import os, sys; print('about to fail', file=sys.stderr, flush=True); os.abort()"
    result = run_part(Part("crash", "crash", ("-c", crash), timeout_s=60), tmp_path, on_gpu=False)
    assert result.status == FAILED
    assert result.detail.startswith("killed by signal 6, no result printed; stderr ends with:\nabout to fail")
    assert (tmp_path / result.logs["stderr"]).read_text().startswith("about to fail")


def test_a_hanging_part_is_stopped_at_its_time_limit(tmp_path: Path) -> None:
    """Stopped, not waited for: a part that outlived its limit never writes what it would at its end."""
    hang = "import pathlib, time; time.sleep(60); pathlib.Path('ended').touch()"
    result = run_part(Part("hang", "hang", ("-c", hang), timeout_s=1), tmp_path, False)
    assert (result.status, result.detail, result.exit_code) == (TIMED_OUT, "stopped after 1 s", None)
    assert not (tmp_path / "ended").exists()


def test_failures_and_hazards_reach_the_summary_the_markdown_and_the_exit_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU-shaped report with verify failing, graph_equals_eager finding a mismatch and hip#3902 found."""
    canned = _canned_gpu_results()
    monkeypatch.setattr(collect_module, "run_part", lambda part, folder, on_gpu: canned.get(part.key, PartResult("ok")))
    document = collect("qwen3-vl-8b", quick=False, folder=tmp_path)
    assert exit_status(document) == 1
    assert document["problems"] == [
        "verify_no_grad: failed: exit status 1",
        "hazard host_copy_offsets: stale after a host-to-device copy",
        "hazard graph_equals_eager (fails the report): 1 of 64 runs differ from eager (first: 1x224)",
        "graph_admission: 1 x 1080p per call: graphs slower than all-eager once warm (mean 1.030x, p90 1.030x)",
    ]
    markdown = to_markdown(document)
    assert "| second half | 7 / 2 | 20.00 / 20.00 | 18.00 / 18.00 | 0.900x / 0.900x | 90% | 13.6 |" in markdown
    assert "- chat, 1.3 MP cap: the oracle's saving lies 70% on repeats, 25% on first sightings, 0% on" in markdown
    assert "| host_copy_offsets | **HAZARD FOUND** | stale after a host-to-device copy |" in markdown
    assert "- no_grad: 23 of 24 runs exact on NVIDIA H200; captures 12" in markdown
    assert "**MISMATCH**: 1x448" in markdown
    # bench: 224 px (196 patches) replays under the 4096-patch ceiling, 2048x1600 (12800) runs eagerly
    # with what an eager call costs the host and the device; a count the profiler missed reads "-"
    assert (
        "| layout | patches | eager ms | graph ms | speedup | policy | pick fastest | host ms | device ms |" in markdown
    )
    assert "| 1x224 | 196 | 9.10 | **1.50** | 6.07x | graph | yes | 20.40 | 1.72 | 235 | 86.8 | exact |" in markdown
    assert (
        "| 1x2048x1600 | 12800 | **30.00** | 31.00 | 0.97x | eager | yes | 19.60 | 29.50 | - | - | exact |" in markdown
    )
    assert "| 1x1024 | 1024 | 0.200 | **0.100** | triton_attn | triton_attn |" in markdown
    assert "| hit rate (replays / calls) | 80.0% | >= 75% | yes |" in markdown

    canned["verify_no_grad"] = canned["verify_inference"]
    canned["hazard_graph_equals_eager"] = PartResult("ok", data={"status": OK, "summary": "equal", "details": {}})
    assert exit_status(collect("qwen3-vl-8b", quick=False, folder=tmp_path)) == 0  # upstream hazards do not fail
    del canned["hazard_capture_errors"]  # its process ended well but printed no verdict
    document = collect("qwen3-vl-8b", quick=False, folder=tmp_path)
    assert document["sections"]["hazards"]["checks"]["capture_errors"]["status"] == FAILED
    assert exit_status(document) == 1


def _canned_gpu_results() -> dict[str, PartResult]:
    verify_rows = [
        {"layout": f"1x{224 + 32 * i}", "patches": 196, "exact": True, "max_abs_diff": 0.0} for i in range(24)
    ]
    runner = {"captures": 12, "replays": 12, "evictions": 12, "eager_runs": {"capture_unverified": 0}}
    bad_rows = [dict(row, exact=row["layout"] != "1x448") for row in verify_rows]
    bench_runner = {
        "graphs": 2, "pool_bytes": 2**26, "staging_bytes": 2**25, "bytes_held": 3 * 2**25, "captures": 2,
        "capture_seconds": 0.5, "verify_seconds": 0.01,
    }  # fmt: skip
    return {
        "doctor": PartResult(
            "ok",
            data={
                "policy": {
                    "graph_runner": {"max_tokens": 8192},
                    "graph_cost": {**dataclasses.asdict(CostModel()), "why": "default"},
                }
            },
        ),
        "verify_inference": PartResult("ok", data={"device": "NVIDIA H200", "rows": verify_rows, "runner": runner}),
        "verify_no_grad": PartResult(
            "failed", 30.0, "exit status 1", {"device": "NVIDIA H200", "rows": bad_rows, "runner": runner}, 1
        ),
        "hazard_aiter_kernels": PartResult(
            "ok", data={"status": NOT_APPLICABLE, "summary": "ROCm only", "details": {}}
        ),
        "hazard_host_copy_offsets": PartResult(
            "ok", data={"status": HAZARD_FOUND, "summary": "stale after a host-to-device copy", "details": {}}
        ),
        "hazard_capture_errors": PartResult("ok", data={"status": OK, "summary": "reported", "details": {}}),
        "hazard_graph_equals_eager": PartResult(
            "ok",
            data={"status": HAZARD_FOUND, "summary": "1 of 64 runs differ from eager (first: 1x224)", "details": {}},
        ),
        "bench": PartResult(
            "ok",
            data={
                "preset": "qwen3-vl-8b",
                "dtype": "bfloat16",
                "attention_backend": "auto",
                "repeats": 10,
                "device": "NVIDIA H200",
                "peak_reserved_bytes": 2**30,
                "runner": bench_runner,
                "rows": [
                    {
                        "layout": "1x224",
                        "patches": 196,
                        "eager_ms": 9.1,
                        "host_ms": 20.4,
                        "device_ms": 1.72,
                        "kernels": 235,
                        "host_us_per_launch": 86.8,
                        "graph_ms": 1.5,
                        "speedup": 6.07,
                        "check": "exact",
                    },
                    {
                        "layout": "1x2048x1600",
                        "patches": 12800,
                        "eager_ms": 30.0,
                        "host_ms": 19.6,
                        "device_ms": 29.5,
                        "kernels": None,
                        "host_us_per_launch": None,
                        "graph_ms": 31.0,
                        "speedup": 0.97,
                        "check": "exact",
                    },
                ],
            },
        ),
        "bench_attn": PartResult(
            "ok",
            data={
                "device": "NVIDIA H200",
                "arch": "sm_90",
                "heads": 16,
                "results": [
                    {"head_dim": 72, "layout": "1x1024", "tokens": 1024, "backend": "sdpa", "ms": 0.2},
                    {"head_dim": 72, "layout": "1x1024", "tokens": 1024, "backend": "triton_attn", "ms": 0.1},
                ],
                "policy_picks": [{"layout": "1x1024", "picked": "triton_attn", "fastest": "triton_attn"}],
            },
        ),
        "graph_memory": PartResult(
            "ok",
            data={
                "budget_bytes": 2**31,
                "rows": [{"metric": "hit rate (replays / calls)", "value": "80.0%", "target": ">= 75%", "met": True}],
            },
        ),
        "graph_admission": PartResult(
            "ok",
            data={
                "streams": [
                    _admission_stream("chat, 1.3 MP cap", eager_ms=20.0, graphs_ms=25.0, warm_graphs_ms=18.0),
                    _admission_stream("1 x 1080p per call", eager_ms=33.0, graphs_ms=33.5, warm_graphs_ms=34.0),
                ]
            },
        ),
    }


def _admission_stream(name: str, eager_ms: float, graphs_ms: float, warm_graphs_ms: float) -> dict:
    """A stream of ``bench-traffic --mode tower --json``: the same mean and p90 in each summary."""

    def compared(graphs: float) -> dict:
        summary = lambda ms: {"mean_ms": ms, "p50_ms": ms, "p90_ms": ms}  # noqa: E731
        graphs_summary = {**summary(graphs), "replays": 7, "captures": 2}
        return {"eager": summary(eager_ms), "graphs": graphs_summary, "possible_saving_ms": 2.0, "share": 0.9}

    sightings = {"repeats": 0.7, "first sightings": 0.25, "repeats over the guard": 0.0,
                 "first sightings over the guard": 0.05}  # fmt: skip
    return {"stream": name, "calls": 400, **compared(graphs_ms), "second_half": compared(warm_graphs_ms),
            "launch_ms": 13.6, "oracle_by_sighting": sightings}  # fmt: skip


def test_a_hazard_check_runs_as_its_own_process_and_prints_one_verdict() -> None:
    """What ``rocm-vit report`` starts for each check (``rocm_vit.report.parts``); on a CPU the check
    says why it does not apply."""
    parts = plan("qwen3-vl-2b", quick=True, on_gpu=False, head_dim=64, heads=16, profile_out=None, plots=False)
    (check,) = [part for part in parts if part.key == "hazard_aiter_kernels"]
    done = subprocess.run([sys.executable, *check.argv], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] in (NOT_APPLICABLE, SKIPPED)


# On a GPU, natively and emulating ROCm: every check passes ----------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(HAZARDS))
def test_every_hazard_check_passes_on_this_gpu(name: str) -> None:
    """As ``rocm-vit report --quick`` runs it: in a process of its own (a capture error must not
    reach this one)."""
    done = subprocess.run(
        [sys.executable, "-m", "rocm_vit.cli.hazard_check", name, "--preset", "qwen3-vl-2b", "--quick"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    verdict = json.loads(done.stdout.strip().splitlines()[-1])
    assert verdict["status"] in (OK, NOT_APPLICABLE), verdict
