"""``rocm-vit tune``: measure this GPU and write the profile every later process on it loads.

Times, for one preset: every attention backend that can run here over single images, batches and
ragged mixes; each rotary inside the tower; ``gluon_attn``'s two against three consumers (Hopper); fused
block ops on and off; eager against graph replay per patch count, which the policy fits its graph cost
model to.
Under ``inference_mode`` with random weights; each graph's output is checked bitwise against eager
before it is timed. The profile (``rocm_vit.profile``) is keyed by device, arch and library versions.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import torch

from rocm_vit.cli.bench_attention import LAYOUTS as BENCH_ATTN_LAYOUTS
from rocm_vit.layout import GridTHW, VisionLayout
from rocm_vit.models import preset, preset_names
from rocm_vit.platform import PlatformInfo, platform_info
from rocm_vit.policy import (
    AUTO_CANDIDATES,
    Facts,
    Policy,
    backend_unavailable_reason,
    current_facts,
    resolve_policy,
    rotary_unavailable_reason,
    use_policy,
)
from rocm_vit.profile import (
    AttentionTiming,
    ConsumerTiming,
    GraphTiming,
    TunedProfile,
    default_profile_path,
    profile_key,
    write_profile,
)
from rocm_vit.settings import Settings, load_settings
from rocm_vit.workloads.workload import (
    KernelTimer,
    build_tower,
    int_list,
    median_ms,
    parse_layouts,
    progress,
    random_pixels,
)

# Attention layouts: bench-attn's, the small images a serving mix is mostly made of, video frames,
# and lengths that are not whole 128-token tiles (most real images; cuDNN's speed depends on it).
ATTENTION_LAYOUTS: dict[str, list[GridTHW]] = {
    **BENCH_ATTN_LAYOUTS,
    "1x196": [(1, 14, 14)],
    "4x196": [(1, 14, 14)] * 4,
    "1x576": [(1, 24, 24)],
    "4x576": [(1, 24, 24)] * 4,
    "4x784": [(1, 28, 28)] * 4,
    "1x1600": [(1, 40, 40)],
    "1x2304": [(1, 48, 48)],
    "1x3136": [(1, 56, 56)],
    "1x5184": [(1, 72, 72)],
}
CPU_ATTENTION_LAYOUTS = ("1x196", "4x196", "1x576")
# Rotaries a GPU may pick between (native is the compiled one's math uncompiled: never faster) and the
# tower layouts they are timed in: small images, which graphs replay, and a large one that runs eagerly.
TUNED_ROTARIES = ("triton", "compiled")
ROTARY_LAYOUTS = "1x224,1x1024,1x2048"
# Tower layouts timed with fused ops on and off (graph replays: what fusion changes is device work).
FUSED_LAYOUTS = "1x224,1x512,1x1024"
# Patch counts 196 .. 9216 for eager against graph replay.
GRAPH_LAYOUTS = "1x224,1x448,1x640,1x768,1x896,1x1024,1x1152,1x1280,1x1536"
# Single images timed with gluon_attn's two and three consumer warpgroups: 0.7-5 waves of three-consumer
# programs on an H200 at 16 heads, where the two cross (docs/benchmarks.md, "`rocm-vit tune`").
CONSUMER_TOKENS = (1024, 1600, 2048, 2560, 3072, 4096, 8160)
# Three consumers must be at most this much slower at every larger measured layout: a tie is noise.
CONSUMER_TIE = 0.02


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``rocm-vit tune``."""
    parser.add_argument("--preset", choices=preset_names(), help="tower to tune for (default qwen3-vl-8b; tiny on CPU)")
    parser.add_argument("--out", type=Path, help="profile file (default: the per-user file this device loads)")
    parser.add_argument("--plot", type=Path, help="write the measurements as a PNG (needs matplotlib)")
    parser.add_argument(
        "--head-dims",
        type=int_list,
        default=None,
        help="comma-separated head dims whose attention to time (default: the preset's; e.g. 72,80 for "
        "Qwen3-VL and Qwen2.5-VL on one GPU)",
    )
    parser.add_argument("--rep-ms", type=int, default=25, help="timing window per attention cell (default 25)")
    parser.add_argument("--repeats", type=int, default=10, help="timed tower calls per cell (default 10)")


