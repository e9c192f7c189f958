"""Commit a folder to a fresh git repository, for the tests of which commit rocm-vit reports."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def commit_all(repository: Path) -> str:
    """``git init`` + one commit of everything in ``repository``; the commit's full hash."""
    for arguments in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "test tree"]):
        _git(repository, *arguments)
    return _git(repository, "rev-parse", "HEAD")


def _git(repository: Path, *arguments: str) -> str:
    # The user's own git configuration (signing, hooks, identity) must not change what a test sees.
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    identity = ["-c", "user.name=rocm-vit tests", "-c", "user.email=tests@rocm-vit.invalid"]
    done = subprocess.run(
        ["git", *identity, *arguments], cwd=repository, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"git {' '.join(arguments)}: {done.stderr}"
    return done.stdout.strip()
