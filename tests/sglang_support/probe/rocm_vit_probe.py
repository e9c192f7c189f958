"""Test-only SGLang plugin (tests/sglang_support/scenario.py): reports a spawned worker's hooks.

The scenario spawns an encode-server TP worker through SGLang's patched ``launch_encoder`` target
with this folder on ``sys.path``. In the child, rocm-vit's wrapper calls ``load_plugins()``, which
loads rocm-vit and this probe; the probe replaces ``run_encoder`` (the worker's serving loop) with a
coroutine that writes what the child's SGLang objects are to the path SGLang passes as
``schedule_path``, and returns instead of serving.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

_FACTS = {
    "aiter_in_table": ("sglang.srt.layers.attention.vision", "QKV_BACKEND_IMPL"),
    "rotary": ("sglang.srt.layers.attention.vision", "apply_rotary_pos_emb"),
    "runner": ("sglang.srt.multimodal.vit_cuda_graph_runner", "ViTCudaGraphRunner"),
    "runner_in_qwen3_vl": ("sglang.srt.models.qwen3_vl", "ViTCudaGraphRunner"),
    "interpolation": ("sglang.srt.models.qwen3_vl", "Qwen3VLMoeVisionModel"),
    "tp_worker": ("sglang.srt.disaggregation.encoder.server", "launch_encoder"),
    "dp_worker": ("sglang.srt.disaggregation.encoder.runtime", "launch_dp_worker"),
}


def load() -> None:
    HookRegistry.register("sglang.srt.disaggregation.encoder.server.run_encoder", report, HookType.REPLACE)


async def report(server_args: Any, schedule_path: str, dist_init_method: str, rank: int) -> None:
    facts = {}
    for key, (module, name) in _FACTS.items():
        value = getattr(importlib.import_module(module), name)
        if key == "aiter_in_table":
            value = value["aiter_attn"]
        elif key == "interpolation":
            value = value.fast_pos_embed_interpolate
        facts[key] = f"{value.__module__}.{value.__qualname__}"
    facts["rank"] = rank
    Path(schedule_path).write_text(json.dumps(facts))
