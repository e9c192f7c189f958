"""rocm-vit's ``_prepare_graph_inputs`` and ``forward_with_cuda_graph`` against SGLang's, in a process of its own.

Run by tests/test_sglang_prepare.py as ``python prepare_scenario.py REPORT.pt`` and by
tests/gpu/test_sglang_prepare_gpu.py with ``--device cuda`` (the fused kernel). A process of its own
because the hooks patch SGLang's Qwen3-VL class for the life of the process. SGLang's function runs
with hook ``qwen3_vl_graph_interpolation`` applied (what a server with the plugin runs); each layout
is prepared twice by rocm-vit (built, then from the cache), and layouts that share token count and
offsets follow each other. ``forward_with_cuda_graph`` is compared by what each hands the graph runner
(a recorder in its place); on a GPU a warm call runs under ``torch.cuda.set_sync_debug_mode("error")``.
Qwen2.5-VL's ``forward_with_cuda_graph`` (hook ``qwen2_5_vl_graph_forward_from_cache``) is compared the
same way. Writes a report.
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
from toy_tower import tiny_qwen2_5_vl_config, tiny_qwen3_vl_config  # noqa: E402

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
    from rocm_vit.integrations.sglang.prepare import forward_with_cuda_graph_from_cache, prepare_graph_inputs_from_cache

    standalone.init_world(DEVICE, role="test")
    tower_class = qwen3_vl.Qwen3VLMoeVisionModel
    sglangs = tower_class._prepare_graph_inputs
    sglangs_forward = tower_class.forward_with_cuda_graph
    by_name = {hook.name: hook for hook in hooks.HOOKS}
    report: dict[str, Any] = {
        "mismatch": by_name["qwen3_vl_prepare_from_cache"].mismatch(qwen3_vl),
        "forward_mismatch": by_name["qwen3_vl_graph_forward_from_cache"].mismatch(qwen3_vl),
    }

    # Without the interpolation hook SGLang's graph path has its own rule: rocm-vit's must hand over.
    fp32_tower = _tiny_tower(torch.float32)
    ours = prepare_graph_inputs_from_cache(sglangs)
    pixels, grid = _inputs(LAYOUTS["wide_image"], torch.float32)
    expected = sglangs(fp32_tower, pixels, grid)
    report["without_interpolation_hook"] = [_same(ours(fp32_tower, pixels, grid), expected) for _ in range(2)]
    ours_forward = forward_with_cuda_graph_from_cache(sglangs_forward)
    fp32_tower.graph_runners = RecordingRunner()
    report["forward_without_interpolation_hook"] = _same_runner_arguments(
        ours_forward(fp32_tower, pixels, grid), sglangs_forward(fp32_tower, pixels, grid)
    )
    report["fallback_logs"] = [record.getMessage() for record in records]

    by_name["qwen3_vl_graph_interpolation"].install(qwen3_vl)
    by_name["qwen3_vl_prepare_from_cache"].install(qwen3_vl)
    by_name["qwen3_vl_graph_forward_from_cache"].install(qwen3_vl)
    report["installed"] = f"{tower_class._prepare_graph_inputs.__module__}.{tower_class._prepare_graph_inputs.__name__}"
    forward = tower_class.forward_with_cuda_graph
    report["forward_installed"] = f"{forward.__module__}.{forward.__name__}"
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
        report["graph_forward"] = _graph_forward(tower_class, sglangs, sglangs_forward)
        report["embedding_in_graph"] = _embedding_in_graph(tower_class, sglangs, sglangs_forward)
        report["windows"] = _windowed_graph_forward(by_name["qwen2_5_vl_graph_forward_from_cache"])
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


class RecordingRunner:
    """Stands in for ``tower.graph_runners``: returns the arguments ``forward_with_cuda_graph`` ran it with."""

    def run(self, **arguments: Any) -> dict[str, Any]:
        return arguments


class RecordingAdapter(RecordingRunner):
    """Stands in for rocm-vit's adapter: ``run`` and ``run_embedding`` return what they were given."""

    def run_embedding(self, *arguments: Any) -> dict[str, Any]:
        return {"run_embedding": arguments}


