"""The SGLang plugin against the real SGLang package, in a process of its own; prints a JSON report.

Run by tests/test_sglang_plugin.py (CPU) and tests/gpu/test_sglang_gpu.py (``--device cuda``) as
``python scenario.py REPORT.json [--device cuda]``. A separate process because the plugin patches
SGLang's modules for the life of the process, and importing SGLang patches transformers.

CPU steps, in order (each can only happen once per process):
1. SGLang's distributed state at world size 1 (gloo), as SGLang's own CPU layer tests set it up;
   a tiny ``Qwen3VLMoeVisionModel`` and its eager outputs before any plugin is loaded.
2. ``load_plugins()`` with ``SGLANG_PLUGINS`` naming another plugin: SGLang must be untouched.
3. ``rocm-vit doctor``'s SGLang section, and then ``load_plugins()`` for real, both with the SGLang
   version simulated as an untested release and one target (``launch_dp_worker``) changed: only
   that hook may be left out, with one warning.
4. An encode-server TP worker started the way SGLang starts it (``spawn``, the patched target), with
   a probe plugin that reports which hooks the child has.
5. The model again, under the plugin: eager output unchanged; with ``aiter_attn`` (rocm-vit's
   backend, its kernel replaced by a CPU stand-in) through SGLang's own ``forward_with_cuda_graph``
   and the adapter with stand-in graphs: graph output == eager output, bit for bit; and again under
   a tuned ROCm policy, where the slot picks a kernel per layout.
6. The same for SGLang's windowed ``Qwen2_5_VisionTransformer`` (partial windows, two images, a
   video, two layouts that share a graph but not a window permutation), and its ``_is_cuda`` graph
   gate with ROCm simulated: lifted under the plugin with a capturable backend, kept otherwise
   (step 2 checks it with the plugin excluded).

GPU (``--device cuda``): SGLang's tower with ``--attention`` (``triton_attn``; ``aiter_attn`` on
ROCm) under real CUDA/HIP graphs, graph == eager, exact and padded, and the padded buckets captured
as the server starts.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import inspect
import itertools
import json
import logging
import multiprocessing
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# Appended, not prepended: a working torchvision (GPU images) wins over the CPU stand-in.
sys.path.append(str(HERE))
sys.path.append(str(HERE.parent))  # tests/, for the stand-in graph mechanism

import torch  # noqa: E402
from env_vars import set_env  # noqa: E402
from toy_tower import tiny_qwen2_5_vl_config, tiny_qwen3_vl_config  # noqa: E402

# Grids (t, h, w) in patches. 4 attention layouts: (1, 4, 8) and (1, 8, 4) share one (a single
# segment of 32 patches); the third and fourth have 32 patches in segments with other boundaries.
GRIDS = [[(1, 4, 8)], [(1, 8, 4)], [(1, 4, 4), (2, 4, 2)], [(2, 4, 2), (1, 4, 4)], [(1, 6, 4)], [(1, 4, 8)]]
GRAPHED_LAYOUTS = 4
# Qwen2.5-VL grids with windows of 2 x 2 merge blocks (4 x 4 patches): full windows, partial ones
# ((1, 6, 10), the video), two images; (1, 4, 8) and (1, 8, 4) cut into the same segments (one graph)
# in other window orders. 6 attention layouts.
QWEN2_5_GRIDS = [[(1, 8, 8)], [(1, 4, 12)], [(1, 6, 10)], [(1, 6, 6), (1, 4, 8)], [(2, 4, 6)], [(1, 4, 8)], [(1, 8, 4)]]
PATCH_DIM = 3 * 2 * 4 * 4  # in_channels * temporal_patch_size * patch_size²
SGLANG_TARGETS = {
    "aiter_class": ("sglang.srt.layers.attention.vision", "VisionAiterAttention"),
    "rotary": ("sglang.srt.layers.attention.vision", "apply_rotary_pos_emb"),
    "rotary_eager": ("sglang.srt.layers.attention.vision", "apply_rotary_pos_emb_native_eager"),
    "runner": ("sglang.srt.multimodal.vit_cuda_graph_runner", "ViTCudaGraphRunner"),
    "runner_in_qwen3_vl": ("sglang.srt.models.qwen3_vl", "ViTCudaGraphRunner"),
    "runner_in_qwen2_5_vl": ("sglang.srt.models.qwen2_5_vl", "ViTCudaGraphRunner"),
    "qwen2_5_vl_init": ("sglang.srt.models.qwen2_5_vl", "Qwen2_5_VisionTransformer.__init__"),
    "tp_worker": ("sglang.srt.disaggregation.encoder.server", "launch_encoder"),
    "tp_worker_in_runtime": ("sglang.srt.disaggregation.encoder.runtime", "launch_encoder"),
    "dp_worker": ("sglang.srt.disaggregation.encoder.runtime", "launch_dp_worker"),
    "init_cuda_graphs": ("sglang.srt.model_executor.model_runner", "ModelRunner.init_cuda_graphs"),
    "encoder_precompile": ("sglang.srt.disaggregation.encoder.server", "maybe_precompile_model_kernels_after_loading"),
    # The same function object: ModelRunner's must stay SGLang's (its buckets come at init_cuda_graphs).
    "runner_precompile": ("sglang.srt.model_executor.model_runner", "maybe_precompile_model_kernels_after_loading"),
    # The same function objects serve the language models' rotary: they must stay SGLang's.
    "llm_rotary": ("sglang.srt.layers.rotary_embedding.utils", "apply_rotary_pos_emb_native"),
    "llm_rotary_eager": ("sglang.srt.layers.rotary_embedding.utils", "apply_rotary_pos_emb_native_eager"),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("report", type=Path)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--attention", default="triton_attn", help="SGLang's ViT backend on a GPU")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    records = _capture_rocm_vit_logs()
    started = time.perf_counter()
    report: dict[str, Any] = {}
    report["sgl_kernel"] = _sgl_kernel_standin_where_missing()
    try:
        import sglang.srt.models.qwen3_vl  # noqa: F401
    except ImportError as error:  # a package missing from the image: the test skips or fails, saying which
        failure = {"import_error": f"{type(error).__name__}: {error}", "missing_module": error.name}
        args.report.write_text(json.dumps(failure))
        return
    _init_sglang(args.device)
    if args.device == "cpu":
        _cpu_scenario(report, records)
    else:
        _gpu_scenario(report, records, args.attention)
    report["seconds"] = round(time.perf_counter() - started, 1)
    args.report.write_text(json.dumps(report, indent=1))


def _sgl_kernel_standin_where_missing() -> str:
    """On a CUDA torch without ``sglang-kernel`` (which cannot reach the GPU machines), the test
    stand-in whose every function raises: SGLang imports names from it as its layers load."""
    if importlib.util.find_spec("sgl_kernel") is not None:
        return "installed"
    if torch.version.cuda:
        sys.path.append(str(HERE / "sgl_kernel_standin"))
        return "stand-in"
    return "absent"


def _cpu_scenario(report: dict[str, Any], records: list[logging.LogRecord]) -> None:
    import sglang.srt.plugins
    from rocm_vit.backends import aiter_attn
    from sglang.srt.disaggregation.encoder import runtime  # imports encoder.server too
    from sglang.srt.layers.attention import vision
    from sglang.srt.models import qwen2_5_vl, qwen3_vl

    import rocm_vit.integrations.sglang as plugin
    import rocm_vit.integrations.sglang.qwen2_5_vl as plugin_qwen2_5_vl
    from rocm_vit.cli import doctor
    from rocm_vit.integrations.sglang import hooks, imports
    from rocm_vit.integrations.sglang.attention import AiterVisionAttention, rotary_pos_emb
    from rocm_vit.integrations.sglang.graph_runner import ViTGraphRunnerAdapter

    generator = torch.Generator().manual_seed(0)
    reference = _tiny_model("cpu")
    _randomise(reference, generator)
    state = reference.state_dict()
    inputs = [(torch.randn(_patches(grid), PATCH_DIM, generator=generator), grid) for grid in GRIDS]
    eager_before = _run(reference, inputs, graphs=False)
    reference_2_5 = _tiny_qwen2_5_vl("cpu")
    _randomise(reference_2_5, generator)
    state_2_5 = reference_2_5.state_dict()
    inputs_2_5 = [(torch.randn(_patches(grid), PATCH_DIM, generator=generator), grid) for grid in QWEN2_5_GRIDS]
    eager_before_2_5 = _run_2_5(reference_2_5, inputs_2_5, graphs=False)
    # From here on the plugin's gate believes it runs on ROCm (SGLang's own _is_cuda stays False).
    plugin_qwen2_5_vl.current_platform = lambda: "rocm"

    # 2. SGLANG_PLUGINS names another plugin: rocm-vit is skipped and SGLang is untouched.
    before = _targets()
    os.environ["SGLANG_PLUGINS"] = "another_plugin"
    sglang.srt.plugins.load_plugins()
    report["excluded"] = {
        "untouched": _targets() == before,
        "aiter_in_table": vision.QKV_BACKEND_IMPL["aiter_attn"] is vision.VisionAiterAttention,
        "rocm_vit_loaded": plugin._loaded,
        "pending_imports": list(imports.pending()),
        "qwen2_5_vl_gate": _graph_gate(None),  # SGLang's aiter_attn refuses a CPU
    }
    del os.environ["SGLANG_PLUGINS"]
    sglang.srt.plugins._plugins_loaded = False  # load_plugins() runs once per process otherwise

    # 3. An untested SGLang release in which launch_dp_worker changed: only that hook is left out.
    def launch_dp_worker(server_args: Any, dp_rank: int) -> None:
        """Stands for a changed entry point in a later SGLang release."""

    runtime.launch_dp_worker = launch_dp_worker
    hooks.sglang_version = lambda: "0.5.99"
    report["doctor"] = doctor.collect()["sglang"]
    records.clear()
    sglang.srt.plugins.load_plugins()
    report["load"] = {
        "warnings": [r.getMessage() for r in records if r.levelno >= logging.WARNING],
        "applied": [r.getMessage() for r in records if r.getMessage().startswith("rocm-vit: applied hook")],
        "pending_imports": list(imports.pending()),
    }
    report["targets"] = _targets()
    report["aiter_in_table"] = _qualname(vision.QKV_BACKEND_IMPL["aiter_attn"])
    report["interpolation"] = _qualname(qwen3_vl.Qwen3VLMoeVisionModel.fast_pos_embed_interpolate)
    report["known_versions"] = list(hooks.TESTED_SGLANG_VERSIONS)
    report["same_parameters"] = {
        f"{module}.{name}": _parameters(imports.original(module, name), path) == _parameters(ours, path)
        for module, name, path, ours in (
            ("sglang.srt.multimodal.vit_cuda_graph_runner", "ViTCudaGraphRunner", "run", ViTGraphRunnerAdapter),
            ("sglang.srt.layers.attention.vision", "VisionAiterAttention", "forward", AiterVisionAttention),
            ("sglang.srt.layers.attention.vision", "apply_rotary_pos_emb", "", rotary_pos_emb),
        )
    }

    # 4. A TP worker of the encode server, spawned by the patched target.
    worker, worker_report = _spawn_tp_worker(runtime.launch_encoder)

    # 5. Under the plugin: eager unchanged (SDPA), also through the graph path (SGLang's sdpa cannot
    # be captured: SGLang's eager blocks serve it), and aiter_attn graph == eager.
    model = _tiny_model("cpu")
    model.load_state_dict(state)
    report["runner_class"] = _qualname(type(model.graph_runners))
    report["eager_unchanged"] = _max_difference(_run(model, inputs, graphs=False), eager_before)
    report["sdpa_graph_path"] = {
        "bitwise_equal": [
            torch.equal(a, b) for a, b in zip(_run(model, inputs, graphs=True), eager_before, strict=True)
        ],
        "serves_graphs": model.graph_runners.serves_graphs,
    }
    aiter_kernel = aiter_attn.aiter_varlen_attention
    _stand_in_aiter_kernel()
    model = _tiny_model("cpu", attention="aiter_attn")
    model.load_state_dict(state)
    report["backend_class"] = _qualname(type(model.blocks[0].attn.qkv_backend))
    eager = _run(model, inputs, graphs=False)
    report["aiter_vs_sdpa"] = _max_difference(eager, eager_before)
    report["graph_vs_eager"] = _graph_vs_eager(model, inputs, eager, _stand_in_mechanism())
    report["graph_vs_eager_padded"] = _graph_vs_eager(model, inputs, eager, _stand_in_mechanism(), padding=True)
    report["buckets_at_start"] = _buckets_at_start(model, _stand_in_mechanism())
    report["eager_warm_up_at_start"] = _eager_warm_up_at_start(model)
    report["adapter_safety"] = _adapter_safety(model, inputs, eager)
    report["tuned"] = _tuned_aiter_slot(state, inputs, eager_before)

    # 6. Qwen2.5-VL: eager unchanged, the gate, and windowed graph == eager.
    model = _tiny_qwen2_5_vl("cpu")
    model.load_state_dict(state_2_5)
    report["qwen2_5_vl"] = {"eager_unchanged": _max_difference(_run_2_5(model, inputs_2_5, False), eager_before_2_5)}
    report["qwen2_5_vl"]["gate"] = {
        "aiter_attn": _graph_gate("aiter_attn"),
        "sglang_default": _graph_gate(None),  # SGLang's sdpa on a CPU: not capturable
        "aiter_attn_on_cpu": _graph_gate("aiter_attn", platform="cpu"),
        "aiter_attn_graphs_off": _graph_gate("aiter_attn", graphs=False),
        # A capturable backend, but settings the runner refuses: no runner, so the gate stays shut.
        "aiter_attn_no_runner": _graph_gate("aiter_attn", environ={"SGLANG_VIT_CUDA_GRAPH_MIN_HITS": "0"}),
    }
    model = _tiny_qwen2_5_vl("cpu", attention="aiter_attn")
    model.load_state_dict(state_2_5)
    eager = _run_2_5(model, inputs_2_5, graphs=False)
    report["qwen2_5_vl"]["aiter_vs_sdpa"] = _max_difference(eager, eager_before_2_5)
    model.cuda_graph_runner = ViTGraphRunnerAdapter(model, mechanism=_stand_in_mechanism())
    graphed = _run_2_5(model, inputs_2_5, graphs=True)
    again = _run_2_5(model, inputs_2_5, graphs=True)
    stats = model.cuda_graph_runner.stats()
    report["qwen2_5_vl"]["graph_vs_eager"] = {
        "bitwise_equal": [torch.equal(a, b) for a, b in zip(graphed + again, eager + eager, strict=True)],
        "captures": stats["captures"],
        "replays": stats["replays"],
        "eager_runs": stats["eager_runs"],
        "graphs": stats["graphs"],
    }
    plugin_qwen2_5_vl.current_platform = lambda: "cpu"
    del qwen2_5_vl  # imported above so that its hook lands during load_plugins()

    # 7. Last, as it puts the real aiter kernel wrapper back over the fake of step 5.
    report["fallback"] = _fallback_serves_every_request(state, inputs, aiter_kernel)

    worker.join(timeout=180)
    report["worker"] = {
        "exitcode": worker.exitcode,
        "facts": json.loads(worker_report.read_text()) if worker_report.exists() else None,
    }


def _gpu_scenario(report: dict[str, Any], records: list[logging.LogRecord], attention: str) -> None:
    import sglang.srt.plugins

    import rocm_vit.integrations.sglang as plugin

    sglang.srt.plugins.load_plugins()
    # GPU tiers run the checkout from PYTHONPATH, where rocm-vit's entry point may not be installed.
    report["loaded_by"] = "entry point" if plugin._loaded else "rocm_vit.integrations.sglang.load()"
    plugin.load()
    report["applied"] = [r.getMessage() for r in records if r.getMessage().startswith("rocm-vit: applied hook")]
    generator = torch.Generator().manual_seed(0)
    model = _tiny_model("cuda", torch.bfloat16, attention=attention)
    _randomise(model, generator)
    inputs = [(torch.randn(_patches(grid), PATCH_DIM, generator=generator).cuda(), grid) for grid in GRIDS]
    report["runner_class"] = _qualname(type(model.graph_runners))
    report["backend"] = model.blocks[0].attn.qkv_backend_name
    eager = _run(model, inputs, graphs=False)
    report["graph_vs_eager"] = _graph_vs_eager(model, inputs, eager, None)
    report["graph_vs_eager_padded"] = _graph_vs_eager(model, inputs, eager, None, padding=True)
    report["buckets_at_start"] = _buckets_at_start(model, None)


def _init_sglang(device: str) -> None:
    """World size 1 over gloo (NCCL on a GPU): the same set-up as ``rocm-vit bench-sglang``'s worker."""
    from rocm_vit.integrations.sglang import standalone

    standalone.init_world(device, role="test")


