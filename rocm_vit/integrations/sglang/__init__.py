"""rocm-vit's SGLang plugin: the one place that knows SGLang.

``load()`` (entry point ``sglang.srt.plugins``) registers ``hooks.HOOKS``, each installed when SGLang
imports its module, after the version gate. Invariant: nothing here raises into SGLang; a hook that
cannot apply is logged and left out. ``ROCM_VIT_DISABLE=1`` turns it off. Targets: docs/sglang.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import ModuleType

from rocm_vit import __version__
from rocm_vit.integrations.sglang import hooks
from rocm_vit.integrations.sglang.hooks import HOOKS, TESTED_SGLANG_VERSIONS, Hook, is_tested
from rocm_vit.integrations.sglang.imports import when_imported
from rocm_vit.policy import check_settings
from rocm_vit.settings import ENV_NAMES

logger = logging.getLogger(__name__)

_loaded = False


def load() -> None:
    """SGLang's plugin entry point: register rocm-vit's hooks in this process; never raises."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    try:
        _register_hooks()
    except Exception:  # the plugin must never take SGLang down
        logger.exception("rocm-vit: the SGLang plugin failed to load; SGLang runs without it")


def _register_hooks() -> None:
    try:
        settings = check_settings()
    except ValueError as error:
        logger.error("rocm-vit: %s; the SGLang plugin is off", error)
        return
    if settings.disable:
        logger.info("rocm-vit: the SGLang plugin is off (%s=1)", ENV_NAMES["disable"])
        return
    version = hooks.sglang_version()
    tested = is_tested(version)
    if tested:
        logger.info("rocm-vit %s: SGLang %s is a tested release; %d hooks", __version__, version, len(HOOKS))
    else:
        logger.warning(
            "rocm-vit %s: SGLang %s is not a release rocm-vit was tested with (%s); each hook's targets "
            "are checked before it is applied",
            __version__,
            version or "(version unknown)",
            ", ".join(TESTED_SGLANG_VERSIONS),
        )
    for hook in HOOKS:
        when_imported(hook.module, _installer(hook, check=not tested))


def _installer(hook: Hook, check: bool) -> Callable[[ModuleType], None]:
    def install(module: ModuleType) -> None:
        try:
            problem = hook.mismatch(module) if check else None
            if problem is not None:
                logger.warning("rocm-vit: not applying hook %s: %s; SGLang keeps its own", hook.name, problem)
                return
            hook.install(module)
            logger.info("rocm-vit: applied hook %s -> %s", hook.name, ", ".join(hook.targets))
        except Exception:  # runs inside SGLang's import statement: never raise there
            logger.exception("rocm-vit: applying hook %s failed; SGLang keeps its own", hook.name)

    return install
