"""What ``rocm-vit doctor`` says about the SGLang plugin, computed without starting SGLang.

Whether SGLang would load it, its version's verdict and which hooks apply: from the version alone on
a tested release (SGLang not imported), else by importing each hook's module as ``load`` would.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
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
        "tensor_parallel_all_reduce": all_reduce_verdict(),
        "blocks": blocks_verdict(),
    }
    if entry_point is None:
        status["error"] = (
            f"the {ENTRY_POINT_NAME!r} entry point of group {ENTRY_POINT_GROUP!r} is not installed: "
            "reinstall rocm-vit (pip install rocm-vit, or pip install -e . in a checkout)"
        )
    return status


def all_reduce_verdict(environ: dict[str, str] | None = None, platform: str | None = None) -> str:
    """Which custom all-reduce SGLang 0.5.23's ``dispatch_custom_allreduce`` would pick here under
    tensor parallelism, from the platform and the environment, and what rocm-vit's graphs do with it.
    A prediction: at serving time the adapter identifies the real one from the group's object
    (``integrations/sglang/all_reduce.py``). ``platform``: "rocm", "cuda" or "none" (default: this torch's).
    Server arguments that route the tower's all-reduces before the custom all-reduce are named last."""
    return f"{_custom_all_reduce_verdict(environ, platform)}; {_ROUTED_FIRST}"


# Its replay and an eager call read different buffers: no rank may run eagerly what the others replay.
_AGREED = "; every replay agreed by the ranks before its launch (one host round trip over the CPU group)"
# SGLang's GroupCoordinator.all_reduce sends an all-reduce here before the custom all-reduce's route.
_ROUTED_FIRST = (
    "with --enable-symm-mem (PyNccl's symmetric memory takes what the custom all-reduce declines) or "
    "--flashinfer-allreduce-fusion-backend (FlashInfer's all-reduce), SGLang sends the tower's all-reduces "
    "there first, which rocm-vit does not capture: ViT graphs are off under TP"
)


def _custom_all_reduce_verdict(environ: dict[str, str] | None, platform: str | None) -> str:
    env = os.environ if environ is None else environ

    def flag(name: str, default: bool) -> bool:
        value = env.get(name)
        return default if value is None else value.strip().lower() in ("1", "true", "yes", "on")

    if platform is None:
        platform = "rocm" if _torch_hip() else "cuda"
    if platform == "cuda":
        if flag("SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2", True):
            return (
                "SGLang's CustomAllReduceV2 (SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2 on, the default): not an "
                "all-reduce rocm-vit knows how to capture, so ViT graphs are off under TP; "
                "SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2=0 picks SGLang's CustomAllreduce, captured inside its capture()"
            )
        return f"SGLang's CustomAllreduce (CUDA): captured inside its capture(), registered at its exit{_AGREED}"
    one_stage = "SGLANG_USE_1STAGE_ALLREDUCE"
    if flag(one_stage, False) if one_stage in env else flag("SGLANG_ENABLE_DETERMINISTIC_INFERENCE", False):
        return (
            "SGLang's CustomAllreduce (ROCm, deterministic 1-stage): captured inside its capture(), "
            "registered at its exit"
        )
    if flag("SGLANG_USE_AITER_AR", True) and importlib.util.find_spec("aiter") is not None:
        return "aiter's CustomAllreduce: captured outside its capture(), as the eager call; nothing registered"
    return ("SGLang's CustomAllreduce (ROCm: SGLANG_USE_AITER_AR=0 or aiter missing): captured inside its "
            f"capture(), registered at its exit{_AGREED}")  # fmt: skip


def _torch_hip() -> bool:
    import torch

    return torch.version.hip is not None


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


def blocks_verdict(environ: dict[str, str] | None = None) -> str:
    """What the plugin's runner runs between SGLang's linear modules (``ROCM_VIT_SGLANG_BLOCKS``).

    Which towers fit is known only once SGLang builds one: the runner logs it and its ``stats()``
    carry it (``blocks``)."""
    try:
        chosen = check_settings(environ).sglang_blocks
    except ValueError as error:
        return f"unknown: {error}"
    name = ENV_NAMES["sglang_blocks"]
    if chosen == "sglang":
        return f"SGLang's own blocks ({name}=sglang): graphs replay SGLang's eager forward bit for bit"
    return (
        f"rocm-vit's fused glue between SGLang's linear modules ({name}=rocm-vit) for towers of SGLang's "
        "Qwen3_VisionBlock (Qwen3-VL, Qwen3.5) or Qwen2_5_VisionBlock (Qwen2.5-VL); any other tower runs "
        "SGLang's blocks, the reason in the log and in the runner's stats()['blocks']"
    )
