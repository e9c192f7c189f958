"""``sgl_kernel.quantization``: the GGUF kernels ``layers/quantization/gguf.py`` imports at load."""

from __future__ import annotations

from sgl_kernel._unavailable import unavailable

ggml_dequantize = unavailable(__name__, "ggml_dequantize")
ggml_moe_a8 = unavailable(__name__, "ggml_moe_a8")
ggml_mul_mat_a8 = unavailable(__name__, "ggml_mul_mat_a8")
ggml_mul_mat_vec_a8 = unavailable(__name__, "ggml_mul_mat_vec_a8")
