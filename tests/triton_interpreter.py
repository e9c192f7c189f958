"""Run a Triton kernel test under ``TRITON_INTERPRET=1`` in a child process.

Why a child: ``triton.jit`` chooses interpreter or compiler when the kernel module is imported, so
setting the variable in the pytest process would come too late once anything imported the kernel,
and would leak into GPU tests collected in the same session. The child loads the cases saved in
``in.pt``, runs them and saves what it computed in ``out.pt``; the tests compare in the parent.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]


def run_interpreted(script: str, cases: dict, workdir: Path, env_overrides: dict[str, str | None]) -> dict:
    """Save ``cases``, run ``script in.pt out.pt`` interpreted, return the loaded ``out.pt``.

    ``env_overrides`` sets variables for the child; a ``None`` value removes one.
    """
    torch.save(cases, workdir / "in.pt")
    run_in_child(
        ["-c", script, str(workdir / "in.pt"), str(workdir / "out.pt")],
        {"TRITON_INTERPRET": "1", **env_overrides},
        "interpreter run",
        timeout=300,
    )
    return torch.load(workdir / "out.pt")


def run_in_child(args: list[str], env_overrides: dict[str, str | None], what: str, timeout: int) -> None:
    """``python args`` in the repository root with it on ``PYTHONPATH``; fails the test with its stderr.

    ``env_overrides`` sets variables for the child; a ``None`` value removes one.
    """
    env = dict(os.environ)
    for name, value in env_overrides.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    completed = subprocess.run(
        [sys.executable, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    if completed.returncode != 0:
        pytest.fail(f"{what} failed:\n{completed.stderr[-4000:]}")