def _tiny_model(device: str, dtype: torch.dtype = torch.float32, attention: str | None = None) -> torch.nn.Module:
    """SGLang's Qwen3-VL tower at toy sizes; ``attention`` is ``--mm-attention-backend`` (default: SGLang's).

    Head dim 16 on a CPU; 64 on a GPU, where SGLang's rotary class would otherwise load its own
    kernel for other head sizes.
    """
    from sglang.srt.models.qwen3_vl import Qwen3VLMoeVisionModel
    from sglang.srt.runtime_context import get_mm

    config = tiny_qwen3_vl_config(hidden_size=64 if device == "cpu" else 256)
    # SGLang's model loader builds under the checkpoint's default dtype; rotary caches stay fp32 on GPUs.
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device), get_mm().override(mm_attention_backend=attention):
            return Qwen3VLMoeVisionModel(config).eval()
    finally:
        torch.set_default_dtype(default_dtype)


def _tiny_qwen2_5_vl(device: str, attention: str | None = None) -> torch.nn.Module:
    """SGLang's Qwen2.5-VL tower at toy sizes: 4 blocks, full attention in 1 and 3, 2 x 2 merge-block windows."""
    from sglang.srt.models.qwen2_5_vl import Qwen2_5_VisionTransformer
    from sglang.srt.runtime_context import get_mm

    config = tiny_qwen2_5_vl_config()
    with torch.device(device), get_mm().override(mm_attention_backend=attention):
        return Qwen2_5_VisionTransformer(config).eval()


