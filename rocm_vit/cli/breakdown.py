"""Where a forward's device time goes, by kind of kernel: ``rocm-vit bench --breakdown`` and
``rocm-vit bench-sglang --breakdown`` (rocm-vit's tower and SGLang's, sorted by one set of patterns).

The eager forward (the graph's kernels) under the torch profiler: device kernels on a GPU, operators' CPU
time on a CPU. Figures: docs/benchmarks.md, "`rocm-vit bench --breakdown` · H200".
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

from rocm_vit.workloads.workload import table_lines

KERNEL_CLASSES = ("gemm", "attention", "norm", "rotary", "memory", "other")

# First match wins: attention kernels are often built from CUTLASS or named after their GEMMs.
_PATTERNS = (
    # SGLang's Triton attention (context_attention_fwd) launches a kernel named only _fwd_kernel.
    ("attention", re.compile(r"attn|attention|fmha|flash|sdpa|softmax|^_fwd_kernel")),
    # cuBLAS(Lt) (nvjet, cutlass, sm90_xmma, gemm), rocBLAS / hipBLASLt (Cijk_...), aten ops on a CPU.
    ("gemm", re.compile(r"gemm|nvjet|cutlass|xmma|cijk_|matmul|addmm|aten::mm$|aten::bmm|aten::linear")),
    ("norm", re.compile(r"norm")),
    # Inductor names a fused kernel by its aten ops, sorted: rotate-half is the one cat of a negation.
    ("rotary", re.compile(r"rotary|rope|fused\w*_cat_\w*neg")),
    ("memory", re.compile(r"memset|memcpy|copy|catarray|aten::cat$|fill")),
)


def kernel_class(name: str) -> str:
    """One of ``KERNEL_CLASSES`` for a kernel (or, on a CPU, an aten operator) name."""
    lowered = name.lower()
    for kind, pattern in _PATTERNS:
        if pattern.search(lowered):
            return kind
    return "other"


def kernel_breakdown(fn: Callable[[], object], device: torch.device, calls: int = 5) -> dict[str, float]:
    """Milliseconds per call of ``fn`` in each of ``KERNEL_CLASSES`` and ``"total"``, after one warm-up;
    ``"kernels"``: device activities per call (kernels, copies, memsets; on a CPU, operators)."""
    from torch.profiler import ProfilerActivity, profile

    on_gpu = device.type == "cuda"
    fn()
    activity = ProfilerActivity.CUDA if on_gpu else ProfilerActivity.CPU
    with profile(activities=[activity]) as profiler:
        for _ in range(calls):
            fn()
        if on_gpu:
            torch.cuda.synchronize(device)
    totals = dict.fromkeys(KERNEL_CLASSES, 0.0)
    launches = 0
    for event in profiler.key_averages():
        if on_gpu and event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        microseconds = event.self_device_time_total if on_gpu else event.self_cpu_time_total
        totals[kernel_class(event.key)] += microseconds / 1e3 / calls
        launches += event.count
    totals["total"] = sum(totals[kind] for kind in KERNEL_CLASSES)
    totals["kernels"] = launches / calls
    return totals


def format_breakdown(rows: list[dict]) -> str:
    """``layout  total ms  kernels  gemm ms (share)  ...`` for rows that carry a ``breakdown``."""
    lines = ["kernel time per forward, ms (share of the total), and kernels per forward:"]
    header = ["layout", "total", "kernels", *KERNEL_CLASSES]
    cells = []
    for row in rows:
        breakdown = row["breakdown"]
        total = breakdown["total"] or 1.0
        shares = [f"{breakdown[kind]:.3f} ({100 * breakdown[kind] / total:.0f}%)" for kind in KERNEL_CLASSES]
        cells.append([row["layout"], f"{breakdown['total']:.3f}", f"{breakdown['kernels']:.0f}", *shares])
    return "\n".join(lines + table_lines(header, cells))
