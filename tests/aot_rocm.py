"""Compile every Triton kernel ahead of time for AMD gfx942 (MI300X) and gfx950 (MI355X), on a CPU.

Nobody on the project has an MI300X or MI355X, but Triton's AMD backend compiles without a GPU and
the AMDGPU code object states what the device would allocate: VGPRs (AGPRs included), SGPRs, spills,
scratch and LDS. tests/test_aot_rocm.py asserts on these numbers in the CPU suite, so a tile that
spills or starves occupancy on an Instinct GPU fails here first. The kernels that round as eager torch
(``ROUNDS_AS_EAGER``) are also compiled for sm_90a, and each record counts the fused multiply-adds in
the AMDGCN or PTX: the wrapper's ``enable_fp_fusion=False`` is what keeps them out.

Launches are not described twice. Each kernel's real wrapper (``triton_varlen_attention``,
``add_norm``, ``triton_rotary_``, ``add_position_embedding_``) is called on small CPU tensors shaped
like the shipped presets (``rocm_vit/presets.yaml``) while ``JITFunction.run`` records its
arguments instead of launching. Triton's own binder then specialises the recorded call for the AMD
target exactly as a launch on the device would (argument types, constexprs, divisibility and
buffer-range attributes, ``num_warps``/``num_stages``/``enable_fp_fusion``), and ``triton.compile``
builds the code object. Identical specialisations from several presets compile once. The binder and
``JITFunction._pack_args`` are Triton internals (checked against Triton 3.9).

    .venv/bin/python -m tests.aot_rocm               # markdown table (docs/rocm-kernels.md)
    .venv/bin/python -m tests.aot_rocm --json PATH   # the records, for tests/test_aot_rocm.py

Runs without ``TRITON_INTERPRET`` (the interpreter replaces ``JITFunction``), compiling into a fresh
temporary Triton cache, in ``--jobs`` spawned processes (default: one per CPU).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import functools
import importlib
import json
import multiprocessing
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

sys.path.append(os.path.dirname(os.path.abspath(__file__)))  # its siblings, run as ``-m tests.aot_rocm`` too
from env_vars import set_env

KERNEL_NAMES = ("triton_attn", "triton_add_norm", "triton_rope", "triton_pos_embed", "triton_silu_mul")
# Kernels whose module promises eager torch's roundings (products and sums rounded apart): their code
# must hold no multiply-add the compiler contracted. Not read from the wrappers' flags, which it checks.
ROUNDS_AS_EAGER = ("triton_add_norm", "triton_rope", "triton_pos_embed", "triton_silu_mul")
PTX_ARCH = "sm_90a"  # H100/H200: Triton's NVIDIA backend compiles without a GPU too (ptxas ships in the wheel)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
WAVE_SIZE = 64


@dataclass(frozen=True)
class ArchLimits:
    """Per-CU resources of a CDNA compute unit (CDNA3 ISA guide; LLVM AMDGPU's gfx90a+ numbers)."""

    lds_bytes: int
    simds: int = 4
    # Unified VGPR/AGPR file per SIMD lane, allocated per wave in granules of 8.
    vgprs_per_lane: int = 512
    vgpr_granule: int = 8
    max_waves_per_simd: int = 8


ARCHS = {"gfx942": ArchLimits(lds_bytes=65_536), "gfx950": ArchLimits(lds_bytes=163_840)}


# One rounding for a * b + c in AMDGCN: VOP2/VOP3, packed, mixed-precision, legacy and dot forms (integer
# v_mad_u32_u24 and the like are address arithmetic), then the destination and up to three sources.
_AMDGCN_FUSED = re.compile(
    r"^\s*(v_(?:pk_)?(?:fma|fmac|mad|mac)(?:ak|mk)?(?:_mix(?:lo|hi)?|_legacy)?_f(?:16|32|64)|v_div_fmas_f(?:32|64)"
    r"|v_dot\w*_f\d+)\S*\s+([^,\s]+),\s*([^,\s]+),\s*([^,\s]+)(?:,\s*([^,\s]+))?",
    re.MULTILINE,
)
# gfx950 multiplies an fp16 by an fp32 as v_fma_mix_f32 with a -0 addend, and adds as one with a factor
# 1.0: one operation, one rounding, exact as the separate op.
_NEGATIVE_ZERO, _ONE = ("neg(0)", "-0"), "1.0"
# PTX: fma and mad on floating-point types.
_PTX_FUSED = re.compile(
    r"^\s*(?:@!?%\w+\s+)?((?:fma|mad)(?:\.\w+)*?\.(?:f16|f32|f64|bf16|f16x2|bf16x2))\s", re.MULTILINE
)
# A correctly rounded fp32 division on AMDGPU (LLVM's SITargetLowering::LowerFDIV32) refines its
# reciprocal with five FMAs and one v_div_fmas_f32 and ends in v_div_fixup_f32: fused by design, exact.
_AMDGCN_DIVISION = re.compile(r"^\s*v_div_fixup_f32\b", re.MULTILINE)
FUSED_OPS_PER_DIVISION = 6


@dataclass
class Compiled:
    """One compiled specialisation: the launches behind it and the fused multiply-adds in its code."""

    kernel: str
    arch: str
    dtype: str
    cases: list[str]  # the preset shapes that launch this specialisation
    config: str  # constexprs and launch options, as passed by the wrapper
    num_warps: int
    enable_fp_fusion: bool = True  # as the wrapper's launch passed it (Triton's default when it passed none)
    fused_ops: dict[str, int] = field(default_factory=dict)  # fused multiply-add mnemonic -> count
    precise_divisions: int = 0  # AMDGCN's correctly rounded fp32 divisions (PTX has div.rn.f32)

    @property
    def label(self) -> str:
        """Kernel, arch, dtype, shapes and config: what a failing check names."""
        return f"{self.kernel} {self.arch} {self.dtype} [{merged_cases(self.cases)}] ({self.config})"

    @property
    def contracted_ops(self) -> int:
        """Fused multiply-adds outside the precise divisions: a product and a sum the compiler contracted."""
        return sum(self.fused_ops.values()) - FUSED_OPS_PER_DIVISION * self.precise_divisions


@dataclass
class Record(Compiled):
    """One specialisation compiled for an AMD arch and what the code object says it needs."""

    vgprs: int = 0  # .vgpr_count: VGPRs plus AGPRs on gfx90a and later (unified file)
    agprs: int = 0
    sgprs: int = 0
    vgpr_spills: int = 0
    sgpr_spills: int = 0
    scratch_bytes: int = 0  # private segment per work-item
    lds_bytes: int = 0  # Triton's dynamic shared memory plus any static group segment
    compiler_occupancy: int = 0  # waves per SIMD, LLVM's own count ("; Occupancy:"), LDS not known to it
    waves_per_simd: int = 0  # ours, from the VGPRs: checked against compiler_occupancy
    workgroups_by_lds: int | None = None  # None: no LDS, LDS sets no limit
    workgroups_by_vgpr: int = 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.aot_rocm", description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the records to this file instead of printing the table")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compile processes (default: CPUs)")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("unset TRITON_INTERPRET: the interpreter replaces the JITFunction this harness records", file=sys.stderr)
        return 2
    # Triton 3.9's own default for kernels that do not pass enable_fp_fusion (triton_attn), set
    # explicitly to silence its warning that 3.10 will change it.
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    records, ptx_records = compile_all(jobs=args.jobs)
    if args.json:
        document = {"amd": records, PTX_ARCH: ptx_records}
        with open(args.json, "w") as handle:
            json.dump({key: list(map(dataclasses.asdict, value)) for key, value in document.items()}, handle, indent=1)
    else:
        print(markdown_table(records))
    return 0


