"""What ``rocm-vit doctor`` says about the SGLang plugin, computed without starting SGLang.

Whether SGLang would load it (entry point installed, ``SGLANG_PLUGINS`` allow-list,
``ROCM_VIT_DISABLE``), the SGLang version and its verdict, and which hooks apply. On a tested
release the hooks are reported from the version alone and SGLang is not imported; on any other
release each hook's module is imported and its targets checked, as ``load`` would check them.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
from typing import Any

from rocm_vit.integrations.sglang import hooks
from rocm_vit.integrations.sglang.hooks import HOOKS, TESTED_SGLANG_VERSIONS, is_tested
from rocm_vit.policy import check_settings
from rocm_vit.settings import ENV_NAMES

ENTRY_POINT_GROUP = "sglang.srt.plugins"
ENTRY_POINT_NAME = "rocm_vit"


def plugin_status() -> dict[str, Any]:
    """The doctor's ``sglang`` section; an ``error`` entry marks something that keeps the plugin out."""
    version = hooks.sglang_version()
    if version is None:
        return {"installed": False, "loads": "no: sglang is not installed"}
    entry_point = _entry_point()
    status: dict[str, Any] = {
        "installed": version,
        "verdict": (
            "tested release"
            if is_tested(version)
            else f"untested release (tested: {', '.join(TESTED_SGLANG_VERSIONS)}): each target is checked"
        ),
        "entry_point": entry_point or "missing",
        "loads": _loads(entry_point),
        "hooks": _hook_verdicts(version),
    }
    if entry_point is None:
        status["error"] = (
            f"the {ENTRY_POINT_NAME!r} entry point of group {ENTRY_POINT_GROUP!r} is not installed: "
            "reinstall rocm-vit (pip install rocm-vit, or pip install -e . in a checkout)"
        )
    return status


def _entry_point() -> str | None:
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry_point.name == ENTRY_POINT_NAME:
            return entry_point.value
    return None


def _loads(entry_point: str | None) -> str:
    if entry_point is None:
        return "no: entry point missing"
    allowed = os.environ.get("SGLANG_PLUGINS", "")
    # SGLang's load_plugins: a non-empty SGLANG_PLUGINS is a comma-separated allow-list of names.
    names = {name.strip() for name in allowed.split(",") if name.strip()}
    if names and ENTRY_POINT_NAME not in names:
        return f"no: SGLANG_PLUGINS={allowed!r} does not name {ENTRY_POINT_NAME}"
    try:
        settings = check_settings()
    except ValueError as error:
        return f"no: {error}"
    if settings.disable:
        return f"no: {ENV_NAMES['disable']}=1"
    return "yes"


def _hook_verdicts(version: str) -> dict[str, str]:
    if is_tested(version):
        return {hook.name: f"applies: {', '.join(hook.targets)}" for hook in HOOKS}
    verdicts = {}
    for hook in HOOKS:
        try:
            module = importlib.import_module(hook.module)
        except Exception as error:  # reported: SGLang itself would fail to import it too
            verdicts[hook.name] = f"cannot check: importing {hook.module} failed ({type(error).__name__}: {error})"
            continue
        problem = hook.mismatch(module)
        verdicts[hook.name] = f"applies: {', '.join(hook.targets)}" if problem is None else f"left out: {problem}"
    return verdicts