def _graph_gate(
    attention: str | None, platform: str = "rocm", graphs: bool = True, environ: dict[str, str] | None = None
) -> dict[str, Any]:
    """What Qwen2.5-VL's tower decides about graphs when built on ``platform`` (as the plugin's gate sees it)."""
    import rocm_vit.integrations.sglang.qwen2_5_vl as plugin_qwen2_5_vl

    simulated = plugin_qwen2_5_vl.current_platform
    plugin_qwen2_5_vl.current_platform = lambda: platform
    variables = {"SGLANG_VIT_ENABLE_CUDA_GRAPH": "1" if graphs else "0", **(environ or {})}
    try:
        with set_env(variables):
            model = _tiny_qwen2_5_vl("cpu", attention=attention)
    finally:
        plugin_qwen2_5_vl.current_platform = simulated
    runner = model.cuda_graph_runner
    return {"enable_cg": model.enable_cg, "runner": None if runner is None else _qualname(type(runner))}


def _randomise(model: torch.nn.Module, generator: torch.Generator) -> None:
    # SGLang allocates parameters with torch.empty: fill them, reproducibly (norm weights near 1).
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            values = torch.randn(parameter.shape, generator=generator) * 0.1
            parameter.copy_(values + 1.0 if "norm" in name and name.endswith("weight") else values)