def compile_all(jobs: int = 1) -> tuple[list[Record], list[Compiled]]:
    """Every kernel specialisation the shipped presets launch on a ROCm build, compiled for each arch;
    and those of ``ROUNDS_AS_EAGER`` compiled for ``PTX_ARCH``."""
    specialised: dict[str, tuple[Compiled, dict]] = {}
    for kernel, case, launch_args, arch in _recorded_launches():
        fn, args, kwargs = launch_args
        targets = [*ARCHS] if arch is None else [arch]
        if kernel in ROUNDS_AS_EAGER:
            targets.append(PTX_ARCH)
        for target_arch in targets:
            job = _specialise(fn, args, kwargs, target_arch, _target(target_arch))
            key = repr((kernel, job))
            if key in specialised:
                cases = specialised[key][0].cases
                if case.label not in cases:
                    cases.append(case.label)
                continue
            options = job["options"]
            record_type = Compiled if target_arch == PTX_ARCH else Record
            config = _config_text(fn, kwargs)
            record = record_type(
                kernel, target_arch, case.dtype, [case.label], config, options["num_warps"], options["enable_fp_fusion"]
            )
            specialised[key] = (record, job)
    jobs_list = [job for _, job in specialised.values()]
    # Nothing is reused across runs: every run compiles from source into a fresh cache.
    with tempfile.TemporaryDirectory(prefix="rocm-vit-aot-") as cache_dir, set_env({"TRITON_CACHE_DIR": cache_dir}):
        if jobs <= 1:
            results = [_compile(job) for job in jobs_list]
        else:
            context = multiprocessing.get_context("spawn")  # the workers inherit the environment above
            with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
                results = list(pool.map(_compile, jobs_list))
    records, ptx_records = [], []
    for (record, _), found in zip(specialised.values(), results, strict=True):
        if isinstance(record, Record):
            records.append(_with_occupancy(dataclasses.replace(record, **found)))
        else:
            ptx_records.append(dataclasses.replace(record, **found))

    def order(r: Compiled) -> tuple:
        return KERNEL_NAMES.index(r.kernel), r.arch, list(DTYPES).index(r.dtype)

    return sorted(records, key=order), sorted(ptx_records, key=order)


