"""What the benchmark and verify commands feed the tower: layouts from specs, random towers and pixels."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import random
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from rocm_vit.graphs import DEFAULT_MAX_TOKENS
from rocm_vit.layout import GridTHW
from rocm_vit.models import TowerConfig, VisionTower, preset, tower_class

logger = logging.getLogger(__name__)


# The layouts users send: single images from thumbnail to poster size, batches, and mixed requests.
NAMED_SWEEPS: dict[str, str] = {
    "default": "1x224,1x512,4x512,1x768x1024,1x2048x1600,8x512,1x224+1x512+1x768x1024,2x336+1x1024,1x448f8",
    "small": "1x224,1x336,1x512,2x512,4x224",
    "large": "1x1024,1x1536,1x2048x1600,1x2048,2x1600x1200",
    "tiny": "1x64,1x128,2x96,1x64+1x128,1x64f4",
    # Real photos, where attention is most of the tower (docs/long-sequences.md).
    "photos": "1x1080x1920,2x1080x1920,1x1440x2560,1x2048x1600,1x3024x4032",
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
    """Parse a named sweep or comma-separated specs: ``4x512``, ``1x768x1024``, ``1x224+2x512``, ``1x448f8``."""
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
    """Patch grid of an image or video, rounded to whole merge blocks (at least one)."""
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


HOT_SIDES_PX = (224, 640)  # hot layouts stay under the runner's default max_tokens
DEFAULT_ONE_OFF_MAX_SIDE_PX = 1344
_THUMBNAIL_SIDE_PX = 64


def mixed_stream(
    calls: int,
    seed: int,
    config: TowerConfig,
    hot: int = 20,
    hot_share: float = 0.8,
    max_side_px: int = DEFAULT_ONE_OFF_MAX_SIDE_PX,
) -> list[Workload]:
    """A serving stream: ``round(calls * hot_share)`` calls to ``hot`` repeated layouts, the rest
    one-offs sharing no graph key."""
    if calls < 0 or hot < 1 or not 0.0 <= hot_share <= 1.0:
        raise ValueError(
            f"mixed_stream needs calls >= 0, hot >= 1, 0 <= hot_share <= 1; got {calls}, {hot}, {hot_share}"
        )
    rng = random.Random(seed)
    low_px, high_px = HOT_SIDES_PX
    hot_layouts = _distinct_layouts(
        rng, config, hot, low_px, high_px, (1, 1, 2), set(), max_patches=DEFAULT_MAX_TOKENS - 1
    )
    hot_calls = round(calls * hot_share)
    taken = {segment_lengths(workload.grid_thw) for workload in hot_layouts}
    one_offs = iter(
        _distinct_layouts(rng, config, calls - hot_calls, _THUMBNAIL_SIDE_PX, max_side_px, (1, 1, 1, 2), taken)
    )
    is_hot = [True] * hot_calls + [False] * (calls - hot_calls)
    rng.shuffle(is_hot)
    return [rng.choice(hot_layouts) if hot_call else next(one_offs) for hot_call in is_hot]


def revisiting_workloads(
    calls: int, seed: int, config: TowerConfig, max_side_px: int = 2048, revisit_share: float = 0.5
) -> list[Workload]:
    """``random_workloads``, each call repeating an earlier layout with probability ``revisit_share``."""
    if not 0.0 <= revisit_share <= 1.0:
        raise ValueError(f"revisit_share = {revisit_share} must lie in [0, 1]")
    rng = random.Random(f"{seed}:revisits")
    fresh = iter(random_workloads(calls, seed, config, max_side_px))
    stream: list[Workload] = []
    for _ in range(calls):
        stream.append(rng.choice(stream) if stream and rng.random() < revisit_share else next(fresh))
    return stream


def churn_stream(
    calls: int, seed: int, config: TowerConfig, hot: int = 20, hot_share: float = 0.35, max_images: int = 6
) -> list[Workload]:
    """Graph-cache churn: 1..``max_images`` small images per call; ``hot_share`` repeat one of ``hot`` layouts."""
    rng = random.Random(f"{seed}:churn")
    merge = config.spatial_merge_size

    def draw() -> Workload:
        sides = [(rng.randrange(4, 81, merge), rng.randrange(4, 81, merge)) for _ in range(rng.randint(1, max_images))]
        grid = tuple((1, h, w) for h, w in sides)
        return Workload("+".join(f"1x{h * config.patch_size}x{w * config.patch_size}" for _, h, w in grid), grid)

    hot_layouts = [draw() for _ in range(hot)]
    return [rng.choice(hot_layouts) if rng.random() < hot_share else draw() for _ in range(calls)]


def _distinct_layouts(
    rng: random.Random,
    config: TowerConfig,
    count: int,
    low_px: int,
    high_px: int,
    image_counts: tuple[int, ...],
    taken: set[tuple[int, ...]],
    max_patches: int | None = None,
) -> list[Workload]:
    """``count`` requests, no two with the same ``segment_lengths`` and none in ``taken``."""
    chosen: list[Workload] = []
    seen = set(taken)
    attempts = 0
    while len(chosen) < count:
        attempts += 1
        if attempts > 1000 * (count + 1):
            raise ValueError(
                f"cannot draw {count} distinct layouts with sides of {low_px}..{high_px} px "
                f"(found {len(chosen)}); raise the largest side"
            )
        grid = tuple(
            pixels_to_grid(rng.randint(low_px, high_px), rng.randint(low_px, high_px), 1, config)
            for _ in range(rng.choice(image_counts))
        )
        lengths = segment_lengths(grid)
        if lengths in seen or (max_patches is not None and sum(lengths) > max_patches):
            continue
        seen.add(lengths)
        spec = "+".join(f"1x{h * config.patch_size}x{w * config.patch_size}" for _, h, w in grid)
        chosen.append(Workload(spec, grid))
    return chosen


def segment_lengths(grid: tuple[GridTHW, ...]) -> tuple[int, ...]:
    """Patches per attention segment (one per frame): what a Qwen3-VL graph key holds besides dtypes."""
    return tuple(h * w for t, h, w in grid for _ in range(t))


def build_tower(
    preset_name: str,
    device: torch.device,
    dtype: torch.dtype,
    attention_backend: str | None,
    seed: int,
    depth: int | None = None,
) -> VisionTower:
    """A preset tower with seeded random weights, in eval mode; ``depth`` scales its block indexes."""
    torch.manual_seed(seed)
    config = preset(preset_name)
    if depth is not None:
        scaled = {
            field.name: tuple(sorted({index * depth // config.depth for index in getattr(config, field.name)}))
            for field in dataclasses.fields(config)
            if field.name.endswith("_indexes")
        }
        config = dataclasses.replace(config, depth=depth, **scaled)
    tower = tower_class(config)(config, attention_backend=attention_backend)
    return tower.to(device=device, dtype=dtype).eval()


def bench_graph_options(capacity: int, workloads: list[Workload], device: torch.device) -> dict:
    """``enable_graphs`` options that capture every workload at its first call (bench and verify)."""
    budget = torch.cuda.get_device_properties(device).total_memory // 4 if device.type == "cuda" else None
    return {
        "capacity": capacity,
        "min_hits": 1,
        "max_tokens": max(workload.patches for workload in workloads),
        "budget_bytes": budget,
        "by_benefit": False,
    }


def random_pixels(workload: Workload, config: TowerConfig, device: torch.device, seed: int) -> torch.Tensor:
    """Fresh random patches for ``workload`` (never zeros: they hide unwritten outputs)."""
    generator = torch.Generator().manual_seed(seed)
    width = config.in_channels * config.temporal_patch_size * config.patch_size**2
    return torch.randn(workload.patches, width, generator=generator).to(device)


def progress(items: list, desc: str, unit: str) -> Iterable:
    """``items`` under a tqdm progress bar where tqdm is installed (``rocm-vit[bench]``), else as is."""
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=desc, unit=unit, leave=False)


def median_ms(fn: Callable[[], object], device: torch.device, repeats: int, warmup: int = 1) -> float:
    """Median wall time of ``fn`` in milliseconds, synchronising the device around each call."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        synchronize(device)
        started = time.perf_counter()
        fn()
        synchronize(device)
        samples.append((time.perf_counter() - started) * 1e3)
    return statistics.median(samples)


