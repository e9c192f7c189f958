"""SGLang's own Qwen3-VL vision tower outside a server, for ``rocm-vit bench-sglang``'s worker.

What a server would build, without a checkpoint or a scheduler, so the benchmark times SGLang's own
code: its distributed state at world size 1 and its tower at a preset's sizes, random weights. The
plugin, if wanted, is loaded before the tower is built, as SGLang loads plugins before the model.
"""

from __future__ import annotations

import dataclasses
import tempfile
from typing import Any

import torch
from torch import nn

from rocm_vit.tower_config import Qwen3VLVisionConfig


def init_world(device: str, role: str = "bench") -> None:
    """SGLang's parallel state for one process, as ``sglang.test.layer_ut_utils`` sets it up."""
    from sglang.srt.distributed import parallel_state
    from sglang.srt.distributed.parallel_state import init_distributed_environment, initialize_model_parallel
    from sglang.srt.runtime_context import SpawnRanks, get_parallel, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    with tempfile.NamedTemporaryFile(delete=False) as rendezvous:
        init_method = f"file://{rendezvous.name}"
    backend = "gloo" if device == "cpu" else "nccl"
    init_distributed_environment(
        world_size=1, rank=0, local_rank=0, distributed_init_method=init_method, backend=backend
    )
    reset_context()
    publish(ServerArgs(model_path="dummy"), role=role, ranks=SpawnRanks(world_rank=0))
    get_parallel().override_permanently(world_group=parallel_state._WORLD)
    initialize_model_parallel(backend=backend)  # by keyword: the first positional is a size
    if device == "cpu":
        # Neither CUDA nor SGLang's CPU engine: the rotary base class would import vllm for its
        # fallback kernel unless it believes it runs on a CPU.
        import sglang.srt.layers.rotary_embedding.base as rotary_base

        rotary_base._is_cpu = True


def load_plugin() -> bool:
    """rocm-vit's plugin, loaded as SGLang loads it, or directly from a checkout without the entry
    point; whether it was already loaded."""
    import sglang.srt.plugins

    import rocm_vit.integrations.sglang as plugin

    sglang.srt.plugins.load_plugins()
    by_entry_point = plugin._loaded
    plugin.load()
    return by_entry_point


def import_tower_module() -> None:
    """Import SGLang's Qwen3-VL model module, where a package missing from the environment shows up
    (raises ``ImportError`` naming it)."""
    import sglang.srt.models.qwen3_vl  # noqa: F401


def build_tower(config: Qwen3VLVisionConfig, device: str, dtype: torch.dtype, attention: str | None) -> nn.Module:
    """SGLang's ``Qwen3VLMoeVisionModel`` at ``config``'s sizes, random weights (norm weights near 1)."""
    from sglang.srt.configs.qwen3_vl import Qwen3VLVisionConfig as SGLangConfig
    from sglang.srt.models.qwen3_vl import Qwen3VLMoeVisionModel
    from sglang.srt.runtime_context import get_mm

    fields = dataclasses.asdict(config)
    fields["deepstack_visual_indexes"] = list(config.deepstack_visual_indexes)
    sglang_config = SGLangConfig(**fields)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # SGLang's loader builds under the checkpoint's dtype
    try:
        with torch.device(device), get_mm().override(mm_attention_backend=attention):
            tower = Qwen3VLMoeVisionModel(sglang_config).eval()
    finally:
        torch.set_default_dtype(default_dtype)
    _randomise(tower, seed=0)
    return tower


def qualified_name(obj: Any) -> str:
    """``module.QualName`` of an object's class (or of a class)."""
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


@torch.no_grad()
def _randomise(tower: nn.Module, seed: int) -> None:
    # SGLang allocates parameters with torch.empty: fill them reproducibly, on their own device.
    for index, (name, parameter) in enumerate(tower.named_parameters()):
        generator = torch.Generator(device=parameter.device).manual_seed(seed + index)
        values = torch.randn(parameter.shape, generator=generator, device=parameter.device, dtype=torch.float32) * 0.02
        if "norm" in name and name.endswith("weight"):
            values += 1.0
        parameter.copy_(values)