# ---------------------------------------------------------------------------------------------
# Shapes: from the presets. Launches: from the wrappers.


@dataclass(frozen=True)
class Case:
    """One wrapper call: its dtype and shape, ``"field, field, ..."`` (the table merges by field)."""

    dtype: str
    label: str


def _tower_shapes() -> list[dict[str, Any]]:
    """One entry per distinct tower shape over every preset."""
    from rocm_vit.models.qwen2_5_vl import padded_intermediate_size
    from rocm_vit.tower_config import preset, preset_names

    shapes = {}
    for name in preset_names():
        config = preset(name)
        deepstack = bool(getattr(config, "deepstack_visual_indexes", ()))
        shape = {
            "model_type": config.model_type,
            "hidden": config.hidden_size,
            "heads": config.num_heads,
            "head_dim": config.head_dim,
            # Qwen3-VL's deepstack mergers normalise after the merge, over merge² x hidden.
            "merged": config.hidden_size * config.spatial_merge_size**2 if deepstack else None,
            "position_table": getattr(config, "num_position_embeddings", None),
            # Qwen2.5-VL's gated MLP: silu(gate) * up over its padded width.
            "gated_width": padded_intermediate_size(config.intermediate_size) if config.hidden_act == "silu" else None,
        }
        shapes.setdefault(tuple(shape.items()), shape)
    return list(shapes.values())


def _recorded_launches() -> Iterator[tuple[str, Case, tuple, str | None]]:
    """``(kernel, case, (fn, args, kwargs), arch or None for every arch)`` for each wrapper call."""
    from rocm_vit.backends import triton_add_norm, triton_attn, triton_pos_embed, triton_rope, triton_silu_mul

    for dtype_name, dtype in DTYPES.items():
        for shape in _tower_shapes():
            heads, head_dim, hidden = shape["heads"], shape["head_dim"], shape["hidden"]
            # Attention: the tower passes q, k, v as views of one [N, 3, H, D] projection (token
            # stride 3HD), other callers separate tensors; one 224² image (196 tokens, 32 query tiles
            # of 128 rows at 16 heads) is the few-tiles case, 4096 tokens the many-tiles one. The
            # wrapper picks the tiles from arch, so each arch is its own call.
            for arch in ARCHS:
                for tokens in (196, 4096):
                    for fused in (True, False):
                        q, k, v = _qkv(tokens, heads, head_dim, dtype, fused)
                        cu_seqlens = torch.tensor([0, tokens], dtype=torch.int32)
                        call = functools.partial(
                            triton_attn.triton_varlen_attention, q, k, v, cu_seqlens, tokens, head_dim**-0.5, arch=arch
                        )
                        label = f"H{heads} d{head_dim}, 1x{tokens}, {_qkv_text(fused)}"
                        yield "triton_attn", Case(dtype_name, label), _record_one(call), arch
            # RoPE (ROCm's default rotary): q and k in place, fp32 cos/sin as Qwen-VL passes.
            for fused in (True, False):
                q, k, _ = _qkv(8, heads, head_dim, dtype, fused)
                cos = torch.empty(8, head_dim, dtype=torch.float32)
                call = functools.partial(triton_rope.triton_rotary_, q, k, cos, cos)
                label = f"H{heads}+{heads} d{head_dim}, {_qkv_text(fused)}, fp32 cos/sin"
                yield "triton_rope", Case(dtype_name, label), _record_one(call), None
            # Residual add + norm: each block's two (with update), the first norm1 and the merger's
            # norm (without), and Qwen3-VL's deepstack mergers after the merge (without). The norm's
            # parameters follow the tower dtype (towers are moved with .to(dtype)).
            kind = "rms_norm" if shape["model_type"] == "qwen2_5_vl" else "layer_norm"
            widths = [(hidden, True), (hidden, False)] + ([(shape["merged"], False)] if shape["merged"] else [])
            for width, has_update in widths:
                x = torch.empty(4, width, dtype=dtype)
                weight = torch.empty(width, dtype=dtype)
                bias = torch.empty(width, dtype=dtype) if kind == "layer_norm" else None
                update = torch.empty_like(x) if has_update else None
                call = functools.partial(triton_add_norm.add_norm, x, update, weight, bias, 1e-6, kind)
                label = f"{kind} C{width}, {'with' if has_update else 'no'} update"
                yield "triton_add_norm", Case(dtype_name, label), _record_one(call), None
            if shape["position_table"]:
                x = torch.empty(4, hidden, dtype=dtype)
                table = torch.empty(shape["position_table"], hidden, dtype=dtype)
                taps = torch.zeros(4, triton_pos_embed.NUM_TAPS, dtype=torch.int64)
                weights = torch.zeros(4, triton_pos_embed.NUM_TAPS, dtype=torch.float32)
                # rocm-vit's own towers; SGLang's Qwen3-VL under the plugin rounds each weighted row.
                for round_products in (False, True):
                    call = functools.partial(
                        triton_pos_embed.add_position_embedding_, x, table, taps, weights, round_products=round_products
                    )
                    label = f"C{hidden}, table {shape['position_table']}, int64 taps"
                    label += ", rows rounded (SGLang's)" if round_products else ""
                    yield "triton_pos_embed", Case(dtype_name, label), _record_one(call), None
            if shape["gated_width"]:
                gate_up = torch.empty(4, 2 * shape["gated_width"], dtype=dtype)
                call = functools.partial(triton_silu_mul.silu_mul, gate_up)
                label = f"W{shape['gated_width']}, stacked gate+up"
                yield "triton_silu_mul", Case(dtype_name, label), _record_one(call), None


