"""The real device work behind each hazard check of ``rocm_vit.report.hazards``, on this machine.

Invariant: the report's own process never imports this module; each check runs in a process of its own
(``python -m rocm_vit.cli.hazard_check``), under ``torch.inference_mode``.
"""

from __future__ import annotations

import importlib.util
import os
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rocm_vit.models import preset
from rocm_vit.platform import PlatformInfo, platform_info
from rocm_vit.report.hazards import (
    AiterCall,
    Reading,
    Verdict,
    bitwise_equal,
    check_aiter_kernels,
    check_capture_errors,
    check_graph_equals_eager,
    check_host_copy_offsets,
)
from rocm_vit.tower_config import TowerConfig

# hip#3902 was seen within a few hundred replays; --quick keeps the round trip under a few seconds.
ROUNDS = 400
QUICK_ROUNDS = 200
OFFSET_TOKENS = 2048
OFFSET_SEGMENTS = 4
# "A few dozen layouts", at most 1024 px a side: captures of every one stay within seconds.
GRAPH_LAYOUTS = 32
GRAPH_MAX_SIDE_PX = 1024
QUICK_GRAPH_LAYOUTS = 10
QUICK_GRAPH_MAX_SIDE_PX = 768
CAPTURE_UNSAFE_OP = "a device-to-host read (tensor.item())"
# rocm-vit's aiter calls as backends/aiter_attn.py makes them.
SERVING_DTYPES = (torch.bfloat16,)
_AITER_BACKENDS = (("aiter_attn", None), ("aiter_attn_pad128", 128))
NO_GPU = "no GPU: torch.cuda.is_available() is False"


def run_check(name: str, preset_name: str, quick: bool) -> Verdict:
    """The verdict of hazard ``name`` for ``preset_name`` on this machine."""
    info = platform_info()  # under ROCM_VIT_EMULATE, this installs the aiter stand-in
    config = preset(preset_name)
    if name == "aiter_kernels":
        where_built, install = aiter_install(info)
        return check_aiter_kernels(aiter_calls(config, info.arch), where_built, install)
    device = torch.device("cuda")
    gpu = info.name != "cpu"
    with torch.inference_mode():
        if name == "host_copy_offsets":
            probe = OffsetsProbe(config, device) if gpu else None
            return check_host_copy_offsets(probe, QUICK_ROUNDS if quick else ROUNDS, NO_GPU)
        if name == "capture_errors":
            return check_capture_errors(capture_unsafe if gpu else None, CAPTURE_UNSAFE_OP, NO_GPU)
        if name == "graph_equals_eager":
            if not gpu:
                return check_graph_equals_eager(None, [], None, NO_GPU)
            sizes = (QUICK_GRAPH_LAYOUTS, QUICK_GRAPH_MAX_SIDE_PX) if quick else (GRAPH_LAYOUTS, GRAPH_MAX_SIDE_PX)
            return check_graph_equals_eager(*tower_encoder(preset_name, *sizes))
    raise ValueError(f"unknown hazard check {name!r}")


# aiter kernels ------------------------------------------------------------------------------------