def run(args: argparse.Namespace) -> int:
    """Measure, write the profile, print what it measured and what it changes against the defaults."""
    started = time.perf_counter()
    info = platform_info()
    facts = current_facts()
    on_gpu = facts.platform != "cpu"
    device = torch.device("cuda" if on_gpu else "cpu")
    dtype = torch.bfloat16 if on_gpu else torch.float32
    preset_name = args.preset or ("qwen3-vl-8b" if on_gpu else "tiny")
    settings = dataclasses.replace(load_settings(), attention_backend=None, rotary=None)
    defaults = resolve_policy(facts, settings)
    config = preset(preset_name)
    timer = KernelTimer(device, args.rep_ms)

    head_dims = list(dict.fromkeys([config.head_dim, *(args.head_dims or ())]))
    with torch.inference_mode():
        consumers = _tune_gluon_consumers(timer, facts, config.num_heads, config.head_dim, dtype, device)
        draft = _profile(info, preset_name, (), {}, consumers)
        with use_policy(resolve_policy(facts, settings, draft)):  # gluon_attn timed with the rule just tuned
            attention = tuple(
                timing
                for head_dim in head_dims
                for timing in _tune_attention(timer, facts, config.num_heads, head_dim, dtype, device)
            )
        draft = dataclasses.replace(draft, attention=attention)
        rotary_ms = _tune_rotary(facts, settings, draft, preset_name, dtype, device, args.repeats)
        draft = dataclasses.replace(draft, rotary_ms=rotary_ms)
        fused_ms = {}
        if defaults.fused_ops.value:  # nothing to compare where fused ops cannot run
            fused_ms = _tune_fused_ops(facts, settings, draft, preset_name, dtype, device, args.repeats)
        draft = dataclasses.replace(draft, fused_ops_ms=fused_ms)
        graphs = _tune_graphs(resolve_policy(facts, settings, draft), preset_name, dtype, device, args.repeats)
    profile = dataclasses.replace(draft, graphs=graphs)
    out = args.out or default_profile_path(info)
    write_profile(profile, out)
    tuned = resolve_policy(facts, settings, profile)
    print(_report(profile, defaults, tuned, out, time.perf_counter() - started))
    if args.plot:
        _plot(profile, args.plot)
    return 0


def _tune_attention(
    timer: KernelTimer, facts: Facts, heads: int, head_dim: int, dtype: torch.dtype, device: torch.device
) -> tuple[AttentionTiming, ...]:
    from rocm_vit.attention import BACKENDS

    names = [
        name
        for name in AUTO_CANDIDATES[facts.platform]
        if backend_unavailable_reason(name, facts) is None and not (name.endswith("pad128") and head_dim >= 128)
    ]
    backends = {name: BACKENDS[name]() for name in names}
    layouts = ATTENTION_LAYOUTS if facts.platform != "cpu" else {n: ATTENTION_LAYOUTS[n] for n in CPU_ATTENTION_LAYOUTS}
    timings = []
    for layout_name, grid in progress(list(layouts.items()), f"attention d{head_dim}", "layout"):
        layout = VisionLayout.from_grid_thw(grid, spatial_merge_size=1)
        generator = torch.Generator(device=device).manual_seed(0)
        packed = torch.randn(layout.num_patches, 3, heads, head_dim, generator=generator, device=device)
        q, k, v = packed.to(dtype).unbind(1)
        cu_seqlens = layout.cu_seqlens_tensor(device)
        ms = {}
        for name, backend in backends.items():
            attn_args = backend.runner_args(layout, cu_seqlens)
            ms[name] = round(timer(functools.partial(backend, q, k, v, attn_args, head_dim**-0.5)), 5)
        timings.append(AttentionTiming(layout_name, tuple(layout.seq_lens), ms, head_dim))
    return tuple(timings)


