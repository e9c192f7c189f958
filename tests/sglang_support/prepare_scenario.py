"""rocm-vit's ``_prepare_graph_inputs`` against SGLang's own, in a process of its own; writes a report.

Run by tests/test_sglang_prepare.py as ``python prepare_scenario.py REPORT.pt`` and by
tests/gpu/test_sglang_prepare_gpu.py with ``--device cuda`` (the fused kernel). A process of its own
because the hooks patch SGLang's Qwen3-VL class for the life of the process. SGLang's function runs
with hook ``qwen3_vl_graph_interpolation`` applied (what a server with the plugin runs); each layout
is prepared twice by rocm-vit (built, then from the cache), and layouts that share token count and
offsets follow each other.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.append(str(HERE))
sys.path.append(str(HERE.parent))

import torch  # noqa: E402
from env_vars import set_env  # noqa: E402
from toy_tower import tiny_qwen3_vl_config  # noqa: E402

# (t, h, w) in patches; the toy's position table is 6 x 6. (1, 4, 8) and (1, 8, 4): the same 32
# patches in one segment, other taps; (2, 6, 4) and (3, 4, 4), (1, 10, 6): videos.
LAYOUTS = {
    "one_image": [(1, 8, 8)],
    "wide_image": [(1, 4, 8)],
    "tall_image_same_offsets": [(1, 8, 4)],
    "several_images": [(1, 6, 10), (1, 4, 4), (1, 8, 6)],
    "video": [(2, 6, 4)],
    "videos_and_image": [(3, 4, 4), (1, 10, 6)],
    # Past SGLang's vectorized threshold (6 images): its other interpolation function.
    "seven_images": [(1, 4, 4), (1, 6, 8), (1, 4, 4), (2, 8, 6), (1, 6, 8), (1, 4, 6), (1, 4, 4)],
}
PATCH_DIM = 3 * 2 * 4 * 4
DEVICE = "cpu"  # --device
OUTPUTS = ("x", "cu_seqlens", "cos", "sin")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("report", type=Path)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    logging.basicConfig(level=logging.WARNING)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("rocm_vit").addHandler(handler)

    if DEVICE == "cuda":  # before SGLang loads: a CUDA torch makes its layers import sgl_kernel
        from scenario import _sgl_kernel_standin_where_missing

        _sgl_kernel_standin_where_missing()
    from sglang.srt.models import qwen3_vl

    from rocm_vit.integrations.sglang import hooks, standalone
    from rocm_vit.integrations.sglang.prepare import prepare_graph_inputs_from_cache

    standalone.init_world(DEVICE, role="test")
    tower_class = qwen3_vl.Qwen3VLMoeVisionModel
    sglangs = tower_class._prepare_graph_inputs
    by_name = {hook.name: hook for hook in hooks.HOOKS}
    report: dict[str, Any] = {"mismatch": by_name["qwen3_vl_prepare_from_cache"].mismatch(qwen3_vl)}

    # Without the interpolation hook SGLang's graph path has its own rule: rocm-vit's must hand over.
    fp32_tower = _tiny_tower(torch.float32)
    ours = prepare_graph_inputs_from_cache(sglangs)
    pixels, grid = _inputs(LAYOUTS["wide_image"], torch.float32)
    expected = sglangs(fp32_tower, pixels, grid)
    report["without_interpolation_hook"] = [_same(ours(fp32_tower, pixels, grid), expected) for _ in range(2)]
    report["fallback_logs"] = [record.getMessage() for record in records]

    by_name["qwen3_vl_graph_interpolation"].install(qwen3_vl)
    by_name["qwen3_vl_prepare_from_cache"].install(qwen3_vl)
    report["installed"] = f"{tower_class._prepare_graph_inputs.__module__}.{tower_class._prepare_graph_inputs.__name__}"
    ours = tower_class._prepare_graph_inputs
    with set_env({"SGLANG_VIT_ENABLE_VECTORIZED_POS_EMBED": "1"}), torch.no_grad():
        for dtype in (torch.float32, torch.bfloat16):
            tower = fp32_tower if dtype == torch.float32 else _tiny_tower(dtype)
            for name, layout in LAYOUTS.items():
                pixels, grid = _inputs(layout, dtype)
                expected = sglangs(tower, pixels, grid)
                first = ours(tower, pixels.clone(), grid)
                cached = ours(tower, pixels.clone(), grid.tolist())
                key = f"{name}_{str(dtype)[6:]}"
                report[key] = {"built": _compare(first, expected), "cached": _compare(cached, expected)}
        report["ops_on_a_known_layout"] = {
            str(images): _ops_per_call(fp32_tower, ours, [(1, 4, 4)] * images) for images in (1, 16)
        }
        report["byte_budget"] = _within_byte_budget(ours, sglangs)
        tower = _tiny_tower(torch.bfloat16)
        tower.pos_embed.tp_size = 2  # a VocabParallelEmbedding split over two ranks (world size 1 here)
        pixels, grid = _inputs(LAYOUTS["video"], torch.bfloat16)
        expected = sglangs(tower, pixels, grid)
        report["split_table"] = [_same(ours(tower, pixels, grid), expected) for _ in range(2)]
    from rocm_vit.fusion import fused_ops_name

    report["fused_ops"] = fused_ops_name()
    report["logs"] = [record.getMessage() for record in records]
    torch.save(report, args.report)


def _within_byte_budget(ours: Any, sglangs: Any) -> dict[str, Any]:
    """Layouts kept under a budget of two of these layouts, and the first one rebuilt once evicted."""
    from rocm_vit.integrations.sglang import prepare

    tower = _tiny_tower(torch.float32)
    grids = [LAYOUTS["wide_image"], LAYOUTS["tall_image_same_offsets"], [(1, 4, 4), (1, 4, 4)]]  # 32 patches each
    inputs = [_inputs(grid, torch.float32) for grid in grids]
    budget = prepare.LAYOUT_CACHE_BYTES
    prepare.LAYOUT_CACHE_BYTES = 2 * prepare.prepared_layout(tower, tuple(grids[0])).device_bytes
    try:
        for pixels, grid in inputs:
            ours(tower, pixels, grid)
        cache = prepare._tower_cache(tower)
        held = {"layouts": len(cache), "bytes": cache.bytes_held, "budget": prepare.LAYOUT_CACHE_BYTES}
        pixels, grid = inputs[0]
        return {**held, "evicted_again": _same(ours(tower, pixels, grid), sglangs(tower, pixels, grid))}
    finally:
        prepare.LAYOUT_CACHE_BYTES = budget


def _tiny_tower(dtype: torch.dtype) -> torch.nn.Module:
    """Head dim 16 on a CPU, 64 on a GPU (where SGLang's rotary class loads its own kernel for others)."""
    from sglang.srt.models.qwen3_vl import Qwen3VLMoeVisionModel

    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(DEVICE):
            tower = Qwen3VLMoeVisionModel(tiny_qwen3_vl_config(hidden_size=64 if DEVICE == "cpu" else 256)).eval()
    finally:
        torch.set_default_dtype(default_dtype)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():  # SGLang allocates with torch.empty
        for parameter in tower.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator))
    return tower


