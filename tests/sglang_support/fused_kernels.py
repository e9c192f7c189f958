"""Kernels per forward of SGLang's Qwen3-VL-8B tower under the plugin, SGLang's blocks against rocm-vit's
fused glue, on a GPU; writes a JSON report. Run by tests/gpu/test_sglang_fused_gpu.py as
``python fused_kernels.py REPORT.json --attention triton_attn`` (a process of its own: the plugin
patches SGLang for the life of a process).

Each forward is SGLang's ``forward_with_cuda_graph`` through rocm-vit's adapter with no graph (capacity
0), so every kernel launches and is counted by the torch profiler; the outputs of the two block
loops are compared (max and mean absolute difference).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.append(str(HERE))
sys.path.append(str(HERE.parent))

import torch  # noqa: E402
from env_vars import set_env  # noqa: E402

GRIDS = {"1x224": [(1, 14, 14)], "1x512": [(1, 32, 32)]}
CALLS = 3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("report", type=Path)
    parser.add_argument("--attention", default="triton_attn")
    args = parser.parse_args()
    from scenario import _sgl_kernel_standin_where_missing

    _sgl_kernel_standin_where_missing()  # before SGLang loads: a CUDA torch makes its layers import sgl_kernel
    from rocm_vit.integrations.sglang import standalone
    from rocm_vit.models import preset

    standalone.init_world("cuda")
    standalone.load_plugin()
    config = preset("qwen3-vl-8b")
    tower = standalone.build_tower(config, "cuda", torch.bfloat16, args.attention)
    patch_dim = config.in_channels * config.temporal_patch_size * config.patch_size**2
    generator = torch.Generator(device="cuda").manual_seed(0)
    from rocm_vit.policy import active_policy

    report: dict = {"depth": config.depth, "attention": args.attention}
    report["gelu_epilogue"] = active_policy().gelu_epilogue.value  # the fused glue's tanh-GELU in fc1's GEMM
    for name, grid in GRIDS.items():
        patches = sum(t * h * w for t, h, w in grid)
        pixels = torch.randn(patches, patch_dim, generator=generator, device="cuda", dtype=torch.bfloat16)
        outputs, counts = {}, {}
        for blocks in ("sglang", "rocm-vit"):
            outputs[blocks], counts[blocks] = _count(tower, pixels, grid, blocks)
        difference = (outputs["rocm-vit"].float() - outputs["sglang"].float()).abs()
        report[name] = {
            "kernels": counts,
            "max_abs": float(difference.max()),
            "mean_abs": float(difference.mean()),
        }
    args.report.write_text(json.dumps(report, indent=1))


def _count(tower: torch.nn.Module, pixels: torch.Tensor, grid: list, blocks: str) -> tuple[torch.Tensor, int]:
    """The output and the device kernels per forward with ``ROCM_VIT_SGLANG_BLOCKS=blocks``."""
    from torch.profiler import ProfilerActivity, profile

    from rocm_vit.integrations.sglang.graph_runner import ViTGraphRunnerAdapter

    settings = {"ROCM_VIT_SGLANG_BLOCKS": blocks, "SGLANG_VIT_ENABLE_CUDA_GRAPH": "1"}
    with set_env({**settings, "SGLANG_VIT_CUDA_GRAPH_CACHE_CAPACITY": "0", "SGLANG_VIT_CUDA_GRAPH_PADDING": "0"}):
        adapter = tower.graph_runners = ViTGraphRunnerAdapter(tower)
    assert adapter.stats()["blocks"].startswith(blocks), adapter.stats()["blocks"]
    grid_thw = torch.tensor(grid, dtype=torch.int32)
    with torch.no_grad(), set_env(settings):
        output = tower(pixels, grid_thw)  # warm-up: kernels built, rotary compiled
        with profile(activities=[ProfilerActivity.CUDA]) as profiler:
            for _ in range(CALLS):
                tower(pixels, grid_thw)
            torch.cuda.synchronize()
    launched = sum(
        event.count for event in profiler.key_averages() if event.device_type == torch.autograd.DeviceType.CUDA
    )
    return output, launched // CALLS


if __name__ == "__main__":
    main()
