"""Which commit reports name: the stamp first, else git only where the package's tree is the repository root.

Each case copies ``rocm_vit/`` and ``pyproject.toml`` somewhere, arranges git around the copy, and asks a
child Python with ``PYTHONPATH`` on the copy (as on a device that runs a copied checkout). The wheel's
stamp itself is checked by tests/test_wheel.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from git_tree import commit_all

from rocm_vit.version import NOT_STAMPED

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")

_PROBE = """
import json, rocm_vit, rocm_vit.version
print(json.dumps({"package": rocm_vit.__file__, "commit": rocm_vit.version.build_commit()}))
"""


def test_checkout_at_a_repository_root_reports_its_head(tmp_path: Path) -> None:
    checkout = _copy_checkout(tmp_path / "rocm-vit")
    head = commit_all(checkout)
    assert _reported_commit(checkout) == head


def test_checkout_with_a_changed_tracked_file_reports_dirty(tmp_path: Path) -> None:
    checkout = _copy_checkout(tmp_path / "rocm-vit")
    head = commit_all(checkout)
    (checkout / "notes.txt").write_text("untracked files do not count\n")
    assert _reported_commit(checkout) == head
    with (checkout / "rocm_vit" / "layout.py").open("a") as layout:
        layout.write("# changed after the commit\n")
    assert _reported_commit(checkout) == f"{head}-dirty"


def test_copy_inside_another_repository_does_not_report_that_head(tmp_path: Path) -> None:
    outer = tmp_path / "other-project"
    outer.mkdir()
    (outer / "README.md").write_text("another project\n")
    checkout = _copy_checkout(outer / "vendor" / "rocm-vit")
    outer_head = commit_all(outer)  # the copy is tracked by the outer repository
    reported = _reported_commit(checkout)
    assert outer_head not in reported
    assert reported == NOT_STAMPED


def test_package_at_the_root_of_another_project_is_not_stamped_from_its_git(tmp_path: Path) -> None:
    other = _copy_checkout(tmp_path / "other-project")
    (other / "pyproject.toml").write_text('[project]\nname = "other-project"\nversion = "1.0"\n')
    commit_all(other)
    assert _reported_commit(other) == NOT_STAMPED


def test_copy_without_git_reports_not_stamped(tmp_path: Path) -> None:
    checkout = _copy_checkout(tmp_path / "rocm-vit")
    assert _reported_commit(checkout) == NOT_STAMPED


def test_git_dir_in_the_environment_does_not_redirect_the_question(tmp_path: Path) -> None:
    outer = tmp_path / "other-project"
    outer.mkdir()
    (outer / "README.md").write_text("another project\n")
    commit_all(outer)
    checkout = _copy_checkout(tmp_path / "rocm-vit")
    assert _reported_commit(checkout, GIT_DIR=str(outer / ".git")) == NOT_STAMPED


def test_stamp_outranks_git(tmp_path: Path) -> None:
    checkout = _copy_checkout(tmp_path / "rocm-vit")
    commit_all(checkout)
    (checkout / "rocm_vit" / "_build.py").write_text('COMMIT = "0123abcd-stamped"\n')
    assert _reported_commit(checkout) == "0123abcd-stamped"


def _copy_checkout(destination: Path) -> Path:
    """``rocm_vit/`` (without bytecode or a stamp) and ``pyproject.toml`` of this checkout under ``destination``."""
    destination.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "_build.py")
    shutil.copytree(ROOT / "rocm_vit", destination / "rocm_vit", ignore=ignore)
    shutil.copy2(ROOT / "pyproject.toml", destination / "pyproject.toml")
    return destination


def _reported_commit(checkout: Path, **env_overrides: str) -> str:
    """``build_commit()`` as a child Python with ``PYTHONPATH`` on ``checkout`` reports it."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("GIT_")}
    env.update(PYTHONPATH=str(checkout), **env_overrides)
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=checkout, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    reported = json.loads(done.stdout)
    assert Path(reported["package"]).resolve().parent == (checkout / "rocm_vit").resolve()
    return reported["commit"]