def _inputs(layout: list[tuple[int, int, int]], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    patches = sum(t * h * w for t, h, w in layout)
    generator = torch.Generator().manual_seed(patches)
    return torch.randn(patches, PATCH_DIM, generator=generator).to(dtype), torch.tensor(layout, dtype=torch.int32)


def _compare(ours: tuple, expected: tuple) -> dict[str, Any]:
    """Per output: bitwise equal, or the largest absolute difference (inf: shapes or dtypes differ)."""
    result = {}
    for name, left, right in zip(OUTPUTS, ours, expected, strict=True):
        if left.shape != right.shape or left.dtype != right.dtype:
            result[name] = float("inf")
        else:
            result[name] = True if torch.equal(left, right) else (left.double() - right.double()).abs().max().item()
    return result


def _same(ours: tuple, expected: tuple) -> bool:
    return all(value is True for value in _compare(ours, expected).values())


def _ops_per_call(tower: torch.nn.Module, prepare: Any, layout: list[tuple[int, int, int]]) -> int:
    """Torch ops one call runs on a layout already prepared once (the device work and host tensors)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counting(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Counting.ops += 1
            return func(*args, **(kwargs or {}))

    pixels, grid = _inputs(layout, torch.float32)
    prepare(tower, pixels, grid)
    with Counting():
        prepare(tower, pixels, grid)
    return Counting.ops


if __name__ == "__main__":
    main()