def _patches(grid: list[tuple[int, int, int]]) -> int:
    return sum(t * h * w for t, h, w in grid)


@torch.no_grad()
def _run(model: torch.nn.Module, inputs: list, graphs: bool) -> list[torch.Tensor]:
    os.environ["SGLANG_VIT_ENABLE_CUDA_GRAPH"] = "1" if graphs else "0"
    try:
        return [model(pixels, torch.tensor(grid, dtype=torch.int32)) for pixels, grid in inputs]
    finally:
        del os.environ["SGLANG_VIT_ENABLE_CUDA_GRAPH"]


@torch.no_grad()
def _run_2_5(model: torch.nn.Module, inputs: list, graphs: bool) -> list[torch.Tensor]:
    # Qwen2.5-VL decides at construction (enable_cg); SGLang's forward then takes one path or the other.
    model.enable_cg = graphs
    return [model(pixels, torch.tensor(grid, dtype=torch.int32)) for pixels, grid in inputs]


def _graph_vs_eager(
    model: torch.nn.Module,
    inputs: list,
    eager: list[torch.Tensor],
    mechanism: Any,
    padding: bool = False,
) -> dict:
    """Graph path (SGLang's forward_with_cuda_graph -> the adapter) against the runner's own eager
    calls (capacity 0, padded alike with ``padding``), bit for bit, and against SGLang's ``eager``.

    Captured inside the triggering call, which its graph's first replay serves. The runner's eager
    calls run the same blocks as its graphs (rocm-vit's fused glue where it recognises the tower);
    SGLang's eager forward runs SGLang's blocks: the accuracy reference, bit for bit only where the
    fused kernels do not run (a CPU's plain ops) and nothing is padded."""
    from rocm_vit.integrations.sglang.graph_runner import ViTGraphRunnerAdapter

    def adapter_with(**environ: str) -> ViTGraphRunnerAdapter:
        with set_env({"SGLANG_VIT_CUDA_GRAPH_PADDING": str(int(padding)), **environ}):
            return ViTGraphRunnerAdapter(model, mechanism=mechanism)

    model.graph_runners = adapter_with(SGLANG_VIT_CUDA_GRAPH_CACHE_CAPACITY="0")
    runner_eager = _run(model, inputs, graphs=True)
    adapter = model.graph_runners = adapter_with()

    graphed = _run(model, inputs, graphs=True)
    kept = graphed[0].clone()
    again = _run(model, inputs, graphs=True)  # every layout replays now
    stats = adapter.stats()
    return {
        "bitwise_equal": [torch.equal(a, b) for a, b in zip(graphed + again, runner_eager * 2, strict=True)],
        "equal_to_sglangs_eager": [torch.equal(a, b) for a, b in zip(graphed + again, eager * 2, strict=True)],
        "max_difference_from_sglangs_eager": _max_difference(graphed + again, eager + eager),
        "sglangs_eager_max_abs": max(float(out.float().abs().max()) for out in eager),
        "blocks": stats["blocks"],
        "first_output_survives_replays": torch.equal(graphed[0], kept),
        "captures": stats["captures"],
        "replays": stats["replays"],
        "eager_runs": stats["eager_runs"],
        "graphs": stats["graphs"],
        "staging_bytes": stats["staging_bytes"],
        **{name: stats[name] for name in ("capacity", "min_hits", "max_tokens", "budget_bytes")},
    }