def _embedding_in_graph(tower_class: Any, sglangs_prepare: Any, sglangs_forward: Any) -> dict[str, Any]:
    """Where the runner has ``run_embedding`` (rocm-vit's adapter) and the tower holds its whole position
    table: whether the hooked forward hands it the patches and the layout's cached tensors, and whether
    ``embed_patches`` on them (what the runner runs in its graphs) gives SGLang's ``x`` bit for bit. With the
    table split over ranks: whether ``run`` gets SGLang's arguments instead."""
    from rocm_vit.integrations.sglang import prepare

    result: dict[str, Any] = {}
    for dtype in (torch.float32, torch.bfloat16):
        tower = _tiny_tower(dtype)
        pixels, grid = _inputs(LAYOUTS["several_images"], dtype)
        tower.graph_runners = RecordingRunner()
        expected = _sglangs_forward(tower_class, sglangs_prepare, sglangs_forward, tower, pixels.clone(), grid)
        tower.graph_runners = RecordingAdapter()
        handed = [tower_class.forward_with_cuda_graph(tower, pixels.clone(), grid) for _ in range(2)]
        given, again = handed[0]["run_embedding"], handed[1]["run_embedding"]
        embedded = prepare.embed_patches(tower, given[0], *given[1])
        cached = prepare.prepared_layout(tower, tuple(map(tuple, grid.tolist())))
        result[str(dtype)[6:]] = {
            "x": _same_value(embedded, expected["x"]),
            "cos_sin": given[2] is cached.cos and given[3] is cached.sin,
            "taps_weights": given[1][0] is cached.taps and given[1][1] is cached.weights,
            "offsets": given[4] is cached.device_cu_seqlens and given[5] == cached.offsets,
            "same_tensors_again": all(
                a is b for a, b in zip((*given[1], *given[2:5]), (*again[1], *again[2:5]), strict=True)
            ),
        }
    tower = _tiny_tower(torch.bfloat16)
    tower.pos_embed.tp_size = 2  # split over two ranks: SGLang's lookup, before the runner
    tower.graph_runners = RecordingAdapter()
    pixels, grid = _inputs(LAYOUTS["video"], torch.bfloat16)
    result["split_table_runs"] = sorted(tower_class.forward_with_cuda_graph(tower, pixels, grid))
    return result


def _graph_forward(tower_class: Any, sglangs_prepare: Any, sglangs_forward: Any) -> dict[str, Any]:
    """Per dtype and layout, whether the hooked forward hands the runner SGLang's arguments, bit for bit.

    SGLang's forward runs with SGLang's ``_prepare_graph_inputs`` put back for the call. Also: whether two
    calls on a known layout hand over the same cached offsets tensor (nothing copied per call), and on a
    GPU whether a warm call (pixels already on the device) ran with no synchronizing op.
    """
    ours = tower_class.forward_with_cuda_graph
    result: dict[str, Any] = {}
    for dtype in (torch.float32, torch.bfloat16):
        tower = _tiny_tower(dtype)
        tower.graph_runners = RecordingRunner()
        for name in ("one_image", "several_images", "video"):
            pixels, grid = _inputs(LAYOUTS[name], dtype)
            expected = _sglangs_forward(tower_class, sglangs_prepare, sglangs_forward, tower, pixels.clone(), grid)
            first = ours(tower, pixels.clone(), grid)
            cached, synchronized = _warm_call(ours, tower, pixels.to(DEVICE), grid.tolist())
            result[f"{name}_{str(dtype)[6:]}"] = {
                "same": _same_runner_arguments(first, expected) and _same_runner_arguments(cached, expected),
                "offsets_cached": cached["cu_seqlens"] is first["cu_seqlens"],
                "synchronized": synchronized,
            }
    return result


def _sglangs_forward(tower_class: Any, sglangs_prepare: Any, sglangs_forward: Any, *arguments: Any) -> Any:
    """SGLang's ``forward_with_cuda_graph`` with SGLang's ``_prepare_graph_inputs`` put back for the call."""
    hooked = tower_class._prepare_graph_inputs
    tower_class._prepare_graph_inputs = sglangs_prepare
    try:
        return sglangs_forward(*arguments)
    finally:
        tower_class._prepare_graph_inputs = hooked


