"""The wheel: build it, install it into a fresh venv without network, import it from outside the checkout.

Catches what an editable install or a checkout on PYTHONPATH hides: a package missing from
pyproject's list, ``backends/`` not shipped as ``rocm_vit.backends``, presets.yaml left out, no
console script, the commit not stamped into the wheel (``build_stamp.py``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest
from git_tree import commit_all

pytest.importorskip("build")

ROOT = Path(__file__).resolve().parents[1]
# What the build reads; copying only these keeps stale build/ output and caches out of the wheel.
SOURCES = (
    "pyproject.toml",
    "README.md",
    "LICENSE",
    "MANIFEST.in",
    "setup.cfg",
    "build_stamp.py",
    "rocm_vit",
    "backends",
)
GIT = shutil.which("git")
needs_git = pytest.mark.skipif(GIT is None, reason="git is not installed: the build stamps 'unknown'")

_PROBE = """
import importlib.resources, json, sys
import rocm_vit, rocm_vit.backends, rocm_vit.backends.sdpa, rocm_vit.cli.main, rocm_vit.models
print(json.dumps({
    "rocm_vit": rocm_vit.__file__,
    "backends": rocm_vit.backends.__file__,
    "sdpa": rocm_vit.backends.sdpa.__file__,
    "presets": importlib.resources.files("rocm_vit").joinpath("presets.yaml").is_file(),
    "presets_list": rocm_vit.models.preset_names(),
}))
"""

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the build reads, committed to a fresh git repository where git is installed."""
    return _committed_sources(tmp_path_factory.mktemp("source"))