def _buckets_at_start(model: torch.nn.Module, mechanism: Any) -> dict[str, Any]:
    """What ``ModelRunner.init_cuda_graphs`` (rocm-vit's hook) does after SGLang's graphs, on a model
    holding SGLang's tower: the padded buckets captured, and one-image requests of those buckets
    then served from them, each equal to the runner's padded eager call (capacity 0) bit for bit.
    Staging for 1,024 tokens here: several buckets."""
    from rocm_vit.integrations.sglang.graph_runner import ViTGraphRunnerAdapter
    from rocm_vit.integrations.sglang.startup import capture_vit_buckets

    generator = torch.Generator().manual_seed(7)
    grids = [[(1, 4, 8)], [(1, 6, 4)], [(1, 12, 6)], [(1, 14, 14)], [(1, 20, 20)], [(1, 24, 30)], [(1, 16, 36)]]
    requests = [(torch.randn(_patches(grid), PATCH_DIM, generator=generator), grid) for grid in grids]
    holder = torch.nn.ModuleDict({"visual": model})  # as SGLang's Qwen3VLForConditionalGeneration holds it

    def adapter_with(**environ: str) -> ViTGraphRunnerAdapter:
        environ = {"SGLANG_VIT_ENABLE_CUDA_GRAPH": "1", "SGLANG_VIT_CUDA_GRAPH_MAX_TOKENS": "1024", **environ}
        with set_env(environ):
            model.graph_runners = ViTGraphRunnerAdapter(model, mechanism=mechanism)
        return model.graph_runners

    adapter_with(SGLANG_VIT_CUDA_GRAPH_CACHE_CAPACITY="0")
    eager_padded = _run(model, requests, graphs=True)
    # A server starts with SGLANG_VIT_ENABLE_CUDA_GRAPH=1 for its whole life, and SGLang's own
    # backends (triton_attn) read it at every call to take the list-shaped cu_seqlens of graph mode.
    with set_env({"SGLANG_VIT_ENABLE_CUDA_GRAPH": "1"}):
        switched_off = adapter_with(SGLANG_VIT_CUDA_GRAPH_CAPTURE_BUCKETS="0")
        switched_off_captured = capture_vit_buckets(holder)
        adapter = adapter_with()
        captured = capture_vit_buckets(holder)
    at_start = adapter.stats()
    served = _run(model, requests, graphs=True)
    stats = adapter.stats()
    return {
        "captured": captured,
        "bucket_calls": len(adapter._runner.padding.bucket_call_grids(model.spatial_merge_size)),
        "captures_at_start": at_start["captures"],
        "captures_while_serving": stats["captures"] - at_start["captures"],
        "replays": stats["replays"] - at_start["replays"],
        "requests": len(requests),
        "bitwise_equal": [torch.equal(a, b) for a, b in zip(served, eager_padded, strict=True)],
        "switched_off": [switched_off_captured, switched_off.stats()["captures"]],
    }