def _windowed_graph_forward(hook: Any) -> dict[str, Any]:
    """Qwen2.5-VL's hooked forward against SGLang's: the runner's arguments per dtype and layout, as above.

    Grids come as SGLang passes them (int64 tensors), warm calls also as int32; ops are counted for
    one image and for sixteen.
    """
    from sglang.srt.models import qwen2_5_vl

    tower_class = qwen2_5_vl.Qwen2_5_VisionTransformer
    sglangs = tower_class.forward_with_cuda_graph
    result: dict[str, Any] = {"mismatch": hook.mismatch(qwen2_5_vl)}
    hook.install(qwen2_5_vl)
    ours = tower_class.forward_with_cuda_graph
    result["installed"] = f"{ours.__module__}.{ours.__name__}"
    for dtype in (torch.float32, torch.bfloat16):
        tower = _tiny_tower(dtype, qwen2_5_vl=True)
        for name, layout in LAYOUTS.items():
            pixels, grid = _inputs(layout, dtype)
            grid = grid.to(torch.int64)
            expected = sglangs(tower, pixels.clone(), grid)
            first = ours(tower, pixels.clone(), grid)
            cached, synchronized = _warm_call(ours, tower, pixels.to(DEVICE), grid.to(torch.int32))
            result[f"{name}_{str(dtype)[6:]}"] = {
                "same": _same_runner_arguments(first, expected) and _same_runner_arguments(cached, expected),
                "offsets_cached": cached["cu_seqlens"] is first["cu_seqlens"],
                "synchronized": synchronized,
            }
        if dtype == torch.float32:
            result["ops_on_a_known_layout"] = {
                str(images): _ops_per_call(tower, ours, [(1, 4, 4)] * images) for images in (1, 16)
            }
    return result


def _warm_call(forward: Any, tower: Any, pixels: torch.Tensor, grid: Any) -> tuple[dict[str, Any], str | None]:
    """The runner's arguments, and on a GPU what waited for the device (sync debug mode's error) or ``None``."""
    if DEVICE != "cuda":
        return forward(tower, pixels, grid), None
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        return forward(tower, pixels, grid), None
    except RuntimeError as error:
        synchronized = str(error).splitlines()[0]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return forward(tower, pixels, grid), synchronized


def _same_runner_arguments(ours: dict[str, Any], expected: dict[str, Any]) -> bool:
    """Same keywords, each with the same value: tensors bit for bit in dtype, device and layout."""
    return ours.keys() == expected.keys() and all(_same_value(ours[name], expected[name]) for name in ours)


def _same_value(value: Any, other: Any) -> bool:
    if isinstance(value, torch.Tensor) and isinstance(other, torch.Tensor):
        return (
            value.dtype == other.dtype
            and value.device == other.device
            and value.is_contiguous() == other.is_contiguous()
            and value.shape == other.shape
            and torch.equal(value, other)
        )
    if isinstance(value, tuple) and isinstance(other, tuple) and len(value) == len(other):
        return all(_same_value(left, right) for left, right in zip(value, other, strict=True))
    return type(value) is type(other) and value == other


def _within_byte_budget(ours: Any, sglangs: Any) -> dict[str, Any]:
    """Layouts kept under a budget of two of these layouts, and the first one rebuilt once evicted."""
    from rocm_vit.integrations.sglang import prepare

    tower = _tiny_tower(torch.float32)
    grids = [LAYOUTS["wide_image"], LAYOUTS["tall_image_same_offsets"], [(1, 4, 4), (1, 4, 4)]]  # 32 patches each
    inputs = [_inputs(grid, torch.float32) for grid in grids]
    budget = prepare.LAYOUT_CACHE_BYTES
    # Room for the last two (the third holds one offset more), measured on a tower of its own.
    sizing_tower = _tiny_tower(torch.float32)
    prepare.LAYOUT_CACHE_BYTES = sum(
        prepare.prepared_layout(sizing_tower, tuple(grid)).device_bytes for grid in grids[1:]
    )
    try:
        for pixels, grid in inputs:
            ours(tower, pixels, grid)
        cache = prepare.tower_cache(tower)
        held = {"layouts": len(cache), "bytes": cache.bytes_held, "budget": prepare.LAYOUT_CACHE_BYTES}
        pixels, grid = inputs[0]
        return {**held, "evicted_again": _same(ours(tower, pixels, grid), sglangs(tower, pixels, grid))}
    finally:
        prepare.LAYOUT_CACHE_BYTES = budget


def _tiny_tower(dtype: torch.dtype, qwen2_5_vl: bool = False) -> torch.nn.Module:
    """Qwen3-VL's toy tower, head dim 16 on a CPU, 64 on a GPU (where SGLang's rotary class loads its own
    kernel for others); or Qwen2.5-VL's (head dim 16), with a ``RecordingRunner`` as its graph runner.
    """
    from sglang.srt.models.qwen2_5_vl import Qwen2_5_VisionTransformer
    from sglang.srt.models.qwen3_vl import Qwen3VLMoeVisionModel

    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(DEVICE):
            if qwen2_5_vl:
                tower = Qwen2_5_VisionTransformer(tiny_qwen2_5_vl_config()).eval()
                tower.cuda_graph_runner = RecordingRunner()
            else:
                config = tiny_qwen3_vl_config(hidden_size=64 if DEVICE == "cpu" else 256)
                tower = Qwen3VLMoeVisionModel(config).eval()
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
