"""The rocm-vit version and the commit it was built from, named by every report (bench, doctor).

``build_commit()``: the stamp written into built packages, else git at a checkout's root (``-dirty``
when tracked files differ). Standard library only: the build step loads this module by path.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import re
import subprocess
from pathlib import Path

__version__ = "0.1.0"

NOT_STAMPED = "unknown (not stamped)"

# import name -> distributions providing it, preferred first: the versions that key a tuned profile.
KEYED_DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "torch": ("torch",),
    "triton": ("triton", "pytorch-triton-rocm", "pytorch-triton"),
    "aiter": ("amd-aiter", "aiter"),
    "flash_attn_4": ("flash-attn-4",),
}

# Environment variables that would point git at another repository than the one asked about.
_GIT_REDIRECTS = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_COMMON_DIR")


def build_info() -> dict[str, str]:
    """``{"rocm_vit": version, "commit": build commit}``: what every JSON report starts with."""
    return {"rocm_vit": __version__, "commit": build_commit()}


@functools.cache
def build_commit() -> str:
    """The commit this rocm-vit was built from, by the rule in the module docstring."""
    try:
        from rocm_vit._build import COMMIT
    except ImportError:
        return checkout_commit(Path(__file__).resolve().parents[1]) or NOT_STAMPED
    return COMMIT


def checkout_commit(root: Path) -> str | None:
    """``git rev-parse HEAD`` (plus ``-dirty``) of ``root`` if it is a rocm-vit checkout's root, else None."""
    root = root.resolve()
    if not _names_rocm_vit(root / "pyproject.toml"):
        return None
    toplevel = _git(root, "rev-parse", "--show-toplevel")
    if toplevel is None or Path(toplevel).resolve() != root:
        return None
    head = _git(root, "rev-parse", "--verify", "HEAD")
    changes = _git(root, "status", "--porcelain", "--untracked-files=no")
    if head is None or changes is None:
        return None
    return f"{head}-dirty" if changes else head


def installed_distribution(distributions: tuple[str, ...]) -> tuple[str, str] | None:
    """``(distribution, version)`` of the first of ``distributions`` installed, from its metadata."""
    for distribution in distributions:
        try:
            return distribution, importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _names_rocm_vit(pyproject: Path) -> bool:
    """Whether ``pyproject``'s ``[project]`` table says ``name = "rocm-vit"`` (no tomllib on Python 3.10)."""
    try:
        text = pyproject.read_text(encoding="utf-8")
    except OSError:
        return False
    project = re.search(r"^\[project\][ \t]*$(.*?)(?=^\[|\Z)", text, re.MULTILINE | re.DOTALL)
    return bool(project and re.search(r"^name\s*=\s*[\"']rocm-vit[\"']\s*$", project.group(1), re.MULTILINE))


def _git(cwd: Path, *arguments: str) -> str | None:
    """Stripped stdout of ``git <arguments>`` run in ``cwd``, or None when it cannot run or fails."""
    env = {key: value for key, value in os.environ.items() if key not in _GIT_REDIRECTS}
    # No index refresh written back: the tree may be read-only, or another git command may hold the lock.
    env["GIT_OPTIONAL_LOCKS"] = "0"
    try:
        done = subprocess.run(
            ["git", *arguments], cwd=cwd, env=env, capture_output=True, text=True, timeout=30, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()