def _eager_warm_up_at_start(model: torch.nn.Module) -> dict[str, Any]:
    """With ViT graphs off, rocm-vit's hook at ``init_cuda_graphs`` runs one eager call of SGLang's
    tower: the rotary call patterns (``rotary._call_pattern``, what a compile depends on) of later
    requests, under ``no_grad`` and ``inference_mode``, must be among the warm-up's."""
    from rocm_vit import rotary
    from rocm_vit.integrations.sglang import attention
    from rocm_vit.integrations.sglang.graph_runner import ViTGraphRunnerAdapter
    from rocm_vit.integrations.sglang.startup import capture_vit_buckets

    patterns = []
    apply_rotary = attention.apply_rotary

    def recording(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
        patterns.append(rotary._call_pattern(q, k, cos, sin))
        apply_rotary(q, k, cos, sin)

    grid = [(1, 12, 16)]
    request = (torch.randn(_patches(grid), PATCH_DIM, generator=torch.Generator().manual_seed(9)), grid)
    attention.apply_rotary = recording
    try:
        with set_env({"SGLANG_VIT_ENABLE_CUDA_GRAPH": "0"}):
            model.graph_runners = ViTGraphRunnerAdapter(model, mechanism=_stand_in_mechanism())
            captured = capture_vit_buckets(torch.nn.ModuleDict({"visual": model}))
        at_start = set(patterns)
        patterns.clear()
        for grad_mode in (torch.no_grad, torch.inference_mode):
            with grad_mode():
                _run(model, [request], graphs=False)
    finally:
        attention.apply_rotary = apply_rotary
    return {
        "captured": captured,
        "patterns_at_start": len(at_start),
        "rotary_calls_in_requests": len(patterns),
        "patterns_new_in_requests": len(set(patterns) - at_start),
    }


def _parameters(obj: Any, path: str) -> list[str]:
    return list(inspect.signature(getattr(obj, path) if path else obj).parameters)


def _max_difference(left: list[torch.Tensor], right: list[torch.Tensor]) -> float:
    return max(float((a.float() - b.float()).abs().max()) for a, b in zip(left, right, strict=True))


def _stand_in_aiter_kernel() -> None:
    """rocm-vit's aiter_attn on a CPU: aiter's kernel replaced by per-segment SDPA, nothing else."""
    from rocm_vit.backends import aiter_attn
    from rocm_vit.backends.sdpa import sdpa_varlen

    from rocm_vit.attention import AiterAttention

    def attend(q, k, v, cu_seqlens: torch.Tensor, max_seqlen: int, scale: float, pad_head_dim_to=None) -> torch.Tensor:
        assert isinstance(max_seqlen, int), f"max_seqlen must be a host int, got {type(max_seqlen).__name__}"
        offsets = cu_seqlens.tolist()
        return sdpa_varlen(q, k, v, [end - start for start, end in itertools.pairwise(offsets)], scale)

    aiter_attn.aiter_varlen_attention = attend
    AiterAttention.unavailable_reason = classmethod(lambda cls, platform: None)


def _tuned_aiter_slot(state: dict, inputs: list, eager_before: list[torch.Tensor]) -> dict:
    """With a tuned profile in force on ROCm, SGLang's aiter_attn slot runs the policy's ``auto``: each
    layout on the kernel the profile measured fastest, eagerly and through the adapter's graphs alike.

    The profile makes SDPA 2x faster than aiter for one 32-token segment and aiter 2x faster for
    three short ones; calls to each kernel are counted.
    """
    from rocm_vit.backends import aiter_attn

    from rocm_vit import policy
    from rocm_vit.attention import SdpaAttention
    from rocm_vit.profile import AttentionTiming, TunedProfile
    from rocm_vit.settings import Settings

    facts = policy.Facts("rocm", "gfx950", "stand-in", modules=frozenset({"aiter"}))
    timings = (
        AttentionTiming("1x32", (32,), {"aiter_attn": 1.0, "sdpa": 0.5}, 16),
        AttentionTiming("16+8+8", (16, 8, 8), {"aiter_attn": 0.5, "sdpa": 1.0}, 16),
    )
    profile = TunedProfile(key={}, preset="tiny", created="-", attention=timings)
    calls: dict[str, int] = {"sdpa": 0, "aiter": 0}
    sdpa_call, aiter_kernel = SdpaAttention.__call__, aiter_attn.aiter_varlen_attention

    def counted_sdpa(self, *args):
        calls["sdpa"] += 1
        return sdpa_call(self, *args)

    def counted_aiter(*args, **kwargs):
        calls["aiter"] += 1
        return aiter_kernel(*args, **kwargs)

    SdpaAttention.__call__, aiter_attn.aiter_varlen_attention = counted_sdpa, counted_aiter
    try:
        with policy.use_policy(policy.resolve_policy(facts, Settings(use_aiter=True), profile)):
            model = _tiny_model("cpu", attention="aiter_attn")
            model.load_state_dict(state)
            backend = _qualname(type(model.blocks[0].attn.qkv_backend.attention))
            eager = _run(model, inputs, graphs=False)
            eager_calls = dict(calls)
            calls.update(sdpa=0, aiter=0)
            graphs = _graph_vs_eager(model, inputs, eager, _stand_in_mechanism())
            graph_calls = dict(calls)
            reads, metadata_vs_sdpa = _host_reads_per_forward()
    finally:
        SdpaAttention.__call__, aiter_attn.aiter_varlen_attention = sdpa_call, aiter_kernel
    return {
        "backend": backend,
        "eager_calls": eager_calls,
        "graph_calls": graph_calls,
        "bitwise_equal": graphs["bitwise_equal"],
        "vs_sdpa": _max_difference(eager, eager_before),
        "host_reads_after_each_forward": reads,
        "metadata_path_vs_sdpa": metadata_vs_sdpa,
    }


class _CountedReads(torch.Tensor):
    """Offsets whose host reads are counted (on a GPU each is a sync)."""

    reads = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") == "tolist":
            cls.reads += 1
        return super().__torch_function__(func, types, args, kwargs or {})


def _host_reads_per_forward() -> tuple[list[int], float]:
    """Three tuned aiter_attn layers given SGLang's metadata, as its eager forward passes it, twice."""
    from sglang.srt.layers.attention.vision import VisionAttentionMetadata

    from rocm_vit.integrations.sglang.attention import AiterVisionAttention

    layers = [AiterVisionAttention(head_dim=16) for _ in range(3)]
    q, k, v = torch.randn(3, 32, 4, 16, generator=torch.Generator().manual_seed(3)).unbind(0)
    expected = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(0, 1) for t in (q, k, v)))
    reads, difference = [], 0.0
    _CountedReads.reads = 0
    for _ in range(2):
        offsets = torch.tensor([0, 32], dtype=torch.int32).as_subclass(_CountedReads)
        metadata = VisionAttentionMetadata(cu_seqlens=offsets, seq_lens=offsets[1:] - offsets[:-1], max_seqlen=32)
        for layer in layers:
            out = layer(q, k, v, None, 1, 32, forward_metadata=metadata)
            difference = max(difference, float((out - expected.transpose(0, 1)).abs().max()))
        reads.append(_CountedReads.reads)
    return reads, difference


