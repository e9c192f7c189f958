"""Qwen2.5-VL's ViT graph path on ROCm, where rocm-vit's runner serves it.

SGLang 0.5.23 enables ViT graphs only on CUDA (``enable_cg = _is_cuda and ...``). The gate is lifted for a
tower only where rocm-vit's runner serves it on ROCm; elsewhere SGLang's decision stands.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Any

from rocm_vit.integrations.sglang.blocks import SGLANG_GRAPH_ARGS
from rocm_vit.integrations.sglang.graph_runner import ViTGraphRunnerAdapter
from rocm_vit.platform import current_platform

logger = logging.getLogger(__name__)


def lift_graph_gate(original_init: Callable[..., None]) -> Callable[..., None]:
    """``Qwen2_5_VisionTransformer.__init__`` that also enables graphs on ROCm under rocm-vit's runner.

    Same parameters as ``original_init`` (the version gate checks them through ``__wrapped__``).
    """

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        model_module = sys.modules[original_init.__module__]
        if self.enable_cg or not model_module.envs.SGLANG_VIT_ENABLE_CUDA_GRAPH.get():
            return
        if current_platform() != "rocm" or model_module.ViTCudaGraphRunner is not ViTGraphRunnerAdapter:
            return
        backend = getattr(self.blocks[0].attn, "qkv_backend_name", None)
        if backend not in SGLANG_GRAPH_ARGS:
            logger.warning("rocm-vit: Qwen2.5-VL's ViT stays eager on ROCm: %s attention cannot be captured", backend)
            return
        runner = ViTGraphRunnerAdapter(self)
        if not runner.serves_graphs:  # the adapter said why; SGLang's eager forward stays in charge
            return
        self.cuda_graph_runner = runner
        self.enable_cg = True

    # __wrapped__ for inspect.signature, but rocm-vit's own name for logs and the doctor.
    functools.update_wrapper(__init__, original_init, assigned=("__doc__",))
    return __init__
