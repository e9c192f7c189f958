"""rocm-vit's adapter over SGLang's own Qwen3-VL tower in each parallel layout SGLang serves it in.

One process per rank, on a CPU (gloo), as tests/test_sglang_parallel.py spawns them, or one a GPU
(NCCL), as tests/gpu/test_sglang_ranks_gpu.py does (``device`` "cuda": below). Each rank builds
SGLang 0.5.23's parallel state the way SGLang's scheduler (or its encode server) does, SGLang's
``Qwen3VLMoeVisionModel`` sharded over it (rocm-vit's ``aiter_attn`` slot, its kernel replaced by
per-segment SDPA), loads the same full weights through the tower's own ``load_weights``, and puts a
stand-in custom all-reduce (``custom_all_reduce.py``) on every group of more than one rank, through
which SGLang's all-reduces then go, as on a GPU. Graphs are the CPU stand-in graphs of
tests/test_graph_runner.py: a replay re-runs the captured function, all-reduces included.

Each rank runs episodes, each with a fresh adapter over the same tower: the same requests through
SGLang's graph path, optionally with a failure injected on the last rank. It writes what it saw
(outputs against SGLang's eager forward bit for bit, the runner's decisions, the all-reduce's
registrations and warm-up zeros) to ``rank{N}.json``. Each episode has a deadline of its own
(``rank_harness.episode_deadline``): a rank that waits past it ends, saying where.

On a GPU (``device="cuda"``): NCCL, SGLang's tower in bf16 on the rank's own GPU with SGLang's
``triton_attn`` (hidden 256: head dim 64, as tests/gpu/test_sglang_gpu.py builds it), real CUDA
graphs (``CudaGraphs``) into which ``injected_failures.InjectedFailures`` injects the failures, SGLang's
``PyNcclCommunicator`` on every group (its all-reduces captured through it), and, for the
``custom_all_reduce`` episode, a stand-in of SGLang's CUDA custom all-reduce keeping its capture
contract (``custom_all_reduce.gpu_sglang_custom_allreduce``: its kernels are sgl_kernel's, which
cannot be installed on the offline GPU images these tests run on). NVLink multicast is off in every rank
(``rank_harness.rank_environment``).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for path in (str(HERE), str(HERE.parent)):  # the torchvision stand-in; tests/ for the stand-in graphs
    if path not in sys.path:
        sys.path.append(path)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from env_vars import set_env  # noqa: E402
from rank_harness import FAILURES, churn_schedule, episode_deadline, failing_rank_arguments, rank_environment  # noqa: E402
from toy_tower import qwen3_vl_8b_config, qwen3_vl_235b_heads_config, tiny_qwen3_vl_config  # noqa: E402

PATCH_DIM = 3 * 2 * 4 * 4  # in_channels * temporal_patch_size * patch_size²
GRIDS = [[(1, 4, 8)], [(1, 4, 4), (2, 4, 2)], [(1, 6, 4)]]
OTHER_GRIDS = [[(1, 8, 4)], [(2, 4, 2), (1, 4, 4)], [(1, 4, 12)], [(1, 4, 4)]]  # another DP rank's images
# The toy tower's all-reduces per forward: 3 blocks x 2, the merger and one deepstack merger.
ALL_REDUCES_PER_CAPTURE = 8
# Qwen3-VL-8B's: 27 blocks x 2, the merger, 3 deepstack mergers; aiter's table (131,072 entries) holds
# this many of its captures, and the stand-in's table as many of the toy tower's.
QWEN3_VL_ALL_REDUCES = 58
# A rank's episode that runs longer than this has hung (rank_harness.episode_deadline).
EPISODE_DEADLINE_S = 300
# What a CPU rank imports before it loads SGLang's plugins (worker: the parallel state, the stand-ins)
# and the layers SGLang's towers import after (~1.3 s a rank), imported once by the fork server that
# forks the CPU ranks (rank_harness.spawn_ranks' ``preload``). None of the SGLang modules rocm-vit's
# hooks wait for (integrations/sglang/hooks.py) is among them or their imports (each rank checks:
# ``_check_no_hooked_module_imported``): each rank still imports those after its plugins load, as a
# fresh process does.
CPU_PRELOAD = (
    "parallel",
    "custom_all_reduce",
    "test_graph_runner",
    "scenario",
    "sglang.srt.distributed.parallel_state",
    "sglang.srt.layers.dp_attention",
    "sglang.srt.layers.rotary_embedding.base",
    "sglang.srt.runtime_context",
    "sglang.srt.server_args",
    "sglang.srt.plugins",
    "sglang.srt.configs.qwen3_vl",
    "sglang.srt.layers.layernorm",
    "sglang.srt.layers.linear",
    "sglang.srt.layers.quantization",
    "sglang.srt.layers.rotary_embedding",
    "sglang.srt.managers.mm_utils",
    "sglang.srt.models.utils",
)
_DEVICE = "cpu"  # this rank's: "cpu" (gloo, stand-in graphs) or "cuda" (NCCL, CUDA graphs); set by worker


def worker(rank: int, world_size: int, rendezvous: str, layout: str, out: str, device: str = "cpu") -> None:
    """One rank of ``layout`` (``LAYOUTS``, or ``GPU_LAYOUTS`` on "cuda"): its parallel state, the
    tower, the episodes, each under its deadline."""
    global _DEVICE
    _DEVICE = device
    if device == "cpu":
        _check_no_hooked_module_imported()
    os.environ.update(rank_environment(device))
    if device == "cuda":
        os.environ.update(GPU_LAYOUT_ENVIRONMENT.get(layout, {}))
    torch.set_num_threads(1)  # ranks share the machine's cores: more threads each spin against each other
    fields, kind, episodes = (GPU_LAYOUTS if device == "cuda" else LAYOUTS)[layout]
    _sgl_kernel_standin_where_missing()
    if device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    (_init_encoder if kind == "encoder" else _init_serving)(rank, world_size, rendezvous, fields)
    report: dict[str, Any] = {"rank": rank}
    try:
        model, groups = _tower(Path(out) / "state.pt", TOWERS.get(layout, "gpu_tiny" if device == "cuda" else "tiny"))
        report["groups"] = groups
        for name in episodes:
            with episode_deadline(EPISODE_DEADLINE_S, name, rank, Path(out, "errors")):
                report[name] = EPISODES[name](model, rank, world_size)
    finally:
        Path(out, f"rank{rank}.json").write_text(json.dumps(report, indent=1))
        dist.barrier()  # nobody leaves while a peer still reduces
        _teardown()


def write_reference_weights(rank: int, directory: str) -> None:
    """Rank 0 of a world of one: full random weights as a checkpoint holds them, one file per tower
    of ``TOWER_CONFIGS`` in ``directory``."""
    os.environ.update(rank_environment("cpu"))
    _sgl_kernel_standin_where_missing()
    _init_serving(0, 1, f"file://{directory}/rendezvous", {})
    _load_rocm_vit()
    for name in TOWER_CONFIGS:
        _write_weights(_build_tower(name), Path(directory, f"{name}.pt"))
    _teardown()


def _write_weights(model: torch.nn.Module, path: Path) -> None:
    _randomise_shard(model, seed=0)
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    # VocabParallelEmbedding pads its rows (64 for 36 positions); a checkpoint has the 36.
    state["pos_embed.weight"] = state["pos_embed.weight"][: model.num_position_embeddings]
    torch.save(state, path)


# Episodes ---------------------------------------------------------------------------------------


def _requests(model: torch.nn.Module, repeats: int = 3) -> list:
    """This rank's requests: each DP rank (attention DP, or a DP encoder's rank) has images of its own."""
    from sglang.srt.layers.dp_attention import is_dp_attention_enabled
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    own = parallel.attn_dp_rank if is_dp_attention_enabled() else (parallel.tp_rank if model.use_data_parallel else 0)
    grids = GRIDS if own == 0 else OTHER_GRIDS
    generator = torch.Generator().manual_seed(own)
    return [(torch.randn(_patches(grid), PATCH_DIM, generator=generator), grid) for grid in grids * repeats]


def _serve_through_a_custom_all_reduce(model: torch.nn.Module, rank: int, world_size: int) -> dict:
    """``_serve`` with a custom all-reduce on the tower's group (a GPU's: the stand-in of SGLang's
    CUDA one, ``gpu_sglang_custom_allreduce``), the sizes it declines through PyNccl: every
    captured slot filled at ``capture()``'s exit before a replay reads it."""
    from custom_all_reduce import gpu_sglang_custom_allreduce

    group = model.blocks[0].mlp.linear_fc2.tp_group
    saved = group.ca_comm
    group.ca_comm = gpu_sglang_custom_allreduce(group)
    try:
        report = _serve(model, rank, world_size)
        ca_comm = group.ca_comm
        report["unfilled_slots"] = ca_comm.unfilled_slots()
    finally:
        group.ca_comm = saved
    return report


