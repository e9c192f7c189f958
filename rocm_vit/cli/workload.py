"""What the benchmark and verify commands feed the tower: layouts from specs, random towers and pixels."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from rocm_vit.models import TowerConfig, VisionTower, preset, tower_class

GridTHW = tuple[int, int, int]

# The layouts users send: single images from thumbnail to poster size, batches, and mixed requests.
NAMED_SWEEPS: dict[str, str] = {
    "default": "1x224,1x512,4x512,1x768x1024,1x2048x1600,8x512,1x224+1x512+1x768x1024,2x336+1x1024,1x448f8",
    "small": "1x224,1x336,1x512,2x512,4x224",
    "large": "1x1024,1x1536,1x2048x1600,1x2048,2x1600x1200",
    "tiny": "1x64,1x128,2x96,1x64+1x128,1x64f4",
}


@dataclass(frozen=True)
class Workload:
    """One benchmark row: its spec, as the user wrote it, and the grid it becomes."""

    spec: str
    grid_thw: tuple[GridTHW, ...]

    @property
    def patches(self) -> int:
        return sum(t * h * w for t, h, w in self.grid_thw)


def parse_layouts(text: str, config: TowerConfig) -> list[Workload]:
    """Parse a named sweep or comma-separated specs.

    A spec is items joined by ``+``; an item is ``COUNTxSIZE`` (square images), ``COUNTxHxW``
    (pixels) or either with ``fFRAMES`` appended for a video: ``4x512``, ``1x768x1024``,
    ``1x224+2x512``, ``1x448f8``. Sizes round to the tower's patch x merge grid, as Qwen's resize does.
    """
    text = NAMED_SWEEPS.get(text, text)
    workloads = []
    for spec in (part.strip() for part in text.split(",")):
        if not spec:
            continue
        grid: list[GridTHW] = []
        for item in spec.split("+"):
            count, item_grid = _parse_item(item, spec, config)
            grid.extend([item_grid] * count)
        workloads.append(Workload(spec, tuple(grid)))
    if not workloads:
        raise ValueError(f"--layouts {text!r} names no layout; named sweeps: {sorted(NAMED_SWEEPS)}")
    return workloads


def _parse_item(item: str, spec: str, config: TowerConfig) -> tuple[int, GridTHW]:
    body, _, frames_text = item.partition("f")
    try:
        numbers = [int(part) for part in body.split("x")]
        frames = int(frames_text) if frames_text else 1
    except ValueError:
        raise ValueError(f"layout {spec!r}: cannot read {item!r} (expected e.g. 4x512, 1x768x1024, 1x448f8)") from None
    if len(numbers) == 2:
        count, height, width = numbers[0], numbers[1], numbers[1]
    elif len(numbers) == 3:
        count, height, width = numbers
    else:
        raise ValueError(f"layout {spec!r}: {item!r} must be COUNTxSIZE or COUNTxHxW")
    if min(count, height, width, frames) <= 0:
        raise ValueError(f"layout {spec!r}: {item!r} has a non-positive number")
    return count, pixels_to_grid(height, width, frames, config)


def pixels_to_grid(height: int, width: int, frames: int, config: TowerConfig) -> GridTHW:
    """Patch grid of an image or video, rounded to whole merge blocks (at least one).

    A merge block is ``patch_size x spatial_merge_size`` pixels: 32 for Qwen3-VL, 28 for Qwen2.5-VL.
    """
    unit = config.patch_size * config.spatial_merge_size
    blocks_h = max(1, round(height / unit))
    blocks_w = max(1, round(width / unit))
    t = max(1, -(-frames // config.temporal_patch_size))
    merge = config.spatial_merge_size
    return (t, blocks_h * merge, blocks_w * merge)


def random_workloads(count: int, seed: int, config: TowerConfig, max_side_px: int = 2048) -> list[Workload]:
    """Random requests: 1-8 items, images and videos, sides from 64 px to ``max_side_px``."""
    rng = random.Random(seed)
    workloads = []
    for _ in range(count):
        grid = []
        for _ in range(rng.randint(1, 8)):
            frames = rng.choice([1, 1, 1, 2, 4, 8])
            side_limit = max_side_px if frames == 1 else max_side_px // 4
            grid.append(pixels_to_grid(rng.randint(64, side_limit), rng.randint(64, side_limit), frames, config))
        spec = "+".join(f"{t}x{h}x{w}" for t, h, w in grid)
        workloads.append(Workload(spec, tuple(grid)))
    return workloads


def build_tower(
    preset_name: str, device: torch.device, dtype: torch.dtype, attention_backend: str | None, seed: int
) -> VisionTower:
    """A preset tower (its ``model_type`` picks the class) with random weights (seeded), in eval mode on ``device``."""
    torch.manual_seed(seed)
    config = preset(preset_name)
    tower = tower_class(config)(config, attention_backend=attention_backend)
    return tower.to(device=device, dtype=dtype).eval()


def bench_graph_options(capacity: int, workloads: list[Workload], device: torch.device) -> dict:
    """``enable_graphs`` options that capture every workload at its first call (bench and verify)."""
    budget = torch.cuda.get_device_properties(device).total_memory // 4 if device.type == "cuda" else None
    return {
        "capacity": capacity,
        "min_sightings": 1,
        "max_tokens": max(workload.patches for workload in workloads),
        "budget_bytes": budget,
    }


def random_pixels(workload: Workload, config: TowerConfig, device: torch.device, seed: int) -> torch.Tensor:
    """Fresh random patches for ``workload`` (never zeros: they hide unwritten outputs)."""
    generator = torch.Generator().manual_seed(seed)
    width = config.in_channels * config.temporal_patch_size * config.patch_size**2
    return torch.randn(workload.patches, width, generator=generator).to(device)


def median_ms(fn: Callable[[], object], device: torch.device, repeats: int, warmup: int = 1) -> float:
    """Median wall time of ``fn`` in milliseconds, synchronising the device around each call."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        _synchronize(device)
        started = time.perf_counter()
        fn()
        _synchronize(device)
        samples.append((time.perf_counter() - started) * 1e3)
    return statistics.median(samples)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
