"""What SGLang's vision towers compile after the server started, under the plugin, per configuration.

Run by tests/test_compiles_after_start.py as ``python compiles.py REPORT.json [--shard INDEX COUNT]``
(a process of its own: the plugin patches SGLang for the life of a process; each of COUNT processes
runs every COUNT-th configuration from INDEX, side by side). The compiled rotary (``ROCM_VIT_ROTARY=compiled``)
on a CPU, rocm-vit's ``aiter_attn`` slot over a stand-in kernel, stand-in graphs. Each configuration
builds a fresh tower with nothing compiled, runs the plugin's start (``capture_vit_buckets``, as
``ModelRunner.init_cuda_graphs`` does), then 30 random requests, and counts the graphs Dynamo
compiles during them. ``torch.compile`` runs with the eager backend here: Dynamo traces, guards and
recompiles exactly as under Inductor, without minutes of C++ builds on a CPU.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.append(str(HERE))
sys.path.append(str(HERE.parent))

import torch  # noqa: E402
from env_vars import set_env  # noqa: E402

REQUESTS = 30


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("report", type=Path)
    parser.add_argument("--shard", type=int, nargs=2, default=(0, 1), metavar=("INDEX", "COUNT"))
    args = parser.parse_args()
    os.environ.update(ROCM_VIT_ROTARY="compiled", SGLANG_VIT_CUDA_GRAPH_MIN_HITS="2")
    os.environ.pop("TORCHDYNAMO_DISABLE", None)
    _compile_with_the_eager_backend()
    import scenario
    import sglang.srt.plugins

    scenario._init_sglang("cpu")
    sglang.srt.plugins.load_plugins()
    scenario._stand_in_aiter_kernel()
    configurations = [
        {"model": "qwen3_vl", "graphs": graphs, "padding": padding, "mode": mode, "dtype": dtype}
        for graphs, padding in ((False, False), (True, False), (True, True))
        for mode, dtype in itertools.product(("no_grad", "inference_mode"), ("bfloat16", "float16"))
    ] + [
        {"model": "qwen2_5_vl", "graphs": graphs, "padding": False, "mode": mode, "dtype": "bfloat16"}
        for graphs, mode in itertools.product((False, True), ("no_grad", "inference_mode"))
    ]
    index, count = args.shard
    mine = configurations[index::count]  # each resets Dynamo and the rotary's cache: none sees another's
    report = [{**configuration, **_compiles_after_start(scenario, **configuration)} for configuration in mine]
    args.report.write_text(json.dumps(report, indent=1))


def _compiles_after_start(
    scenario: Any, model: str, graphs: bool, padding: bool, mode: str, dtype: str
) -> dict[str, int]:
    from torch._dynamo.utils import counters

    from rocm_vit import rotary
    from rocm_vit.integrations.sglang.startup import capture_vit_buckets

    rotary.implementation.cache_clear()  # nothing compiled: as a fresh server
    torch._dynamo.reset()
    variables = {"SGLANG_VIT_ENABLE_CUDA_GRAPH": str(int(graphs)), "SGLANG_VIT_CUDA_GRAPH_PADDING": str(int(padding))}
    with set_env(variables):
        tower = _tower(scenario, model, getattr(torch, dtype), graphs)
        counters.clear()
        captured = capture_vit_buckets(torch.nn.ModuleDict({"visual": tower}))
        at_start = counters["stats"]["unique_graphs"]
        counters.clear()
        generator = torch.Generator().manual_seed(0)
        with torch.inference_mode() if mode == "inference_mode" else torch.no_grad():
            for _ in range(REQUESTS):
                grid = [
                    (1, 2 * int(side), 2 * int(other))
                    for side, other in torch.randint(1, 10, (1, 2), generator=generator)
                ]
                pixels = torch.randn(scenario._patches(grid), scenario.PATCH_DIM, generator=generator).to(tower.dtype)
                tower(pixels, torch.tensor(grid, dtype=torch.int32))
    return {
        "captured_at_start": captured,
        "compiled_at_start": at_start,
        "compiled_in_requests": counters["stats"]["unique_graphs"],
    }


def _tower(scenario: Any, model: str, dtype: torch.dtype, graphs: bool) -> torch.nn.Module:
    """A random tower of ``model`` in ``dtype``, with the plugin's adapter on stand-in graphs where
    graphs are on (Qwen2.5-VL: built as on ROCm, where the plugin opens SGLang's graph gate)."""
    import rocm_vit.integrations.sglang.qwen2_5_vl as plugin_qwen2_5_vl
    from rocm_vit.integrations.sglang.graph_runner import ViTGraphRunnerAdapter

    if model == "qwen3_vl":
        tower = scenario._tiny_model("cpu", dtype, attention="aiter_attn")
    else:
        simulated, plugin_qwen2_5_vl.current_platform = plugin_qwen2_5_vl.current_platform, lambda: "rocm"
        try:
            tower = scenario._tiny_qwen2_5_vl("cpu", attention="aiter_attn").to(dtype)
        finally:
            plugin_qwen2_5_vl.current_platform = simulated
    scenario._randomise(tower, torch.Generator().manual_seed(1))
    adapter = ViTGraphRunnerAdapter(tower, mechanism=scenario._stand_in_mechanism())
    if model == "qwen3_vl":
        tower.graph_runners = adapter
    else:
        tower.cuda_graph_runner, tower.enable_cg = adapter, graphs
    return tower


def _compile_with_the_eager_backend() -> None:
    compile_ = torch.compile

    def with_the_eager_backend(*args: Any, **kwargs: Any) -> Any:
        return compile_(*args, **{**kwargs, "backend": "eager"})

    torch.compile = with_the_eager_backend


if __name__ == "__main__":
    main()