def _tune_gluon_consumers(
    timer: KernelTimer, facts: Facts, heads: int, head_dim: int, dtype: torch.dtype, device: torch.device
) -> tuple[ConsumerTiming, ...]:
    """``gluon_attn`` with two and with three consumers forced, where it runs at this head dim."""
    if backend_unavailable_reason("gluon_attn", facts) is not None:
        return ()
    from rocm_vit.backends import gluon_attn

    if head_dim not in gluon_attn.GLUON_HEAD_DIMS:
        return ()
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    timings = []
    for tokens in progress(CONSUMER_TOKENS, f"gluon_attn consumers d{head_dim}", "layout"):
        generator = torch.Generator(device=device).manual_seed(0)
        packed = torch.randn(tokens, 3, heads, head_dim, generator=generator, device=device)
        q, k, v = packed.to(dtype).unbind(1)
        cu_seqlens = torch.tensor([0, tokens], dtype=torch.int32, device=device)
        ms = {}
        for count, forced in ((2, math.inf), (3, 0.0)):  # three consumers from: never, always
            call = functools.partial(gluon_attn.gluon_varlen_attention, q, k, v, cu_seqlens, tokens, head_dim**-0.5)
            ms[count] = round(timer(functools.partial(call, three_consumer_waves=forced)), 5)
        waves = gluon_attn.three_consumer_programs(tokens, heads) / sms
        timings.append(ConsumerTiming(f"1x{tokens}", round(waves, 3), ms[2], ms[3]))
    return tuple(timings)


def three_consumer_waves(timings: Sequence[ConsumerTiming]) -> float | None:
    """The waves from which three consumers were faster, or at most ``CONSUMER_TIE`` slower, at every
    larger measured layout: halfway between the last layout that lost and the first of that run
    (``inf``: the largest lost or was a tie; ``None``: nothing measured)."""
    rows = sorted(timings, key=lambda row: row.waves)
    if not rows:
        return None
    start = len(rows)
    while start > 0 and rows[start - 1].three_ms <= rows[start - 1].two_ms * (1 + CONSUMER_TIE):
        start -= 1
    while start < len(rows) and rows[start].three_ms >= rows[start].two_ms:  # begin where three won
        start += 1
    if start == len(rows):
        return math.inf
    if start == 0:
        return rows[0].waves
    return round((rows[start - 1].waves + rows[start].waves) / 2, 3)


def _tune_rotary(
    facts: Facts,
    settings: Settings,
    draft: TunedProfile,
    preset_name: str,
    dtype: torch.dtype,
    device: torch.device,
    repeats: int,
) -> dict[str, float]:
    """Tower milliseconds per rotary that can run here: eager calls plus graph replays, summed over
    ``ROTARY_LAYOUTS``; nothing where there is one candidate (a CPU, a GPU without Triton).

    Inside the tower, because the kernels' own time is not what separates them: the compiled helper's
    Dynamo and Inductor host work (docs/benchmarks.md, "Eager host cost") shows in eager
    calls, its four launches a block against the Triton kernel's one in the replays.
    """
    names = [name for name in TUNED_ROTARIES if rotary_unavailable_reason(name, facts) is None]
    if device.type != "cuda" or len(names) < 2:
        return {}
    totals = {}
    for name in progress(names, "rotary", "implementation"):
        with use_policy(resolve_policy(facts, dataclasses.replace(settings, rotary=name), draft)):
            rows = _eager_and_graph(preset_name, ROTARY_LAYOUTS, dtype, device, repeats, eager=True)
        totals[name] = round(sum(row.eager_ms + row.graph_ms for row in rows), 4)
    return totals


def _tune_fused_ops(
    facts: Facts,
    settings: Settings,
    draft: TunedProfile,
    preset_name: str,
    dtype: torch.dtype,
    device: torch.device,
    repeats: int,
) -> dict[str, float]:
    """Tower milliseconds, summed over ``FUSED_LAYOUTS``, with the fused block ops on and off.

    Timed as graph replays: fusion changes the device's work, and eager calls of small images measure
    the host (on the H200 an eager 8B call took 10-20 ms from one run to the next for 1.5 ms of GPU
    work, which once made the plain ops look faster).
    """
    totals = {}
    for label, fused in progress([("fused", True), ("plain", False)], "fused ops", "setting"):
        with use_policy(resolve_policy(facts, dataclasses.replace(settings, fused_ops=fused), draft)):
            totals[label] = round(
                sum(
                    row.graph_ms
                    for row in _eager_and_graph(preset_name, FUSED_LAYOUTS, dtype, device, repeats, eager=False)
                ),
                4,
            )
    return totals


