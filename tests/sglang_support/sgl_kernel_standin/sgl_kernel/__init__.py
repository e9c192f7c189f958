"""A test-only stand-in for ``sgl_kernel`` (the ``sglang-kernel`` wheel), for GPU machines without it.

``sglang-kernel`` is hundreds of MB and built for one torch, so it cannot reach offline GPU
machines; SGLang 0.5.23 imports names from it when its layers load on a CUDA torch, though its
Qwen3-VL vision path calls none of them with ``triton_attn`` or ``sdpa`` (docs/sglang.md, "SGLang
on a GPU machine without a package index"). Each name here is one SGLang imports unconditionally on
that path (found by importing SGLang's tower, ViT graph runner, model runner and encode server with
CUDA simulated: tests/test_sgl_kernel_standin.py); each raises if called, so a call shows as an error,
never as a silent substitute. Names SGLang imports inside ``try`` (``sgl_kernel.scalar_type``) are
left out on purpose: SGLang's own fallback then runs, as without the package.

Put ``tests/sglang_support/sgl_kernel_standin`` on ``sys.path`` only where no real ``sgl_kernel``
exists (``tests/sglang_support/scenario.py`` and the ``bench-sglang`` worker do). Never in the wheel.
"""

from __future__ import annotations

from sgl_kernel._unavailable import unavailable

fused_add_rmsnorm = unavailable(__name__, "fused_add_rmsnorm")  # layers/layernorm.py
gemma_fused_add_rmsnorm = unavailable(__name__, "gemma_fused_add_rmsnorm")
gemma_rmsnorm = unavailable(__name__, "gemma_rmsnorm")
rmsnorm = unavailable(__name__, "rmsnorm")
gelu_and_mul = unavailable(__name__, "gelu_and_mul")  # layers/activation.py
gelu_tanh_and_mul = unavailable(__name__, "gelu_tanh_and_mul")
silu_and_mul = unavailable(__name__, "silu_and_mul")
int8_scaled_mm = unavailable(__name__, "int8_scaled_mm")  # layers/quantization
moe_sum = unavailable(__name__, "moe_sum")  # layers/moe
moe_sum_reduce = unavailable(__name__, "moe_sum_reduce")
top_k_renorm_prob = unavailable(__name__, "top_k_renorm_prob")  # layers/sampler.py (model runner)
top_p_renorm_prob = unavailable(__name__, "top_p_renorm_prob")
