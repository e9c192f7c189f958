"""ci/common.sh's install_sglang_wheelhouse: what it asks pip to do for a given wheelhouse.

The function runs under a stand-in ``$PY`` whose ``-m pip`` records its arguments and succeeds;
every other use runs a real interpreter: the base Python of this venv (no SGLang, but pip) or this
venv's (SGLang installed). The wheels are empty files: only their names are read before pip.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WHEELS = (
    "sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl",
    "rocm_vit_absent_probe-1.0-py3-none-any.whl",  # installed nowhere
    "pip-1.0-py3-none-any.whl",  # the interpreter has a newer pip: not installed over it
    "torch-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl",
    "triton-3.6.0-cp312-cp312-manylinux_2_28_x86_64.whl",
    "sglang_kernel-0.4.10-cp312-abi3-manylinux2014_x86_64.whl",
    "nvidia_cublas-13.0.0-py3-none-manylinux_2_27_x86_64.whl",
)


def _base_python() -> str:
    """An interpreter without SGLang: the one this venv was made from."""
    base = getattr(sys, "_base_executable", "")
    if sys.prefix == sys.base_prefix or not Path(base).exists():
        pytest.skip("the tests run outside a venv: no interpreter without this one's SGLang at hand")
    return base


def _install(tmp_path: Path, python: str, wheelhouse: Path | None) -> tuple[subprocess.CompletedProcess, list[str]]:
    log = tmp_path / "pip.log"
    fake = tmp_path / "python"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        f'if [ "$1" = -m ] && [ "$2" = pip ]; then shift 2; printf "%s\\n" "$@" >>{log}; exit 0; fi\n'
        f'exec {python} "$@"\n'
    )
    fake.chmod(0o755)
    env = {key: value for key, value in os.environ.items() if key != "SGLANG_WHEELHOUSE"}
    if wheelhouse is not None:
        env["SGLANG_WHEELHOUSE"] = str(wheelhouse)
    done = subprocess.run(
        ["bash", "-c", f"source ci/common.sh && PY={fake} && install_sglang_wheelhouse"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done, log.read_text().splitlines() if log.exists() else []


def _wheelhouse(tmp_path: Path, names: tuple[str, ...] = WHEELS) -> Path:
    directory = tmp_path / "wheels"
    directory.mkdir()
    for name in names:
        (directory / name).touch()
    return directory


def test_installs_only_what_the_interpreter_lacks_offline_without_dependencies(tmp_path: Path) -> None:
    wheelhouse = _wheelhouse(tmp_path)
    done, pip_args = _install(tmp_path, _base_python(), wheelhouse)
    assert done.returncode == 0, done.stderr
    assert pip_args == [
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--no-index",
        "--no-deps",
        str(wheelhouse / WHEELS[1]),  # sorted by file name
        str(wheelhouse / WHEELS[0]),
    ]
    assert "installing 2 wheels" in done.stdout


def test_installs_over_an_older_version_of_what_the_interpreter_has(tmp_path: Path) -> None:
    newer_pip = "pip-999.0-py3-none-any.whl"
    wheelhouse = _wheelhouse(tmp_path, (*WHEELS, newer_pip))
    done, pip_args = _install(tmp_path, _base_python(), wheelhouse)
    assert done.returncode == 0, done.stderr
    assert pip_args[5:] == [str(wheelhouse / name) for name in (newer_pip, WHEELS[1], WHEELS[0])]


def test_leaves_an_interpreter_that_has_sglang_alone(tmp_path: Path) -> None:
    done, pip_args = _install(tmp_path, sys.executable, _wheelhouse(tmp_path))
    assert done.returncode == 0, done.stderr
    assert pip_args == [] and "has it already" in done.stdout


def test_does_nothing_without_a_wheelhouse(tmp_path: Path) -> None:
    done, pip_args = _install(tmp_path, _base_python(), None)
    assert (done.returncode, pip_args, done.stdout) == (0, [], "")


@pytest.mark.parametrize("case", ["missing directory", "no sglang wheel"])
def test_fails_saying_why_for_a_wheelhouse_it_cannot_use(tmp_path: Path, case: str) -> None:
    wheelhouse = tmp_path / "absent" if case == "missing directory" else _wheelhouse(tmp_path, WHEELS[1:])
    done, pip_args = _install(tmp_path, _base_python(), wheelhouse)
    assert done.returncode != 0 and pip_args == []
    assert ("is not a directory" if case == "missing directory" else "holds no sglang wheel") in done.stderr
