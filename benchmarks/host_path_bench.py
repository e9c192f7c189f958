"""How much host time does one graph-served call of SGLang's tower under the plugin take, against rocm-vit's own?

The question behind the replay gap at 1 x 224²: c (SGLang's tower, the plugin) and o (rocm-vit's own
tower, the same weights) spend the same device time in their kernels, yet c's call took ~0.25 ms more
on an H100 (docs/benchmarks.md, "SGLang's tower at rocm-vit's speed"). This times the host path alone:
both towers at toy sizes (fp32, hidden 64, 16 patches) on a CPU, served by rocm-vit's runner over a
graph stand-in whose replay does nothing, so a call is the Python around the graph, the staging
copies, and what runs before the graph. Per stage, the median of wrapped timers.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/host_path_bench.py            # the table prints last
    PYTHONPATH=$PWD .venv/bin/python benchmarks/host_path_bench.py --calls 5000

Prediction: o's call is the runner's (~50 µs on a 2-core CPU); c adds SGLang's forward, the cached
inputs before the blocks and the adapter, well under the 0.25 ms seen on the H100. Run on a 2-core CPU
(2026-12-08), medians in µs as five of seven runs gave them within 5 % (two ran up to 2x slower, the
host busy):
- at aff3380, c's patch embedding and position add still outside the graph: c 144, o 56. c's: before
  the graph 91 (the patch embedding 36 and the position add 28, both with their CPU compute; 27 of
  checks, ``grid_thw`` and the cache lookup), the adapter 5 around the runner's 42 (o's: 43), SGLang's
  forward and the hook 6. So host Python explained under 0.1 ms of the 0.25.
- with both in the graph (``run_embedding``; four runs): c 66, o 56. c's: the layout from the cache 7,
  the adapter 2 around the runner's 44, SGLang's forward and the hook (the pixels' ``.to``, the table
  check) 14.
On a GPU the embedding then costs the graph's device time instead of two launches and their Python.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "sglang_support"), str(ROOT / "tests")]
os.environ.update(
    SGLANG_VIT_ENABLE_CUDA_GRAPH="1",
    SGLANG_VIT_CUDA_GRAPH_MIN_HITS="1",
    SGLANG_VIT_CUDA_GRAPH_MAX_TOKENS="256",
    TORCHDYNAMO_DISABLE="1",
    CUDA_VISIBLE_DEVICES="",
)

import torch  # noqa: E402

GRID = [(1, 4, 4)]  # 16 patches: one image, the smallest Qwen3-VL layout
_TIMES: dict[str, list[float]] = defaultdict(list)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python benchmarks/host_path_bench.py", description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    import scenario
    import sglang.srt.plugins
    from toy_tower import tiny_qwen3_vl_config

    scenario._init_sglang("cpu")
    sglang.srt.plugins.load_plugins()
    scenario._stand_in_aiter_kernel()
    config = tiny_qwen3_vl_config(hidden_size=64)
    config.num_position_embeddings = 64  # SGLang pads its table to 64 rows: the own tower takes it whole
    plugin_tower, own = _towers(config)
    pixels = torch.randn(sum(t * h * w for t, h, w in GRID), scenario.PATCH_DIM)
    grid = torch.tensor(GRID, dtype=torch.int32)
    _time_stages()
    rows = []
    for name, call in (("c", lambda: plugin_tower(pixels, grid)), ("o", lambda: own(pixels, grid))):
        _TIMES.clear()
        with torch.no_grad():
            for _ in range(20):  # capture, then warm
                call()
            _TIMES.clear()
            for _ in range(args.calls):
                started = time.perf_counter()
                call()
                _TIMES["call"].append(time.perf_counter() - started)
        rows += [(name, stage, 1e6 * statistics.median(times)) for stage, times in _TIMES.items()]
    print(f"{'tower':6} {'stage':48} {'median us':>10}")
    for name, stage, micros in rows:
        print(f"{name:6} {stage:48} {micros:10.1f}")


def _towers(config: Any) -> tuple[torch.nn.Module, torch.nn.Module]:
    """SGLang's tower with the plugin's adapter, and rocm-vit's own on its weights, both over ``no_replay_graphs()``."""
    from sglang.srt.models.qwen3_vl import Qwen3VLMoeVisionModel
    from sglang.srt.runtime_context import get_mm

    from rocm_vit.integrations.sglang.graph_runner import ViTGraphRunnerAdapter
    from rocm_vit.integrations.sglang.own_tower import own_tower
    from rocm_vit.tower_config import Qwen3VLVisionConfig

    with get_mm().override(mm_attention_backend="aiter_attn"):
        tower = Qwen3VLMoeVisionModel(config).eval()
    with torch.no_grad():
        for parameter in tower.parameters():
            parameter.copy_(torch.randn(parameter.shape) * 0.1)
    tower.graph_runners = ViTGraphRunnerAdapter(tower, mechanism=no_replay_graphs())
    own = own_tower(tower, Qwen3VLVisionConfig.from_config(config), "aiter_attn")
    own.enable_graphs(min_hits=1, max_tokens=256, mechanism=no_replay_graphs())
    return tower, own


def no_replay_graphs() -> Any:
    from rocm_vit.graphs.torch_graphs import HostGraphs

    class _NoReplays(HostGraphs):
        """Captures as ``HostGraphs`` do; a replay does nothing, leaving the captured output in place."""

        def replay(self, graph: Any) -> None:
            pass

    return _NoReplays()


def _time_stages() -> None:
    """Wrap the stages of a call in timers (each adds well under a microsecond)."""
    from rocm_vit.graphs import runner
    from rocm_vit.integrations.sglang import graph_runner, prepare

    stages = (
        (prepare, "_covered", "c: the layout from the cache (checks, grid_thw)"),
        (graph_runner.ViTGraphRunnerAdapter, "run_embedding", "c: the adapter (with the runner)"),
        (runner.ViTGraphRunner, "run", "the runner (staging, replay)"),
    )
    for owner, name, label in stages:
        setattr(owner, name, _timed(getattr(owner, name), label))


def _timed(function: Callable, label: str) -> Callable:
    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            _TIMES[label].append(time.perf_counter() - started)

    return timed


if __name__ == "__main__":
    main()