def table_lines(header: Sequence[str], cells: Sequence[Sequence[str]], left: bool = False) -> list[str]:
    """A header line and one line per row, columns two spaces apart, right-aligned unless ``left``."""
    widths = [max([len(title), *(len(line[i]) for line in cells)]) for i, title in enumerate(header)]
    if left:
        return ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in [header, *cells]]
    return ["  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in [header, *cells]]


def int_list(text: str) -> list[int]:
    """An argparse type: ``"72,64,80"`` -> ``[72, 64, 80]``."""
    try:
        return [int(part) for part in text.split(",") if part]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None


def device_ms(fn: Callable[[], object], rep_ms: int = 20, graph: bool = True) -> float:
    """Median milliseconds of one call of ``fn`` on the GPU: replayed from a graph, else ``do_bench``."""
    import triton.testing

    if graph:
        try:
            return float(triton.testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median"))
        except Exception as error:  # a kernel that cannot be captured is still timed
            logger.warning("graph timing failed (%s: %s); timing launch by launch", type(error).__name__, error)
    return float(triton.testing.do_bench(fn, warmup=max(10, rep_ms // 4), rep=rep_ms, return_mode="median"))


class KernelTimer:
    """Median milliseconds of one kernel call: ``device_ms`` on a GPU, wall time on a CPU (tests)."""

    def __init__(self, device: torch.device, rep_ms: int, graph: bool = True) -> None:
        self._device = device
        self._rep_ms = rep_ms
        self._graph = graph

    def __call__(self, fn: Callable[[], object], rep_ms: int | None = None) -> float:
        if self._device.type == "cuda":
            return device_ms(fn, rep_ms or self._rep_ms, graph=self._graph)
        return median_ms(fn, self._device, repeats=5)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