def aiter_calls(config: TowerConfig, arch: str) -> list[AiterCall]:
    """The aiter module each of rocm-vit's aiter backends loads for this tower, per serving dtype."""
    from rocm_vit.emulation.aiter_modules import varlen_forward_module

    heads = config.num_heads
    head_dim = config.hidden_size // heads
    calls = []
    for dtype in SERVING_DTYPES:
        for backend, pad_to in _AITER_BACKENDS:
            dim = max(head_dim, pad_to or 0)
            seen = -(-dim // 8) * 8  # aiter pads head dims to a multiple of 8 before it picks a kernel
            module = varlen_forward_module(
                dtype, seen, seen, heads=heads, kv_heads=heads, causal=False, return_lse=True, arch=arch
            )
            calls.append(AiterCall(backend, str(dtype).removeprefix("torch."), dim, module))
    return calls


def aiter_install(info: PlatformInfo) -> tuple[Callable[[str], str | None] | None, str]:
    """``(where_built, description)`` for this process's aiter (None: not applicable); never imports it."""
    if info.name != "rocm":
        return None, f"aiter runs on ROCm only; this platform is {info.name}"
    from rocm_vit.emulation import aiter_standin
    from rocm_vit.emulation.aiter_modules import SGLANG_IMAGE_AITER_COMMIT

    if aiter_standin.installed():
        built = aiter_standin.builds.built
        return (
            lambda module: "in the stand-in's prebuilt table" if module in built else None,
            f"the aiter stand-in's module table (SGLang's ROCm image, aiter {SGLANG_IMAGE_AITER_COMMIT[:12]}), "
            f"ROCm emulated on {info.emulated_on}",
        )
    try:
        spec = importlib.util.find_spec("aiter")  # locates the package without running it
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None, "aiter is not installed: ROCm attention runs triton_attn (SGLANG_USE_AITER=1 needs aiter)"
    jit_dirs = aiter_jit_dirs(Path(next(iter(spec.submodule_search_locations))))

    def where_built(module: str) -> str | None:
        for name in (module, f"aiter.jit.{module}"):
            if name in sys.modules:
                return f"loaded in this process ({name})"
        return next((str(path) for path in (d / f"{module}.so" for d in jit_dirs) if path.is_file()), None)

    return where_built, f"aiter at {spec.origin}; JIT directories {', '.join(map(str, jit_dirs))}"


def aiter_jit_dirs(package_dir: Path) -> list[Path]:
    """Where aiter keeps its built modules, as ``aiter/jit/core.py``'s ``get_user_jit_dir``."""
    if os.environ.get("AITER_JIT_DIR"):
        return [Path(os.environ["AITER_JIT_DIR"])]
    return [package_dir / "jit", Path.home() / ".aiter" / "jit"]


# offsets after host copies -----------------------------------------------------------------------


class OffsetsProbe:
    """ROCm/hip#3902's pattern: new offsets copied non-blocking from pinned memory, replay at once, compare.

    ``max_seqlen`` stays the token count, so one graph serves every segmentation.
    """

    def __init__(self, config: TowerConfig, device: torch.device) -> None:
        from rocm_vit.attention import BACKENDS, SdpaAttention
        from rocm_vit.policy import active_policy

        heads, head_dim = config.num_heads, config.hidden_size // config.num_heads
        picked, _ = active_policy().attention.pick((OFFSET_TOKENS // OFFSET_SEGMENTS,) * OFFSET_SEGMENTS, head_dim)
        self.backend = BACKENDS["triton_attn" if BACKENDS[picked] is SdpaAttention else picked]()
        generator = torch.Generator(device=device).manual_seed(0)
        packed = torch.randn(OFFSET_TOKENS, 3, heads, head_dim, generator=generator, device=device)
        self.q, self.k, self.v = packed.to(torch.bfloat16).unbind(1)
        self.scale = head_dim**-0.5
        self.device = device
        self._rng = random.Random(0)
        self.buffer = torch.tensor(self._offsets(), dtype=torch.int32, device=device)
        self.seen = torch.empty_like(self.buffer)
        args = self.backend.layer_args_from_tensor(self.buffer, OFFSET_TOKENS)

        def forward() -> torch.Tensor:
            self.seen.copy_(self.buffer)
            return self.backend(self.q, self.k, self.v, args, self.scale)

        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            forward()  # kernels compile here, not inside the capture
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.output = forward()

    def __call__(self, round_index: int) -> Reading:
        offsets = self._offsets()
        host = torch.tensor(offsets, dtype=torch.int32).pin_memory()
        self.buffer.copy_(host, non_blocking=True)
        self.graph.replay()
        seen = self.seen.tolist()  # waits for the replay
        observed = self.output.clone()
        fresh = torch.tensor(offsets, dtype=torch.int32, device=self.device)
        expected = self.backend(
            self.q, self.k, self.v, self.backend.layer_args_from_tensor(fresh, OFFSET_TOKENS), self.scale
        )
        return Reading(seen == offsets, bitwise_equal(observed, expected))

    def _offsets(self) -> list[int]:
        cuts = sorted(self._rng.sample(range(16, OFFSET_TOKENS - 16), OFFSET_SEGMENTS - 1))
        return [0, *cuts, OFFSET_TOKENS]


# capture errors ----------------------------------------------------------------------------------


def capture_unsafe(device: torch.device | None = None) -> BaseException | None:
    """Capture ``x.sum().item()`` as the graph runner captures; return what was raised, else None."""
    device = device or torch.device("cuda")
    x = torch.ones(16, device=device)
    x.sum().item()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    error: BaseException | None = None
    with torch.cuda.stream(stream):
        graph.capture_begin(capture_error_mode="thread_local")
        try:
            (x * 2).sum().item()
        except Exception as raised:  # the finding: reported
            error = raised
        try:
            graph.capture_end()
        except Exception as raised:  # reported at the end of the capture instead
            error = error or raised
    return error


# graph == eager ----------------------------------------------------------------------------------


def tower_encoder(
    preset_name: str, count: int, max_side_px: int, seed: int = 0
) -> tuple[Callable[[int, bool], torch.Tensor], list[str], Callable[[], dict[str, Any]]]:
    """``(encode, layouts, runner_stats)``: ``count`` random layouts, capacity half of them (as ``verify``)."""
    from rocm_vit.workloads.workload import bench_graph_options, build_tower, random_pixels, random_workloads

    device = torch.device("cuda")
    tower = build_tower(preset_name, device, torch.bfloat16, None, seed)
    workloads = random_workloads(count, seed, tower.config, max_side_px)
    runner = tower.enable_graphs(**bench_graph_options(max(1, count // 2), workloads, device))

    def encode(index: int, use_graphs: bool) -> torch.Tensor:
        workload = workloads[index]
        pixels = random_pixels(workload, tower.config, device, seed + index).to(tower.dtype)
        return tower(pixels, list(workload.grid_thw), use_graphs=use_graphs)

    labels = [w.spec if len(w.spec) <= 48 else w.spec[:45] + "..." for w in workloads]
    return encode, labels, runner.stats
