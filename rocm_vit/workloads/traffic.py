"""Serving traffic for ``rocm-vit bench-traffic``: request streams built from public facts.

Images go through Qwen3-VL's ``smart_resize``; one ViT call per request, as SGLang's ROCm path. What the
runner makes of these streams: docs/benchmarks.md, "`rocm-vit bench-traffic` · simulated".
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rocm_vit.workloads.workload import GridTHW, segment_lengths

PATCH = 16
FACTOR = 32  # patch x spatial merge
CHECKPOINT_MIN_PIXELS = 65_536
CHECKPOINT_MAX_PIXELS = 16_777_216
OPERATOR_CAP_PIXELS = 1_310_720  # 1.3 MP (1280 x 1024), a cap operators set to bound prefill

# (weight, kind, sizes): sizes are (width, height) drawn uniformly; "any" draws each side in 64..1280.
CHAT_MIX: tuple[tuple[float, str, tuple[tuple[int, int], ...]], ...] = (
    (0.30, "phone photo", ((4032, 3024), (3024, 4032), (4000, 3000), (3000, 4000), (4032, 2268))),
    (0.15, "social media", ((1080, 1080), (1080, 1350), (1080, 1920), (1200, 630), (1600, 900))),
    (0.20, "screenshot", ((1920, 1080), (2560, 1440), (1440, 900), (1366, 768), (1170, 2532), (1080, 2400))),
    (0.15, "web image", ((640, 480), (800, 600), (1024, 768), (1280, 720), (512, 512), (640, 360))),
    (0.20, "any", ()),
)
# Images per chat request: mostly one (weights for 1, 2, 3, 4).
IMAGES_PER_REQUEST = (0.80, 0.12, 0.05, 0.03)


def smart_resize(width: int, height: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2/3-VL's resize: sides rounded to ``FACTOR``, the area brought into ``[min, max]``."""
    h_bar = max(FACTOR, round(height / FACTOR) * FACTOR)
    w_bar = max(FACTOR, round(width / FACTOR) * FACTOR)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(FACTOR, math.floor(height / beta / FACTOR) * FACTOR)
        w_bar = max(FACTOR, math.floor(width / beta / FACTOR) * FACTOR)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / FACTOR) * FACTOR
        w_bar = math.ceil(width * beta / FACTOR) * FACTOR
    return w_bar, h_bar