@pytest.fixture(scope="module")
def wheel(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    _build(source, dist, "--wheel")
    (built,) = dist.glob("rocm_vit-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding the wheel; torch and pyyaml come from this interpreter's environment."""
    env_dir = tmp_path_factory.mktemp("wheel-venv")
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    # --system-site-packages reaches the base interpreter only; when the tests run inside a venv
    # (make test) its site-packages hold torch, so append them after the new venv's own, and every
    # site directory this interpreter sees through its own .pth files (a venv made over another
    # venv, as ci/venv.sh makes over an image's or an activated venv's python, finds torch there).
    outer = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    outer |= {entry for entry in sys.path if Path(entry).name in ("site-packages", "dist-packages")}
    site_packages = Path(
        _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    )
    (site_packages / "outer-environment.pth").write_text("\n".join(sorted(outer)) + "\n")
    done = _run(
        [python, "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", "--quiet", wheel],
        cwd=env_dir,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return env_dir


def test_wheel_holds_only_the_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names}
    assert len(top_level) == 2 and "rocm_vit" in top_level
    assert (top_level - {"rocm_vit"}).pop().endswith(".dist-info")
    assert "rocm_vit/presets.yaml" in names
    assert "rocm_vit/backends/sdpa.py" in names


def test_wheel_and_sdist_ship_the_license(wheel: Path, tmp_path: Path) -> None:
    """pyproject says Apache-2.0: the license text travels with every distribution."""
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License") and "Version 2.0" in text
    with zipfile.ZipFile(wheel) as archive:
        licenses = [name for name in archive.namelist() if re.fullmatch(r"[^/]+\.dist-info/(licenses/)?LICENSE", name)]
        assert [archive.read(name).decode() for name in licenses] == [text]
    source = _committed_sources(tmp_path / "source")
    _build(source, tmp_path / "dist", "--sdist")
    (sdist,) = (tmp_path / "dist").glob("rocm_vit-*.tar.gz")
    with tarfile.open(sdist) as archive:
        (member,) = (name for name in archive.getnames() if name.count("/") == 1 and name.endswith("/LICENSE"))
        assert archive.extractfile(member).read().decode() == text


def test_wheel_ships_every_source_package(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = _wheel_paths_of_packages(ROOT / "rocm_vit", "rocm_vit") | _wheel_paths_of_packages(
        ROOT / "backends", "rocm_vit/backends"
    )
    missing = sorted(path for path in expected if path not in names)
    assert not missing, f"missing from the wheel (list the package in pyproject's [tool.setuptools]): {missing}"


def test_wheel_registers_the_sglang_plugin_entry_point(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        (entry_points,) = (name for name in archive.namelist() if name.endswith(".dist-info/entry_points.txt"))
        text = archive.read(entry_points).decode()
    assert "[sglang.srt.plugins]\nrocm_vit = rocm_vit.integrations.sglang:load" in text


def test_installed_wheel_imports_backends_from_the_new_venv(installed: Path, tmp_path: Path) -> None:
    done = _run([installed / "bin" / "python", "-c", _PROBE], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    package_dir = Path(found["rocm_vit"]).resolve().parent
    assert package_dir.is_relative_to(installed.resolve()), f"rocm_vit imported from {package_dir}, not the new venv"
    assert Path(found["backends"]).resolve().parent == package_dir / "backends"
    assert Path(found["sdpa"]).resolve() == package_dir / "backends" / "sdpa.py"
    assert found["presets"] is True
    assert "tiny" in found["presets_list"]


def test_installed_wheel_has_the_console_script(installed: Path, tmp_path: Path) -> None:
    script = installed / "bin" / "rocm-vit"
    assert script.is_file()
    done = _run([script, "doctor", "--json"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["problems"] == []


@needs_git
def test_wheel_is_stamped_with_the_commit_it_was_built_from(wheel: Path, source: Path) -> None:
    stamp = zipfile.ZipFile(wheel).read("rocm_vit/_build.py").decode()
    assert _stamped_commit(stamp) == _head(source)


@needs_git
def test_installed_wheel_reports_its_version_and_commit(installed: Path, source: Path, tmp_path: Path) -> None:
    probe = "import json, rocm_vit.version; print(json.dumps(rocm_vit.version.build_info()))"
    done = _run([installed / "bin" / "python", "-c", probe], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (dist_info,) = next(installed.glob("lib/python*/site-packages")).glob("rocm_vit-*.dist-info")
    assert json.loads(done.stdout) == {
        "rocm_vit": dist_info.name.removeprefix("rocm_vit-").removesuffix(".dist-info"),
        "commit": _head(source),
    }
    doctor = _run([installed / "bin" / "rocm-vit", "doctor", "--json"], cwd=tmp_path)
    assert doctor.returncode == 0, doctor.stderr
    assert json.loads(doctor.stdout)["rocm_vit"]["commit"] == _head(source)


@needs_git
def test_wheel_built_through_the_sdist_keeps_the_stamp(tmp_path: Path) -> None:
    """``python -m build`` builds the sdist, then the wheel from the unpacked sdist, where there is no git."""
    source = _committed_sources(tmp_path / "source")
    _build(source, tmp_path / "dist")
    (sdist,) = (tmp_path / "dist").glob("rocm_vit-*.tar.gz")
    (wheel,) = (tmp_path / "dist").glob("rocm_vit-*.whl")
    with tarfile.open(sdist) as archive:
        (member,) = (name for name in archive.getnames() if name.endswith("/rocm_vit/_build.py"))
        sdist_stamp = archive.extractfile(member).read().decode()
    assert _stamped_commit(sdist_stamp) == _head(source)
    assert _stamped_commit(zipfile.ZipFile(wheel).read("rocm_vit/_build.py").decode()) == _head(source)


def _committed_sources(source: Path) -> Path:
    """SOURCES copied into ``source`` (no stale build/ output, caches or stamp), then committed where git is."""
    source.mkdir(parents=True, exist_ok=True)
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "_build.py")
            shutil.copytree(path, source / name, ignore=ignore)
        elif path.is_file():
            shutil.copy2(path, source / name)
    if GIT is not None:
        commit_all(source)
    return source


def _build(source: Path, dist: Path, *only: str) -> None:
    """``python -m build`` of ``source`` into ``dist``; ``only`` is ``--wheel`` or ``--sdist`` (default: both)."""
    # --skip-dependency-check: recent setuptools builds wheels without the `wheel` package listed in
    # build-system.requires; a missing setuptools still fails the build loudly.
    command = [sys.executable, "-m", "build", *only, "--no-isolation", "--skip-dependency-check", "--outdir", dist]
    done = _run([*command, source], cwd=source)
    assert done.returncode == 0, done.stdout + done.stderr


def _head(source: Path) -> str:
    done = _run(["git", "rev-parse", "HEAD"], cwd=source)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _stamped_commit(stamp: str) -> str:
    """The value of ``COMMIT`` in a ``rocm_vit/_build.py``."""
    namespace: dict = {}
    exec(stamp, namespace)
    return namespace["COMMIT"]


def _wheel_paths_of_packages(source: Path, prefix: str) -> set[str]:
    """``<prefix>/<sub>/__init__.py`` for every package under ``source``, as the wheel must hold them."""
    return {f"{prefix}/{init.relative_to(source).as_posix()}" for init in source.rglob("__init__.py")}


def _run(command: list, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    # No PYTHONPATH: the checkout must not leak into what the new venv imports.
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    return subprocess.run(
        [str(part) for part in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
