"""Entry functions of the encode server's spawned workers that load SGLang's plugins first.

SGLang 0.5.23 loads no plugins in the encode server's spawned TP ranks >= 1 and DP workers; ``spawn``
pickles these module-level functions by name, so the child imports rocm-vit and loads plugins first.
Why: docs/sglang.md, hooks ``encoder_tp_worker`` and ``encoder_dp_worker``.
"""

from __future__ import annotations

from typing import Any

from rocm_vit.integrations.sglang.imports import original

_ENCODER_SERVER = "sglang.srt.disaggregation.encoder.server"
_ENCODER_RUNTIME = "sglang.srt.disaggregation.encoder.runtime"


def launch_encoder(*args: Any, **kwargs: Any) -> Any:
    """SGLang's ``launch_encoder`` (a TP rank >= 1 of the encode server), after ``load_plugins()``."""
    _load_plugins()
    return original(_ENCODER_SERVER, "launch_encoder")(*args, **kwargs)


def launch_dp_worker(*args: Any, **kwargs: Any) -> Any:
    """SGLang's ``launch_dp_worker`` (an encode-server DP worker), after ``load_plugins()``."""
    _load_plugins()
    return original(_ENCODER_RUNTIME, "launch_dp_worker")(*args, **kwargs)


def _load_plugins() -> None:
    # Idempotent in SGLang; in a spawned child it is the first call.
    from sglang.srt.plugins import load_plugins

    load_plugins()