def _tune_graphs(
    policy: Policy, preset_name: str, dtype: torch.dtype, device: torch.device, repeats: int
) -> tuple[GraphTiming, ...]:
    """Eager against replay per patch count of ``GRAPH_LAYOUTS``, under the tuned choices."""
    if device.type != "cuda":
        return ()
    with use_policy(policy):
        return _eager_and_graph(preset_name, GRAPH_LAYOUTS, dtype, device, repeats, eager=True)


def _eager_and_graph(
    preset_name: str, layouts: str, dtype: torch.dtype, device: torch.device, repeats: int, eager: bool
) -> tuple[GraphTiming, ...]:
    """Per layout, the eager call (when ``eager``) and the graph replay, timed under the active policy.

    Each layout is captured at its first call and its output checked bitwise against eager: a tune
    that timed wrong results would be worse than none.
    """
    tower = build_tower(preset_name, device, dtype, None, seed=0)
    workloads = parse_layouts(layouts, tower.config)
    tower.enable_graphs(
        capacity=len(workloads),
        min_hits=1,
        max_tokens=max(w.patches for w in workloads),
        budget_bytes=torch.cuda.get_device_properties(device).total_memory // 4,
        by_benefit=False,
    )
    rows = []
    for index, workload in enumerate(progress(workloads, "graphs", "layout")):
        pixels = random_pixels(workload, tower.config, device, index).to(dtype)
        grid = list(workload.grid_thw)
        expected = tower(pixels, grid, use_graphs=False)
        if not torch.equal(tower(pixels, grid), expected):
            raise RuntimeError(f"graph output differs from eager at {workload.spec}: run rocm-vit verify")
        eager_ms = (
            median_ms(functools.partial(tower, pixels, grid, use_graphs=False), device, repeats) if eager else 0.0
        )
        graph_ms = median_ms(functools.partial(tower, pixels, grid), device, repeats)
        rows.append(GraphTiming(workload.patches, round(eager_ms, 4), round(graph_ms, 4)))
    return tuple(rows)


def _profile(
    info: PlatformInfo,
    preset_name: str,
    attention: tuple[AttentionTiming, ...],
    rotary_ms: dict[str, float],
    consumers: tuple[ConsumerTiming, ...],
) -> TunedProfile:
    return TunedProfile(
        key=profile_key(info),
        preset=preset_name,
        created=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        attention=attention,
        rotary_ms=rotary_ms,
        gluon_consumers=consumers,
        three_consumer_waves=three_consumer_waves(consumers),
    )