def _qkv_text(fused: bool) -> str:
    return "views of qkv" if fused else "separate"


def _qkv(tokens: int, heads: int, head_dim: int, dtype: torch.dtype, fused: bool) -> tuple[torch.Tensor, ...]:
    if fused:
        return torch.empty(tokens, 3, heads, head_dim, dtype=dtype).unbind(1)
    return tuple(torch.empty(tokens, heads, head_dim, dtype=dtype) for _ in range(3))


def _record_one(call: Callable[[], Any]) -> tuple:
    """``(kernel, args, kwargs)`` of the one launch ``call`` makes; nothing runs on any device."""
    with _recording() as launches:
        call()
    if len(launches) != 1:
        raise AssertionError(f"expected one kernel launch, recorded {len(launches)}")
    return launches[0]


@contextlib.contextmanager
def _recording() -> Iterator[list[tuple]]:
    from triton.runtime.jit import JITFunction

    launches = []

    def record(self, *args, grid, warmup, **kwargs):
        launches.append((self, args, kwargs))

    original = JITFunction.run
    JITFunction.run = record
    try:
        yield launches
    finally:
        JITFunction.run = original


def _specialise(fn: Any, args: tuple, kwargs: dict, arch: str, target: Any = None) -> dict:
    """What ``JITFunction.run`` would hand to ``triton.compile`` for this call on ``arch`` (an AMD
    arch unless ``target``, a ``GPUTarget``, names another: tests/aot_gluon.py compiles for sm_90a)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    backend = make_backend(target or GPUTarget("hip", arch, WAVE_SIZE))
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound_args, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound_args, specialization, options)
    return {
        "module": fn.fn.__module__,
        "name": fn.fn.__name__,
        "arch": arch,
        "signature": signature,
        "constexprs": constexprs,
        "attrs": attrs,
        "options": dict(options.__dict__),
    }


def _config_text(fn: Any, kwargs: dict) -> str:
    """The wrapper's constexprs and launch options, in launch order; dtypes and strides are elsewhere."""
    constexpr_names = {param.name for param in fn.params if param.is_constexpr}
    parts = [f"{name}={value}" for name, value in kwargs.items() if name in constexpr_names]
    parts += [f"{name}={value}" for name, value in kwargs.items() if name in ("num_warps", "num_stages")]
    return " ".join(parts)


# ---------------------------------------------------------------------------------------------
# Compiling and reading the code object


def _target(arch: str) -> Any:
    from triton.backends.compiler import GPUTarget

    return GPUTarget("cuda", 90, 32) if arch == PTX_ARCH else GPUTarget("hip", arch, WAVE_SIZE)