def _serve(model: torch.nn.Module, rank: int, world_size: int, failure: str | None = None) -> dict:
    """The requests through SGLang's graph path and rocm-vit's adapter, against SGLang's eager forward."""
    requests = _requests(model)
    eager = _run(model, requests, graphs=False)
    adapter = _adapter(model, **failing_rank_arguments(failure, rank, world_size))
    before = _all_reduce_counts(model)
    served = _run(model, requests, graphs=True)
    stats = adapter.stats()
    return {
        "bitwise_equal": [torch.equal(a, b) for a, b in zip(served, eager, strict=True)],
        "captures": stats["captures"],
        "replays": stats["replays"],
        "graphs": stats["graphs"],
        "eager_runs": {reason: count for reason, count in stats["eager_runs"].items() if count},
        "failures": stats["failures"],
        "stopped": stats["stopped"],
        "blocks": stats["blocks"],
        "agrees": adapter._agree is not None,
        "communicator": None if adapter.all_reduce is None else adapter.all_reduce.communicator,
        "all_reduce": _difference(_all_reduce_counts(model), before),
    }


# The CPU churn: 2,000 calls at capacity 8 make about 25 captures and 17 evictions (the cache filled
# three times over, its uses halved 15 times); every call is ~10 gloo all-reduces, ~13 ms on 2 cores.
CHURN_CALLS = 2000
CHURN_CAPACITY = 8