def image_grid(width: int, height: int, max_pixels: int) -> GridTHW:
    """The patch grid one image becomes (one temporal patch)."""
    w_bar, h_bar = smart_resize(width, height, CHECKPOINT_MIN_PIXELS, max_pixels)
    return (1, h_bar // PATCH, w_bar // PATCH)


@dataclass(frozen=True)
class Stream:
    """A named request stream: the grid of every ViT call, in arrival order."""

    name: str
    calls: tuple[tuple[GridTHW, ...], ...]


def chat_stream(calls: int, seed: int, max_pixels: int = OPERATOR_CAP_PIXELS) -> Stream:
    """Chat requests from ``CHAT_MIX``, one ViT call per request, ``max_pixels`` per image."""
    rng = random.Random(seed)
    weights = [weight for weight, _, _ in CHAT_MIX]

    def image() -> GridTHW:
        _, _, sizes = rng.choices(CHAT_MIX, weights)[0]
        width, height = rng.choice(sizes) if sizes else (rng.randint(64, 1280), rng.randint(64, 1280))
        return image_grid(width, height, max_pixels)

    grids = []
    for _ in range(calls):
        count = rng.choices(range(1, len(IMAGES_PER_REQUEST) + 1), IMAGES_PER_REQUEST)[0]
        grids.append(tuple(image() for _ in range(count)))
    name = "chat" if max_pixels == CHECKPOINT_MAX_PIXELS else f"chat, {max_pixels / 1e6:.1f} MP cap"
    return Stream(name, tuple(grids))


def repeated_stream(name: str, images: int, width: int, height: int, calls: int) -> Stream:
    """The same call again and again: ``images`` images of ``width x height`` in each."""
    grid = (image_grid(width, height, CHECKPOINT_MAX_PIXELS),) * images
    return Stream(name, (grid,) * calls)


def video_stream(calls: int, seed: int) -> Stream:
    """Short clips at 2 frames a second, 448-720 px high (one call per clip, two frames per patch)."""
    rng = random.Random(seed)
    grids = []
    for _ in range(calls):
        height = rng.choice((448, 480, 720))
        width = height * 16 // 9
        frames = 2 * rng.randint(4, 16)
        _, h, w = image_grid(width, height, CHECKPOINT_MAX_PIXELS)
        grids.append(((frames // 2, h, w),))
    return Stream("video", tuple(grids))


def standard_streams(calls: int, seed: int) -> list[Stream]:
    """The streams the serving targets of ``bench-traffic`` name, in the order it prints them."""
    return [
        chat_stream(calls, seed),
        chat_stream(calls, seed, CHECKPOINT_MAX_PIXELS),
        repeated_stream("6 x 640x360 per call", 6, 640, 360, max(1, calls // 4)),
        repeated_stream("8 x 640x360 per call", 8, 640, 360, max(1, calls // 4)),
        repeated_stream("1 x 1.3 MP per call", 1, 1280, 1024, max(1, calls // 4)),
        repeated_stream("1 x 1080p per call", 1, 1920, 1080, max(1, calls // 4)),
        video_stream(max(1, calls // 4), seed),
    ]


# How much slower than all-eager graphs may make a stream: on the mean and at p90.
MEAN_SLOWER_LIMIT = 1.01
P90_SLOWER_LIMIT = 1.02


def slower_than_eager(eager: dict[str, Any], graphs: dict[str, Any]) -> bool:
    """Whether summaries of the same calls under graphs are past the limits against all-eager."""
    return (
        graphs["mean_ms"] > MEAN_SLOWER_LIMIT * eager["mean_ms"]
        or graphs["p90_ms"] > P90_SLOWER_LIMIT * eager["p90_ms"]
    )


def latency_summary(times: list[float]) -> dict[str, float]:
    """Mean, p50, p90 and p99 of per-call milliseconds."""
    ordered = sorted(times)
    summary = {"mean_ms": statistics.fmean(times)}
    for percentile in (50, 90, 99):
        summary[f"p{percentile}_ms"] = ordered[min(len(ordered) - 1, len(ordered) * percentile // 100)]
    return summary


SIGHTINGS = ("repeats", "first sightings", "repeats over the guard", "first sightings over the guard")


def oracle_by_sighting(
    grids: Sequence[tuple[GridTHW, ...]], oracle: Sequence[Sequence[float]], max_tokens: int
) -> dict[str, float] | None:
    """The share of the oracle's saving on each of ``SIGHTINGS`` (a repeated layout, which a captured
    graph can serve; a first call, which only a padded one can; within ``max_tokens`` or over): a
    bound on any policy that captures before it replays. ``None`` where nothing was sampled."""
    seen: set[tuple[int, ...]] = set()
    totals = dict.fromkeys(SIGHTINGS, 0.0)
    for grid, samples in zip(grids, oracle, strict=True):
        lengths = segment_lengths(grid)
        sighting = "repeats" if lengths in seen else "first sightings"
        seen.add(lengths)
        if sum(lengths) > max_tokens:
            sighting += " over the guard"
        totals[sighting] += sum(samples)
    total = sum(totals.values())
    return {sighting: saving / total for sighting, saving in totals.items()} if total else None


def sighting_lines(report: dict[str, Any]) -> list[str]:
    """Per stream, where the oracle's saving lies (``oracle_by_sighting``)."""
    lines = [
        f"{stream['stream']}: the oracle's saving lies "
        + ", ".join(f"{share:.0%} on {sighting}" for sighting, share in stream["oracle_by_sighting"].items())
        for stream in report["streams"]
        if stream.get("oracle_by_sighting")
    ]
    note = "(a first sighting: a layout's first call, which a graph of an earlier call cannot serve, a padded one can)"
    return [*lines, note] if lines else []
