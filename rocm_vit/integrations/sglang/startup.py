"""The ViT's padded buckets captured while SGLang starts, after its own graphs (or, in an encode
server, after its weights load), then eager warm-up calls.

Without this, the first request in each bucket waits for its capture (docs/design.md, "Buckets
before traffic"), and with graphs off compiles what the eager forward compiles lazily (rocm-vit's
compiled rotary, where chosen). ``ModelRunner.init_cuda_graphs`` runs after the KV cache is sized,
on every TP rank in step: the buckets come out of the serving budget, and every rank captures the
same list.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from rocm_vit.integrations.sglang.graph_runner import ViTGraphRunnerAdapter, adapters_in

logger = logging.getLogger(__name__)


def capture_buckets_after(original: Callable[..., None], model_of: Callable[..., Any]) -> Callable[..., None]:
    """``original`` (same parameters: the version gate checks them through ``__wrapped__``), then the
    padded buckets of the ViTs of ``model_of(*its arguments)`` captured (``capture_vit_buckets``)."""

    def then_capture(*args: Any, **kwargs: Any) -> None:
        original(*args, **kwargs)
        model = model_of(*args, **kwargs)
        if isinstance(model, nn.Module):
            capture_vit_buckets(model)

    functools.update_wrapper(then_capture, original, assigned=("__doc__",))
    return then_capture


def model_runner_model(self: Any, *args: Any, **kwargs: Any) -> Any:
    """The model of ``ModelRunner.init_cuda_graphs``' runner."""
    return getattr(self, "model", None)


def loaded_model(model: Any, device: Any) -> Any:
    """The model of the encode server's ``maybe_precompile_model_kernels_after_loading``: an
    ``MMEncoder`` builds no ``ModelRunner``, and calls that on every rank once the weights load."""
    return model


@torch.no_grad()  # as SGLang's own captures: inference mode may write these tensors, not the reverse
def capture_vit_buckets(model: nn.Module) -> int:
    """Capture each ViT's padded buckets (``SGLANG_VIT_CUDA_GRAPH_CAPTURE_BUCKETS``), then warm it up
    eagerly under ``no_grad`` and ``inference_mode``, so requests compile nothing. A failure is
    logged and the server starts; under tensor parallelism a failure the ranks did not agree on is
    raised, failing this rank's start rather than leaving its peers in the tower's collectives.
    Returns how many graphs were captured."""
    captured = 0
    for adapter in adapters_in(model):
        if adapter.captures_buckets_at_start:
            captured += _capture_buckets(adapter)
        _warm_up(adapter)
    return captured


def _capture_buckets(adapter: ViTGraphRunnerAdapter) -> int:
    """``adapter.capture_padded_buckets()``, timed and logged; a failure is logged and counts none."""
    tower, started = type(adapter.vit).__name__, time.perf_counter()
    try:
        graphs = adapter.capture_padded_buckets()
    except Exception:  # server start goes on; the runner captures on demand instead
        logger.exception("rocm-vit: capturing the padded buckets of %s at start failed", tower)
        if adapter.shares_decisions:
            raise
        return 0
    if graphs:
        held_mib = adapter.stats().get("bytes_held", 0) / 2**20
        seconds = time.perf_counter() - started
        logger.info("rocm-vit: %d padded bucket graphs of %s captured at start in %.1f s (%.0f MiB held)",
                    graphs, tower, seconds, held_mib)  # fmt: skip
    return graphs


def _warm_up(adapter: ViTGraphRunnerAdapter) -> None:
    """``adapter.warm_up()``, timed and logged; a failure is logged and the server starts."""
    tower, started = type(adapter.vit).__name__, time.perf_counter()
    try:
        adapter.warm_up()
    except Exception:  # server start goes on; the first request compiles instead
        logger.exception("rocm-vit: the eager warm-up of %s at start failed", tower)
        if adapter.shares_decisions:
            raise
        return
    logger.info("rocm-vit: %s warmed up with eager calls at start in %.1f s", tower, time.perf_counter() - started)
