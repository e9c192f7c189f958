"""Entry functions of the encode server's spawned workers that load SGLang's plugins first.

SGLang 0.5.23 calls ``load_plugins()`` in its server, engine, scheduler, DP-controller and
detokenizer processes, but not in the disaggregated encode server's workers: tensor-parallel ranks
>= 1 (``encoder/server.py: launch_encoder``) and data-parallel workers (``encoder/runtime.py:
launch_dp_worker``), started with the ``spawn`` method. These run a vision encoder, so without the
plugin they would serve other numbers than rank 0. The plugin puts these module-level functions in
place of SGLang's: ``spawn`` pickles a process target by its module and name, so the child imports
rocm-vit, loads the plugins (rocm-vit's hooks among them), then runs SGLang's own entry function.
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
