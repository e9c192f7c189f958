"""The GEMM-epilogue experiment's prototype kernels on the CPU interpreter (fp32: the interpreter's
bf16 ``tl.dot`` is not a GPU's): the GEMM equals ``F.linear``, the fused qkv equals ``F.linear`` then
the rotary, so the GPU timings compare paths that compute the same thing."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from rocm_vit.backends.rope_torch import rotary_native_
from triton_interpreter import run_interpreted

_SCRIPT = """
import importlib.util, sys
import torch
spec = importlib.util.spec_from_file_location("bench", "tests/gpu_gemm_epilogue_bench.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
case = torch.load(sys.argv[1])
x, weight, bias, cos, sin = case["x"], case["weight"], case["bias"], case["cos"], case["sin"]
config = (16, 16, 16, 1, 1)  # several tiles in every direction, a partial last one in each
out = {"linear": bench.linear(x, weight, bias, config)}
out["fused"] = bench.qkv_rotary(x, weight, bias, cos, sin, case["heads"], config)
torch.save(out, sys.argv[2])
"""


def test_prototype_gemm_and_fused_qkv_compute_linear_and_rotary(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(7)
    rows, depth, heads, head_dim = 21, 40, 3, 8  # 36 pairs: q's, k's and v's 12 across three pair tiles
    x = torch.randn(rows, depth, generator=generator)
    weight = torch.randn(3 * heads * head_dim, depth, generator=generator)
    bias = torch.randn(3 * heads * head_dim, generator=generator)
    angles = torch.rand(rows, head_dim // 2, generator=generator) * 40
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    case = {"x": x, "weight": weight, "bias": bias, "cos": cos, "sin": sin, "heads": heads}
    out = run_interpreted(_SCRIPT, case, tmp_path, {})

    expected = F.linear(x, weight, bias)
    torch.testing.assert_close(out["linear"], expected, rtol=1e-5, atol=1e-5)
    qkv = expected.view(rows, 3, heads, head_dim).clone()
    q, k, _ = qkv.unbind(1)
    rotary_native_(q, k, cos, sin)
    assert out["fused"].shape == (rows, 3, heads, head_dim)
    torch.testing.assert_close(out["fused"], qkv, rtol=1e-5, atol=1e-5)
    # v passes through unrotated; q and k did rotate (a kernel that skipped the rotary fails above too).
    torch.testing.assert_close(out["fused"][:, 2], expected.view(rows, 3, heads, head_dim)[:, 2], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(out["fused"][:, 0], expected.view(rows, 3, heads, head_dim)[:, 0], atol=1e-3)