def _report(profile: TunedProfile, defaults: Policy, tuned: Policy, out: Path, seconds: float) -> str:
    """What was measured and what the profile changes against the defaults."""
    lines = [
        f"rocm-vit tune: {profile.key['device']} ({profile.key['arch']}), preset {profile.preset}, {seconds:.0f} s"
    ]
    names = sorted({name for timing in profile.attention for name in timing.ms})
    lines.append("\nattention (median ms; * fastest, d = default pick, t = tuned pick)")
    lines.append(f"  {'layout':<14}" + "".join(f"{name:>20}" for name in names))
    for timing in profile.attention:
        default_pick = defaults.attention.pick(timing.seq_lens, timing.head_dim)[0]
        tuned_pick = tuned.attention.pick(timing.seq_lens, timing.head_dim)[0]
        fastest = min(timing.ms, key=timing.ms.__getitem__)
        cells = []
        for name in names:
            marks = (
                ("*" if name == fastest else "")
                + ("d" if name == default_pick else "")
                + ("t" if name == tuned_pick else "")
            )
            cells.append(f"{timing.ms[name]:>16.4f} {marks:<3}" if name in timing.ms else f"{'-':>20}")
        lines.append(f"  {f'd{timing.head_dim} {timing.name}':<14}" + "".join(cells))
    if profile.rotary_ms:
        lines.append(f"\nrotary (tower ms, eager calls plus graph replays, summed over {ROTARY_LAYOUTS})")
        lines.extend(f"  {name:<10}{ms:.3f}" for name, ms in sorted(profile.rotary_ms.items(), key=lambda i: i[1]))
    if profile.gluon_consumers:
        lines.append(
            f"\ngluon_attn, two against three consumer warpgroups (ms); three from {profile.three_consumer_waves} waves"
        )
        lines.append(f"  {'layout':<10}{'waves':>8}{'two':>10}{'three':>10}")
        lines.extend(
            f"  {row.name:<10}{row.waves:>8.2f}{row.two_ms:>10.4f}{row.three_ms:>10.4f}"
            for row in profile.gluon_consumers
        )
    if profile.fused_ops_ms:
        lines.append(f"\nfused block ops (graph replay ms, summed over {FUSED_LAYOUTS})")
        lines.extend(f"  {name:<10}{ms:.3f}" for name, ms in profile.fused_ops_ms.items())
    if profile.graphs:
        lines.append("\neager against graph replay (ms), fitted into the policy's cost model")
        lines.append(f"  {'patches':>8}{'eager':>10}{'graph':>10}{'gain':>8}")
        for row in profile.graphs:
            lines.append(
                f"  {row.patches:>8}{row.eager_ms:>10.3f}{row.graph_ms:>10.3f}{1 - row.graph_ms / row.eager_ms:>8.1%}"
            )
    lines.append("\npolicy: default -> tuned")
    for label, before, after in (
        ("attention", defaults.attention.backend, tuned.attention.backend),
        ("rotary", defaults.rotary.value, tuned.rotary.value),
        ("fused ops", defaults.fused_ops.value, tuned.fused_ops.value),
        ("graph launch", f"{defaults.graph_cost.value.launch_ms:.1f} ms", f"{tuned.graph_cost.value.launch_ms:.1f} ms"),
        (
            "replay 6x880",
            f"{defaults.graph_cost.value.replay_ms([880] * 6):.1f} ms",
            f"{tuned.graph_cost.value.replay_ms([880] * 6):.1f} ms",
        ),
        ("3 consumers", defaults.gluon_consumers.value, tuned.gluon_consumers.value),
    ):
        lines.append(f"  {label:<14}{before!s:>12} -> {after}")
    lines.append(f"\nprofile written to {out}")
    lines.append(
        "every later process on this device loads it (ROCM_VIT_PROFILE=off ignores it; rocm-vit doctor shows it)"
    )
    return "\n".join(lines)


def _plot(profile: TunedProfile, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("--plot needs matplotlib (pip install rocm-vit[bench])", file=sys.stderr)
        return
    figure, (left, right) = plt.subplots(1, 2, figsize=(14, 5))
    names = sorted({name for timing in profile.attention for name in timing.ms})
    width = 0.8 / max(1, len(names))
    for offset, name in enumerate(names):
        xs = [i + offset * width for i, timing in enumerate(profile.attention) if name in timing.ms]
        ys = [timing.ms[name] / min(timing.ms.values()) for timing in profile.attention if name in timing.ms]
        left.bar(xs, ys, width=width, label=name)
    left.set_xticks([i + 0.4 - width / 2 for i in range(len(profile.attention))])
    several = len(profile.head_dims) > 1
    labels = [f"{timing.name} d{timing.head_dim}" if several else timing.name for timing in profile.attention]
    left.set_xticklabels(labels, rotation=60, fontsize=8)
    left.set_ylim(0.9, None)
    left.axhline(1.03, color="gray", linestyle=":", linewidth=1)
    left.set_ylabel("time / fastest at that layout (dotted: 3 %)")
    left.set_title(f"attention, head dim {', '.join(map(str, profile.head_dims))}")
    left.legend(fontsize=8)
    if profile.graphs:
        patches = [row.patches for row in profile.graphs]
        right.plot(patches, [row.eager_ms for row in profile.graphs], "o-", label="eager")
        right.plot(patches, [row.graph_ms for row in profile.graphs], "s-", label="graph replay")
        right.set_xlabel("patches")
        right.set_ylabel("ms (median)")
        right.set_title(f"{profile.preset}: eager against graph")
        right.legend()
    figure.suptitle(f"rocm-vit tune: {profile.key['device']} ({profile.key['arch']}), {profile.created}")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
