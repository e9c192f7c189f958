"""The rocm-vit command: doctor output, subcommand registration, entry points."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rocm_vit import __version__
from rocm_vit.cli import main as cli_main
from rocm_vit.cli.main import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
DOCTOR_SECTIONS = {
    "rocm_vit",
    "python",
    "platform",
    "versions",
    "attention",
    "rotary",
    "fused_ops",
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
    assert report["rocm_vit"] == __version__
    assert report["platform"]["name"] in {"cpu", "cuda", "rocm"}
    assert set(report["platform"]) == {"name", "device_name", "arch", "device_count"}
    versions = report["versions"]
    assert {"python", "torch", "torch_hip", "torch_cuda", "triton", "aiter", "sglang", "transformers"} <= set(versions)
    assert versions["python"] == ".".join(map(str, sys.version_info[:3]))
    assert versions["torch"] != "not installed"
    assert {"backend", "why", "known"} <= set(report["attention"])
    assert report["attention"]["backend"] in report["attention"]["known"]
    assert report["rotary"]["implementation"] in {"triton", "compiled", "native"}
    assert report["fused_ops"]["block_ops"] in {"fused", "plain"}
    assert report["settings"]["graph_cache_capacity"] == 32


def test_doctor_shows_sglang_and_rocm_vit_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SGLANG_VIT_CUDA_GRAPH_CACHE_CAPACITY", "5")
    monkeypatch.setenv("SGLANG_SOMETHING_ELSE", "x")
    monkeypatch.setenv("ROCM_VIT_ATTENTION_BACKEND", "sdpa")
    monkeypatch.setenv("UNRELATED_VARIABLE", "y")
    rc, report = _doctor_json(capsys)
    assert rc == 0
    assert report["environment"] == {
        "ROCM_VIT_ATTENTION_BACKEND": "sdpa",
        "SGLANG_SOMETHING_ELSE": "x",
        "SGLANG_VIT_CUDA_GRAPH_CACHE_CAPACITY": "5",
    }
    assert report["settings"]["graph_cache_capacity"] == 5
    assert (report["attention"]["backend"], report["attention"]["why"]) == ("sdpa", "set by ROCM_VIT_ATTENTION_BACKEND")


def test_doctor_reports_bad_settings_and_still_prints(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SGLANG_USE_AITER", "maybe")
    rc, report = _doctor_json(capsys)
    assert rc == 1
    assert "SGLANG_USE_AITER = 'maybe' is not a boolean" in report["settings"]["error"]
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
    assert out.startswith(f"rocm-vit {__version__}")
    for heading in ("platform:", "versions:", "attention:", "rotary:", "fused_ops:", "settings:", "environment:"):
        assert f"\n{heading}\n" in out
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

    from rocm_vit.cli.workload import build_tower
    from rocm_vit.models import Qwen3VLVisionTower, Qwen25VLVisionTower

    qwen3 = build_tower("tiny", torch.device("cpu"), torch.float32, "sdpa", seed=0)
    qwen25 = build_tower("qwen2.5-vl-tiny", torch.device("cpu"), torch.float32, "sdpa", seed=0)
    assert type(qwen3) is Qwen3VLVisionTower
    assert type(qwen25) is Qwen25VLVisionTower


def test_layouts_round_to_each_towers_merge_blocks() -> None:
    from rocm_vit.cli.workload import parse_layouts
    from rocm_vit.models import preset

    # 32 px merge blocks for Qwen3-VL (patch 16), 28 px for Qwen2.5-VL (patch 14).
    assert parse_layouts("1x448x224", preset("tiny"))[0].grid_thw == ((1, 28, 14),)
    assert parse_layouts("1x448x224,1x448f4", preset("qwen2.5-vl-tiny"))[1].grid_thw == ((2, 32, 32),)
    assert parse_layouts("1x448x224", preset("qwen2.5-vl-tiny"))[0].grid_thw == ((1, 32, 16),)


def test_bench_runs_a_qwen25_preset_on_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--preset", "qwen2.5-vl-tiny", "--layouts", "1x224,1x64+1x300x200", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "preset qwen2.5-vl-tiny" in out
    assert out.count("finite") == 2