def _compile(job: dict) -> dict[str, Any]:
    import triton
    from triton.compiler import ASTSource

    fn = getattr(importlib.import_module(job["module"]), job["name"])
    source = ASTSource(fn, job["signature"], job["constexprs"], job["attrs"])
    kernel = triton.compile(source, target=_target(job["arch"]), options=job["options"])
    if job["arch"] == PTX_ARCH:
        return {"fused_ops": ptx_fused_ops(kernel.asm["ptx"])}
    amdgcn = kernel.asm["amdgcn"]
    return {
        **_resources(amdgcn, kernel.metadata.shared),
        "fused_ops": amdgcn_fused_ops(amdgcn),
        "precise_divisions": len(_AMDGCN_DIVISION.findall(amdgcn)),
    }


def amdgcn_fused_ops(amdgcn: str) -> dict[str, int]:
    """Fused multiply-add mnemonic -> count in AMDGCN, less those that are one plain product or sum."""
    counts: dict[str, int] = {}
    for mnemonic, _, first, second, addend in _AMDGCN_FUSED.findall(amdgcn):
        if addend in _NEGATIVE_ZERO or _ONE in (first, second):
            continue
        counts[mnemonic] = counts.get(mnemonic, 0) + 1
    return counts


def ptx_fused_ops(ptx: str) -> dict[str, int]:
    """Fused multiply-add mnemonic -> count in PTX."""
    counts: dict[str, int] = {}
    for mnemonic in _PTX_FUSED.findall(ptx):
        counts[mnemonic] = counts.get(mnemonic, 0) + 1
    return counts


def _resources(amdgcn: str, triton_shared_bytes: int) -> dict[str, int]:
    """Registers, spills, scratch and LDS from the AMDGPU metadata of the one kernel in ``amdgcn``."""

    def field(name: str) -> int:
        values = re.findall(rf"^\s*-?\s*{re.escape(name)}:?\s+(\d+)\s*$", amdgcn, re.MULTILINE)
        if len(values) != 1:
            raise ValueError(f"expected one {name!r} in the AMDGPU metadata, found {values}")
        return int(values[0])

    return {
        "vgprs": field(".vgpr_count"),
        "agprs": field(".agpr_count"),
        "sgprs": field(".sgpr_count"),
        "vgpr_spills": field(".vgpr_spill_count"),
        "sgpr_spills": field(".sgpr_spill_count"),
        "scratch_bytes": field(".private_segment_fixed_size"),
        "lds_bytes": triton_shared_bytes + field(".group_segment_fixed_size"),
        "compiler_occupancy": field("; Occupancy"),
    }


def _with_occupancy(record: Record) -> Record:
    """Workgroups per CU as the LDS and the VGPR file allow; a workgroup's waves spread over the SIMDs."""
    limits = ARCHS[record.arch]
    allocated = -(-record.vgprs // limits.vgpr_granule) * limits.vgpr_granule
    waves_per_simd = min(limits.max_waves_per_simd, limits.vgprs_per_lane // max(allocated, limits.vgpr_granule))
    return dataclasses.replace(
        record,
        waves_per_simd=waves_per_simd,
        workgroups_by_vgpr=limits.simds * waves_per_simd // record.num_warps,
        workgroups_by_lds=limits.lds_bytes // record.lds_bytes if record.lds_bytes else None,
    )


def markdown_table(records: list[Record]) -> str:
    import triton

    lines = [
        f"Triton {triton.__version__}, torch {torch.__version__}; {len(records)} specialisations.",
        "",
        "| kernel | arch | dtype | shape | config | VGPRs (AGPRs) | SGPRs | spills V/S, scratch B | LDS B "
        "| WG/CU by LDS | WG/CU by VGPR |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        by_lds = "-" if r.workgroups_by_lds is None else str(r.workgroups_by_lds)
        lines.append(
            f"| {r.kernel} | {r.arch} | {r.dtype} | {merged_cases(r.cases)} | {r.config} | {r.vgprs} ({r.agprs}) "
            f"| {r.sgprs} | {r.vgpr_spills}/{r.sgpr_spills}, {r.scratch_bytes} | {r.lds_bytes} | {by_lds} "
            f"| {r.workgroups_by_vgpr} |"
        )
    return "\n".join(lines)


def merged_cases(cases: list[str]) -> str:
    """The shapes sharing one specialisation, merged by field where they differ.

    ``["H16 d72, 1x196, separate", "H16 d72, 1x4096, separate"]`` -> ``"H16 d72, 1x196/1x4096, separate"``.
    """
    fields = [case.split(", ") for case in cases]
    if len({len(split) for split in fields}) != 1:
        return "; ".join(cases)
    return ", ".join("/".join(dict.fromkeys(column)) for column in zip(*fields, strict=True))


if __name__ == "__main__":
    sys.exit(main())
