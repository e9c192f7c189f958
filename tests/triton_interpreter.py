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
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    for name, value in env_overrides.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    completed = subprocess.run(
        [sys.executable, "-c", script, str(workdir / "in.pt"), str(workdir / "out.pt")],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if completed.returncode != 0:
        pytest.fail(f"interpreter run failed:\n{completed.stderr[-4000:]}")
    return torch.load(workdir / "out.pt")