def _churn(model: torch.nn.Module, rank: int, world_size: int, calls: int = CHURN_CALLS, compare: bool = False) -> dict:
    """``calls`` calls of ever-changing layouts (``rank_harness.churn_schedule``) at capacity
    ``CHURN_CAPACITY``: captures and evictions without end, never a registration. The stand-in's table
    holds as many of this tower's captures as aiter's holds of Qwen3-VL-8B's. ``compare``: each call's
    output against SGLang's eager forward of the same call, bit for bit (``mismatches``); the most
    bytes the runner held after any call, against its budget."""
    ca_comm = model.blocks[0].mlp.linear_fc2.tp_group.ca_comm
    if hasattr(ca_comm, "_table_entries"):
        ca_comm._table_entries = (ca_comm._table_entries // QWEN3_VL_ALL_REDUCES) * ALL_REDUCES_PER_CAPTURE
    grids = churn_schedule(calls, seed=1234)  # the same calls on every rank
    generator = torch.Generator().manual_seed(1234)
    adapter = _adapter(model, SGLANG_VIT_CUDA_GRAPH_CACHE_CAPACITY=str(CHURN_CAPACITY))
    before = _all_reduce_counts(model)
    error, mismatches, most_bytes_held = None, 0, 0
    started = time.perf_counter()
    try:
        with torch.no_grad():
            for grid in grids:
                request = [(torch.randn(_patches(grid), PATCH_DIM, generator=generator), grid)]
                served = _run(model, request, graphs=True)[0]
                if compare:
                    mismatches += not torch.equal(served, _run(model, request, graphs=False)[0])
                most_bytes_held = max(most_bytes_held, adapter.stats().get("bytes_held", 0))
    except Exception as raised:  # what a request would have seen
        error = f"{type(raised).__name__}: {raised}"
    stats = adapter.stats()
    return {
        "error": error,
        "calls": len(grids),
        "capacity": CHURN_CAPACITY,
        "mismatches": mismatches if compare else None,
        "captures": stats["captures"],
        "replays": stats["replays"],
        "evictions": stats["evictions"],
        "eager_runs": {reason: count for reason, count in stats["eager_runs"].items() if count},
        "failures": stats["failures"],
        "most_bytes_held": most_bytes_held,
        "budget_bytes": stats["budget_bytes"],
        "table_entries": getattr(ca_comm, "_table_entries", None),
        "all_reduce": _difference(_all_reduce_counts(model), before),
        "seconds": round(time.perf_counter() - started, 1),
    }


def _start(model: torch.nn.Module, rank: int, world_size: int) -> dict:
    """A server's start with padding on: the padded buckets captured on every rank by the start hooks'
    ``capture_vit_buckets`` (what ``init_cuda_graphs`` and the encode server's post-load step run), then
    this rank's requests, those the runner pads served by a bucket graph, each equal bit for bit to the
    runner's padded eager call (an adapter of capacity 0). The first adapter stays alive beside the
    serving one, as a rebuilt tower's would."""
    from rocm_vit.integrations.sglang.startup import capture_vit_buckets
    from rocm_vit.layout import VisionLayout

    requests = _requests(model, repeats=1)
    reference = _adapter(model, SGLANG_VIT_CUDA_GRAPH_PADDING="1", SGLANG_VIT_CUDA_GRAPH_CACHE_CAPACITY="0")
    padded_eager = _run(model, requests, graphs=True)
    adapter = _adapter(model, SGLANG_VIT_CUDA_GRAPH_PADDING="1")
    padding = adapter._runner.padding
    padded = [padding.padded(VisionLayout.from_grid_thw(grid, 2).attention) is not None for _, grid in requests]
    before = _all_reduce_counts(model)
    captured = capture_vit_buckets(torch.nn.ModuleDict({"visual": model}))  # as SGLang's model holds it
    at_start = adapter.stats()
    served = _run(model, requests, graphs=True)
    stats = adapter.stats()
    return {
        "captured": captured,
        "captures_at_start": at_start["captures"],
        "captures_while_serving": stats["captures"] - at_start["captures"],
        "replays": stats["replays"] - at_start["replays"],
        "padded_requests": sum(padded),
        "bitwise_equal": [torch.equal(a, b) for a, b in zip(served, padded_eager, strict=True)],
        "failures": stats["failures"],
        "all_reduce": _difference(_all_reduce_counts(model), before),
        "a_stale_adapter_beside": not reference.held_by_its_tower(),  # alive (a local), no longer held
    }


# The all-reduces SGLang may pick, as rocm-vit meets them (integrations/sglang/all_reduce.py).
COMMUNICATORS = ["aiter", "sglang_rocm", "sglang_cuda", "sglang_deterministic", "quick", "nccl", "unknown"]


def _communicators(model: torch.nn.Module, rank: int, world_size: int) -> dict:
    """This rank's requests through a fresh adapter under each communicator of ``COMMUNICATORS`` put
    on the tower's group, against SGLang's eager forward. SGLang's own on ROCm and CUDA take at most
    24 patches' all-reduces (the runner's cap: 32-patch requests run eagerly); the quick all-reduce
    takes what aiter's, capped the same, declines."""
    from custom_all_reduce import AiterCustomAllreduce, UnknownCustomAllreduce, quick_allreduce, sglang_custom_allreduce
    from test_graph_runner import stand_in_capturing

    group = model.blocks[0].mlp.linear_fc2.tp_group
    saved = (group.ca_comm, group.qr_comm)
    row_bytes = 4 * max(m.output_size for m in model.modules() if getattr(m, "reduce_results", False))
    capped = 24 * row_bytes
    requests = _requests(model, repeats=2)
    eager = _run(model, requests, graphs=False)
    made = {
        "aiter": lambda: (AiterCustomAllreduce(group, stand_in_capturing), None),
        "sglang_rocm": lambda: (sglang_custom_allreduce(group, stand_in_capturing, "rocm", capped), None),
        "sglang_cuda": lambda: (sglang_custom_allreduce(group, stand_in_capturing, "cuda", capped), None),
        "sglang_deterministic": lambda: (
            sglang_custom_allreduce(group, stand_in_capturing, "deterministic", capped), None
        ),
        "quick": lambda: (AiterCustomAllreduce(group, stand_in_capturing, max_size=capped),
                          quick_allreduce(group, min_bytes=capped + 16)),
        "nccl": lambda: (None, None),
        "unknown": lambda: (UnknownCustomAllreduce(group), None),
    }  # fmt: skip
    reports = {}
    try:
        for name in COMMUNICATORS:
            group.ca_comm, group.qr_comm = made[name]()
            adapter = _adapter(model)
            served = _run(model, requests, graphs=True)
            stats = adapter.stats()
            plan = adapter.all_reduce
            ca_comm = group.ca_comm
            reports[name] = {
                "bitwise_equal": [torch.equal(a, b) for a, b in zip(served, eager, strict=True)],
                "communicator": plan.communicator,
                "problem": plan.problem,
                "plan_max_tokens": plan.max_tokens,
                "runner_max_tokens": None if adapter._runner is None else adapter._runner.max_tokens,
                "captures": stats.get("captures", 0),
                "graphs": stats.get("graphs", 0),
                "eager_runs": {reason: count for reason, count in stats.get("eager_runs", {}).items() if count},
                "registered_slots": getattr(ca_comm, "captured_calls", {}).get("registered", 0),
                "copy_in": getattr(ca_comm, "captured_calls", {}).get("copy_in", 0),
                "exchanges": getattr(ca_comm, "exchanges", 0),
                "empty_slot_reads": getattr(ca_comm, "empty_slot_reads", 0),
                "warm_up_zeros": getattr(ca_comm, "warm_up_zeros", 0),
                "quick_calls": getattr(group.qr_comm, "calls", 0),
            }
    finally:
        group.ca_comm, group.qr_comm = saved
    return reports


# The benchmark's layouts (Qwen3-VL-8B's patches of 16): one image of 16 x 16, 32 x 32 and 64 x 64
# patches, and four of 16 x 16.
BENCH_GRIDS = {"1x256": [(1, 16, 16)], "1x1024": [(1, 32, 32)], "1x4096": [(1, 64, 64)], "4x256": [(1, 16, 16)] * 4}
BENCH_REPEATS = 20


def _bench(model: torch.nn.Module, rank: int, world_size: int) -> dict:
    """Each layout of ``BENCH_GRIDS`` through SGLang's eager forward and through the adapter's graph
    (captured at its first call), the median of ``BENCH_REPEATS`` calls each, host to device done
    (every rank of a group runs the same calls; a request waits for the slowest)."""
    adapter = _adapter(model, SGLANG_VIT_CUDA_GRAPH_MAX_TOKENS="16384")
    generator = torch.Generator().manual_seed(0)
    patch_dim = 3 * model.temporal_patch_size * model.patch_size**2
    rows = {}
    for name, grid in BENCH_GRIDS.items():
        request = [(torch.randn(_patches(grid), patch_dim, generator=generator).to(_DEVICE), grid)]
        eager_ms = _median_ms(functools.partial(_run, model, request, graphs=False))
        before = adapter.stats()
        graph_ms = _median_ms(functools.partial(_run, model, request, graphs=True))
        stats = adapter.stats()
        rows[name] = {
            "patches": _patches(grid),
            "eager_ms": eager_ms,
            "graph_ms": graph_ms,
            **{counter: stats[counter] - before[counter] for counter in ("replays", "captures")},
        }
    return {"rows": rows, "communicator": None if adapter.all_reduce is None else adapter.all_reduce.communicator,
            "device": torch.cuda.get_device_name() if _DEVICE == "cuda" else "cpu"}  # fmt: skip


def _median_ms(call: Any) -> float:
    for _ in range(3):  # warm-up: compiles, the capture, allocator growth
        call()
    times = []
    for _ in range(BENCH_REPEATS):
        if _DEVICE == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        call()
        if _DEVICE == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - started) * 1e3)
    return round(sorted(times)[len(times) // 2], 3)


def _episodes_with_failures(names: list[str]) -> dict:
    return {f"fail_{name}": (lambda model, rank, size, name=name: _serve(model, rank, size, name)) for name in names}


EPISODES = {
    "serve": _serve,
    "churn": _churn,
    "churn_compared": lambda model, rank, size: _churn(model, rank, size, calls=1000, compare=True),
    "custom_all_reduce": _serve_through_a_custom_all_reduce,
    "bench": _bench,
    "start": _start,
    "communicators": _communicators,
    **_episodes_with_failures(list(FAILURES)),
}
_EVERY_FAILURE = ["serve", *(f"fail_{name}" for name in FAILURES)]
# name: (SGLang ServerArgs fields, how the rank starts, episodes)
LAYOUTS: dict[str, tuple[dict, str, list[str]]] = {
    "tp2": ({"tp_size": 2}, "serving", [*_EVERY_FAILURE, "start", "communicators", "churn"]),  # churn: ~25 s
    "tp4": ({"tp_size": 4}, "serving", [*_EVERY_FAILURE, "start", "communicators"]),
    "tp8": ({"tp_size": 8}, "serving", ["serve", "communicators"]),
    "dp_attention_tp4_dp2": ({"tp_size": 4, "dp_size": 2, "enable_dp_attention": True}, "serving", ["serve"]),
    "dp_attention_tp2_dp2": ({"tp_size": 2, "dp_size": 2, "enable_dp_attention": True}, "serving", ["serve", "start"]),
    "dp_encoder_tp2": ({"tp_size": 2, "mm_enable_dp_encoder": True}, "serving", ["serve", "start"]),
    "encode_server_tp2": ({"tp_size": 2}, "encoder", ["serve", "fail_capture", "start"]),
}
# On GPUs: TP 2, TP 4, DP attention with attention-TP 2 and DP 2 (pairs {0, 1} and {2, 3}).
_GPU_EPISODES = [*_EVERY_FAILURE, "custom_all_reduce", "churn_compared"]
GPU_LAYOUTS: dict[str, tuple[dict, str, list[str]]] = {
    "tp2": ({"tp_size": 2}, "serving", _GPU_EPISODES),
    "tp4": ({"tp_size": 4}, "serving", _GPU_EPISODES),
    "dp_attention_tp4_dp2": ({"tp_size": 4, "dp_size": 2, "enable_dp_attention": True}, "serving", _GPU_EPISODES),
    **{f"bench_tp{size}": ({"tp_size": size}, "serving", ["bench"]) for size in (1, 2, 4, 8)},
}
# SGLang gives the attention-TP group a PyNccl only where it syncs sampled token ids over it (or uses
# symmetric memory); without one, its all-reduces go to torch.distributed, which rocm-vit does not
# capture: graphs would be off under DP attention.
GPU_LAYOUT_ENVIRONMENT = {"dp_attention_tp4_dp2": {"SYNC_TOKEN_IDS_ACROSS_TP": "1"}}


# The tower, the adapter, the all-reduce ---------------------------------------------------------

# gpu_tiny: head dim 64, where SGLang's rotary class would otherwise load its own kernel on a GPU.
TOWER_CONFIGS = {
    "tiny": tiny_qwen3_vl_config,
    "qwen3_vl_235b_heads": qwen3_vl_235b_heads_config,
    "gpu_tiny": lambda: tiny_qwen3_vl_config(hidden_size=256),
}
TOWERS = {"tp8": "qwen3_vl_235b_heads"}  # layout: its tower, where not the tiny one
TOWERS |= {f"bench_tp{size}": "qwen3_vl_8b" for size in (1, 2, 4, 8)}
# Towers timed, never compared: each rank's shard random (seeded), no reference checkpoint written.
RANDOM_WEIGHT_TOWERS = {"qwen3_vl_8b": qwen3_vl_8b_config}


def _tower(state_path: Path, config: str) -> tuple[torch.nn.Module, dict]:
    """SGLang's tower on this rank's shard, with rocm-vit loaded, and a stand-in custom all-reduce
    on every group of several ranks (the groups' names and ranks are returned)."""
    from custom_all_reduce import AiterCustomAllreduce, route_cpu_all_reduces_through_ca_comm
    from sglang.srt.runtime_context import get_parallel
    from test_graph_runner import stand_in_capturing

    _load_rocm_vit()
    if _DEVICE == "cpu":
        route_cpu_all_reduces_through_ca_comm()
    parallel = get_parallel()
    groups = {}
    for name in ("tp_group", "attn_tp_group"):
        group = getattr(parallel, name)
        groups[name] = group.ranks
        if _DEVICE == "cpu" and group.world_size > 1 and group.ca_comm is None:
            group.ca_comm = AiterCustomAllreduce(group, stand_in_capturing)
    model = _build_tower(config)
    if config in RANDOM_WEIGHT_TOWERS:
        _randomise_shard(model, seed=parallel.tp_rank)
    else:
        model.load_weights(torch.load(state_path.parent / f"{config}.pt").items())
    from rocm_vit.integrations.sglang.ranks import agreement_group

    agreeing = agreement_group(model)
    groups["agreement"] = None if agreeing is None else agreeing.ranks
    return model, groups


def _build_tower(config: str) -> torch.nn.Module:
    """A toy Qwen3-VL tower of ``TOWER_CONFIGS`` with rocm-vit's aiter_attn slot; ``use_data_parallel``
    as ``Qwen3VLForConditionalGeneration`` passes it."""
    from sglang.srt.models.qwen3_vl import Qwen3VLMoeVisionModel
    from sglang.srt.runtime_context import get_mm

    attention, dtype = ("triton_attn", torch.bfloat16) if _DEVICE == "cuda" else ("aiter_attn", torch.float32)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # as SGLang's model loader builds under the checkpoint's dtype
    try:
        with torch.device(_DEVICE), get_mm().override(mm_attention_backend=attention):
            vision_config = {**TOWER_CONFIGS, **RANDOM_WEIGHT_TOWERS}[config]()
            return Qwen3VLMoeVisionModel(vision_config, use_data_parallel=get_mm().mm_enable_dp_encoder).eval()
    finally:
        torch.set_default_dtype(default_dtype)


def _adapter(model: torch.nn.Module, **settings_or_failures: Any) -> Any:
    """A fresh adapter over ``model``, of stand-in graphs on a CPU, CUDA graphs on a GPU: keyword
    arguments in capitals are ``SGLANG_*`` settings, the others failures to inject (``StandInGraphs``'
    arguments, which ``InjectedFailures`` takes too)."""
    from injected_failures import InjectedFailures
    from test_graph_runner import StandInGraphs

    from rocm_vit.graphs.torch_graphs import CudaGraphs
    from rocm_vit.integrations.sglang import graph_runner

    graph_runner._FAILURE_AGREEMENT_CALLS = 4  # the ranks agree on failures every 4 calls here
    settings = {name: value for name, value in settings_or_failures.items() if name.isupper()}
    failures = {name: value for name, value in settings_or_failures.items() if not name.isupper()}
    with set_env({"SGLANG_VIT_ENABLE_CUDA_GRAPH": "1", **settings}):
        mechanism = InjectedFailures(CudaGraphs(), **failures) if _DEVICE == "cuda" else StandInGraphs(**failures)
        adapter = graph_runner.ViTGraphRunnerAdapter(model, mechanism=mechanism)
    model.graph_runners = adapter
    return adapter


def _all_reduce_counts(model: torch.nn.Module) -> dict[str, int]:
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    counts: dict[str, int] = {}
    for group in {id(g): g for g in (parallel.tp_group, parallel.attn_tp_group)}.values():
        ca_comm = group.ca_comm
        if ca_comm is None:
            continue
        for name, value in (
            ("registered", ca_comm.registered),
            ("exchanges", ca_comm.exchanges),
            ("warm_up_zeros", ca_comm.warm_up_zeros),
            ("captured_registered", ca_comm.captured_calls["registered"]),
            ("captured_copy_in", ca_comm.captured_calls["copy_in"]),
        ):
            counts[name] = counts.get(name, 0) + value
    return counts


def _randomise_shard(model: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():  # norm weights near 1, as scenario.py's
            values = torch.randn(parameter.shape, generator=generator) * 0.1
            parameter.copy_(values + 1.0 if "norm" in name and name.endswith("weight") else values)


def _difference(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {name: value - before.get(name, 0) for name, value in after.items()}


def _load_rocm_vit() -> None:
    """SGLang's plugins loaded (rocm-vit's among them: by its entry point, or by hand where the GPU
    tiers run the checkout from PYTHONPATH), and on a CPU rocm-vit's aiter_attn made to run: aiter's
    kernel replaced by per-segment SDPA (scenario.py's)."""
    import sglang.srt.plugins
    from scenario import _stand_in_aiter_kernel

    import rocm_vit.integrations.sglang as plugin

    sglang.srt.plugins.load_plugins()
    if _DEVICE == "cuda":
        plugin.load()
    else:
        _stand_in_aiter_kernel()


@torch.no_grad()
def _run(model: torch.nn.Module, requests: list, graphs: bool) -> list[torch.Tensor]:
    with set_env({"SGLANG_VIT_ENABLE_CUDA_GRAPH": "1" if graphs else "0"}):
        return [model(pixels.to(_DEVICE), torch.tensor(grid, dtype=torch.int32)) for pixels, grid in requests]


def _patches(grid: list[tuple[int, int, int]]) -> int:
    return sum(t * h * w for t, h, w in grid)


# SGLang's parallel state --------------------------------------------------------------------------


def _init_serving(rank: int, world_size: int, rendezvous: str, fields: dict) -> None:
    """A scheduler's TP worker (sglang/srt/distributed/bootstrap.py, ``_init_parallel_groups``):
    publish with the spawn rank, the world, the model-parallel groups, the DP-attention state."""
    from sglang.srt.distributed.parallel_state import (
        init_distributed_environment,
        initialize_model_parallel,
        set_custom_all_reduce,
    )
    from sglang.srt.layers.dp_attention import initialize_dp_attention
    from sglang.srt.runtime_context import SpawnRanks, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    server_args = ServerArgs(model_path="dummy", **fields)
    # No CUDA IPC probe on a CPU, nor sgl_kernel's all-reduce on the GPU machines: the stand-ins take
    # its place (on a GPU, in the custom_all_reduce episode; PyNccl serves the others).
    set_custom_all_reduce(False)
    reset_context()
    publish(server_args, role="test", ranks=SpawnRanks(world_rank=rank))
    backend = "nccl" if _DEVICE == "cuda" else "gloo"
    init_distributed_environment(
        world_size=world_size, rank=rank, local_rank=rank, distributed_init_method=rendezvous, backend=backend
    )
    initialize_model_parallel(backend=backend)
    initialize_dp_attention(server_args)
    if _DEVICE == "cpu":
        _cpu_rotary()


def _init_encoder(rank: int, world_size: int, rendezvous: str, fields: dict) -> None:
    """The encode server's TP worker in disaggregated serving (EPD), as ``MMEncoder.__init__``
    (sglang/srt/disaggregation/encoder/server.py): a world of its own."""
    from sglang.srt.distributed.parallel_state import (
        init_distributed_environment,
        initialize_model_parallel,
        set_custom_all_reduce,
    )
    from sglang.srt.layers.dp_attention import initialize_dp_attention_flags
    from sglang.srt.runtime_context import get_parallel, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    server_args = ServerArgs(model_path="dummy", **fields)
    set_custom_all_reduce(False)
    reset_context()
    publish(server_args, role="encoder")
    world_size = get_parallel().tp_size  # the encoder's own world
    init_distributed_environment(
        world_size=world_size, rank=rank, local_rank=rank, distributed_init_method=rendezvous, backend="gloo"
    )
    parallel = get_parallel()
    attn_tp_size = parallel.tp_size // parallel.attn_cp_size
    attn_cp_rank, attn_tp_rank = divmod(rank, attn_tp_size)
    parallel.override_permanently(
        tp_rank=rank,
        pp_size=1,
        pp_rank=0,
        attn_dp_size=1,
        attn_dp_rank=0,
        attn_tp_size=attn_tp_size,
        attn_tp_rank=attn_tp_rank,
        attn_cp_rank=attn_cp_rank,
        attn_dcp_size=1,
        moe_ep_size=1,
        moe_ep_rank=0,
        moe_dp_size=1,
        moe_tp_size=parallel.tp_size,
    )
    initialize_model_parallel(backend="gloo")
    initialize_dp_attention_flags(server_args)
    _cpu_rotary()


def _check_no_hooked_module_imported() -> None:
    """A CPU rank starts without the modules rocm-vit's hooks wait for (none in ``CPU_PRELOAD``)."""
    from rocm_vit.integrations.sglang.hooks import HOOKS

    early = sorted({hook.module for hook in HOOKS} & set(sys.modules))
    if early:
        raise RuntimeError(f"imported before rocm-vit's plugin loaded (CPU_PRELOAD): {early}")
    missing = [name for name in CPU_PRELOAD if name not in sys.modules]
    if missing:  # the fork server swallows an ImportError: each rank would import them itself
        raise RuntimeError(f"the fork server did not preload {missing} (not on its PYTHONPATH?)")


def _sgl_kernel_standin_where_missing() -> None:
    """On a CUDA torch without sglang-kernel (the GPU machines), sgl_kernel's test stand-in, as
    scenario.py puts it on the path: SGLang's layers import names from it as they load."""
    from scenario import _sgl_kernel_standin_where_missing

    _sgl_kernel_standin_where_missing()


def _cpu_rotary() -> None:
    # As scenario.py: SGLang's rotary base class would import vllm unless it believes it runs on a CPU.
    import sglang.srt.layers.rotary_embedding.base as rotary_base

    rotary_base._is_cpu = True


def _teardown() -> None:
    """SGLang's groups dropped: their shared-memory message queues unlink."""
    import gc

    from sglang.srt.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    destroy_model_parallel()
    destroy_distributed_environment()
    gc.collect()