class _UpstreamCalled(Exception):
    """Raised by a stand-in for SGLang's own runner: the adapter handed the call over."""


def _adapter_safety(model: torch.nn.Module, inputs: list, eager: list[torch.Tensor]) -> dict:
    """A tower whose blocks do not fit is left to SGLang's runner; a failing call hands the tower to
    SGLang's eager blocks for good, never to SGLang's runner (which raises for aiter_attn)."""
    from rocm_vit.integrations.sglang.graph_runner import ViTGraphRunnerAdapter

    mergers = model.deepstack_merger_list
    model.deepstack_merger_list = torch.nn.ModuleList(list(mergers)[:-1])  # one merger short
    refused = ViTGraphRunnerAdapter(model, mechanism=_stand_in_mechanism()).stats()
    model.deepstack_merger_list = mergers

    adapter = model.graph_runners = ViTGraphRunnerAdapter(model, mechanism=_stand_in_mechanism())
    runner_calls: list[int] = []

    def failing_run(*args: Any, **kwargs: Any) -> torch.Tensor:
        runner_calls.append(1)
        raise RuntimeError("stand-in: a failure inside rocm-vit's path")

    def upstream_run(*args: Any) -> torch.Tensor:
        raise _UpstreamCalled

    adapter._runner.run = failing_run
    adapter._upstream.run = upstream_run
    served = []
    handed_over = 0
    for _ in range(3):
        try:
            served.append(torch.equal(_run(model, inputs[:1], graphs=True)[0], eager[0]))
        except _UpstreamCalled:
            handed_over += 1
    stats = adapter.stats()
    return {
        "untouched_input": _fallback_from_the_callers_input(model, inputs, eager),
        "refused": {"stopped": refused["stopped"], "graphs": refused.get("graphs")},
        "runner_calls": len(runner_calls),
        "handed_over": handed_over,
        "served_equal_to_eager": served,
        "failures": stats["failures"],
        "stopped": stats["stopped"],
    }


def _fallback_from_the_callers_input(model: torch.nn.Module, inputs: list, eager: list[torch.Tensor]) -> bool:
    """A runner whose eager run fails midway (its second block's fc2 raises once), after its first
    block ran: SGLang's eager blocks (which add into their input in place) serve the call from the
    caller's input, which the runner never wrote, equal to SGLang's eager forward."""
    from rocm_vit.integrations.sglang.graph_runner import ViTGraphRunnerAdapter

    # Every call eager in the runner, unpadded (a padded run takes padded copies of its inputs).
    with set_env({"SGLANG_VIT_CUDA_GRAPH_CACHE_CAPACITY": "0", "SGLANG_VIT_CUDA_GRAPH_PADDING": "0"}):
        model.graph_runners = ViTGraphRunnerAdapter(model, mechanism=_stand_in_mechanism())
    fc2 = model.blocks[1].mlp.linear_fc2  # called by rocm-vit's fused blocks and SGLang's alike

    def fails_once(*args: Any, **kwargs: Any) -> torch.Tensor:
        del fc2.forward  # SGLang's own from now on
        raise RuntimeError("stand-in: the second block fails")

    fc2.forward = fails_once
    served = _run(model, inputs[:1], graphs=True)[0]
    return model.graph_runners.stats()["failures"] == 1 and torch.equal(served, eager[0])


