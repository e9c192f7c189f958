"""A test scenario script in a process of its own, for the tests that read its report.

SGLang's plugins patch SGLang for the life of a process, so each scenario starts without the caller's
SGLang and rocm-vit settings (all but those named), without a machine's tuned profile, and with this
checkout first on its path.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Collection, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def scenario_environ(passed: Collection[str] = (), **variables: str) -> dict[str, str]:
    """This process's environment for a scenario: ``SGLANG_*``/``ROCM_VIT_*`` dropped but ``passed``,
    ``ROCM_VIT_PROFILE=off``, then ``variables``."""
    env = {
        key: value for key, value in os.environ.items() if key in passed or not key.startswith(("SGLANG_", "ROCM_VIT_"))
    }
    env.update(ROCM_VIT_PROFILE="off", **variables)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def run_scenario(script: Path, out: Path, *args: str, env: Mapping[str, str], timeout: float) -> None:
    """``script out *args`` under ``env``; fails with its output's tail unless it exits 0 having written ``out``."""
    done = subprocess.run(
        [sys.executable, str(script), str(out), *args], env=dict(env), capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0 and out.exists(), f"{script.name} failed:\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}"