def _fp16_aiter_builds(state: dict, inputs: list) -> dict[str, list[str]]:
    """An fp16 tower on the aiter stand-in: SGLang's image ships no fp16 module, so the slot builds
    it while the model is constructed; the requests, eager and through graphs, build nothing."""
    from rocm_vit.emulation import aiter_standin
    from rocm_vit.integrations.sglang.graph_runner import ViTGraphRunnerAdapter

    builds = aiter_standin.reset_builds()
    model = _tiny_model("cpu", torch.float16, attention="aiter_attn")
    model.load_state_dict(state)
    at_construction = list(builds.compiled)
    requests = [(pixels.to(torch.float16), grid) for pixels, grid in inputs[:3]]
    _run(model, requests, graphs=False)
    model.graph_runners = ViTGraphRunnerAdapter(model, mechanism=_stand_in_mechanism())
    _run(model, requests, graphs=True)
    return {
        "compiled_at_construction": at_construction,
        "compiled_in_requests": builds.compiled[len(at_construction) :],
    }


def _fallback_serves_every_request(state: dict, inputs: list, aiter_kernel: Callable) -> dict:
    """aiter_attn on the emulation's aiter stand-in (aiter's signature and checks), bf16, with SGLang's
    real runner behind the adapter: rocm-vit's runner fails on a replay of a graph that served before
    (a new graph's failed check is the runner's own to handle); that request and the rest are
    served by SGLang's eager blocks, each equal to SGLang's eager forward bit for bit."""
    from rocm_vit.backends import aiter_attn

    from rocm_vit.emulation import aiter_standin
    from rocm_vit.integrations.sglang.graph_runner import ViTGraphRunnerAdapter

    aiter_attn.aiter_varlen_attention = aiter_kernel  # step 5 replaced it with a fake
    installed = aiter_standin.install()
    builds = aiter_standin.reset_builds()
    model = _tiny_model("cpu", torch.bfloat16, attention="aiter_attn")
    model.load_state_dict(state)
    compiled_at_construction = list(builds.compiled)
    requests = [inputs[index % len(inputs)] for index in range(51)]
    requests = [(pixels.to(torch.bfloat16), grid) for pixels, grid in requests]
    eager = _run(model, requests, graphs=False)
    mechanism = _stand_in_mechanism()
    mechanism.fail_later_replays = 1
    adapter = model.graph_runners = ViTGraphRunnerAdapter(model, mechanism=mechanism)
    try:
        served = _run(model, requests, graphs=True)
        error = None
    except Exception as raised:  # what a request would have seen
        served, error = [], f"{type(raised).__name__}: {raised}"
    stats = adapter.stats()
    return {
        "stand_in": installed,
        "aiter_builds": {
            "compiled_at_construction": compiled_at_construction,
            "compiled_in_requests": builds.compiled[len(compiled_at_construction) :],
            "loaded": sorted(set(builds.loaded)),
            "fp16": _fp16_aiter_builds(state, inputs),
        },
        "upstream_runner": _qualname(type(adapter._upstream)),
        "error": error,
        "served": len(served),
        "bitwise_equal": [torch.equal(a, b) for a, b in zip(served, eager, strict=False)],
        "failures": stats["failures"],
        "serves_graphs": adapter.serves_graphs,
        "blocks_after": stats["blocks"],
    }


def _stand_in_mechanism() -> Any:
    from test_graph_runner import StandInGraphs

    return StandInGraphs()


def _spawn_tp_worker(target: Callable) -> tuple[multiprocessing.process.BaseProcess, Path]:
    """Start ``target`` as SGLang's encode server starts TP ranks >= 1, with a probe plugin on the path."""
    from sglang.srt.server_args import ServerArgs

    worker_report = Path(tempfile.mkdtemp()) / "worker.json"
    sys.path.append(str(HERE / "probe"))  # only the child loads plugins after this point
    context = multiprocessing.get_context("spawn")
    # SGLang's launch_local_runtime: target=launch_encoder, args=(server_args, schedule_path,
    # dist_init_method, rank); the probe's run_encoder writes its report to schedule_path.
    process = context.Process(
        target=target, args=(ServerArgs(model_path="dummy"), str(worker_report), "tcp://127.0.0.1:1", 1), daemon=True
    )
    process.start()
    return process, worker_report


def _targets() -> dict[str, str]:
    return {
        key: _qualname(functools.reduce(getattr, name.split("."), importlib.import_module(module)))
        for key, (module, name) in SGLANG_TARGETS.items()
    }


def _qualname(obj: Any) -> str:
    return f"{obj.__module__}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"


def _capture_rocm_vit_logs() -> list[logging.LogRecord]:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("rocm_vit")
    logger.addHandler(Keep())
    logger.setLevel(logging.INFO)
    return records


if __name__ == "__main__":
    main()
