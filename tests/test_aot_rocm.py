"""Every Triton kernel compiled ahead of time for gfx942 (MI300X) and gfx950 (MI355X), on a CPU.

One child process (``python -m tests.aot_rocm --json``, without ``TRITON_INTERPRET``, into a fresh
Triton cache) compiles every specialisation the shipped presets launch on a ROCm build, taken from
the real wrappers (tests/aot_rocm.py says how); the tests check what the code objects need, and that
the kernels that round as eager torch hold no contracted multiply-add on gfx942, gfx950 or sm_90a.
"""

from __future__ import annotations

import json

import pytest
from aot_rocm import (
    ARCHS,
    DTYPES,
    KERNEL_NAMES,
    PTX_ARCH,
    ROUNDS_AS_EAGER,
    Compiled,
    Record,
    _resources,
    _with_occupancy,
    amdgcn_fused_ops,
    ptx_fused_ops,
)
from triton_interpreter import run_in_child

# Attention programs are long-running and latency-bound on their K/V loads: a second resident
# workgroup per CU is what hides one workgroup's loads behind the other's matmuls.
MIN_ATTENTION_WORKGROUPS_PER_CU = 2


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict[str, list[dict]]:
    pytest.importorskip("triton.backends.amd.compiler", reason="Triton without its AMD backend")
    pytest.importorskip("triton.backends.nvidia.compiler", reason="Triton without its NVIDIA backend")
    out = tmp_path_factory.mktemp("aot_rocm") / "records.json"
    run_in_child(
        ["-m", "tests.aot_rocm", "--json", str(out)], {"TRITON_INTERPRET": None}, "python -m tests.aot_rocm", 600
    )
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def records(compiled) -> list[Record]:
    return [Record(**fields) for fields in compiled["amd"]]


@pytest.fixture(scope="module")
def ptx_records(compiled) -> list[Compiled]:
    return [Compiled(**fields) for fields in compiled[PTX_ARCH]]


def test_every_kernel_is_compiled_for_each_arch_and_dtype(records):
    compiled = {(r.kernel, r.arch, r.dtype) for r in records}
    expected = {(kernel, arch, dtype) for kernel in KERNEL_NAMES for arch in ARCHS for dtype in DTYPES}
    assert compiled == expected, f"missing: {sorted(expected - compiled)}"


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("kernel", KERNEL_NAMES)
def test_kernel_compiles_without_spills_or_scratch_and_fits_the_cu_lds(records, kernel, arch):
    lds_limit = ARCHS[arch].lds_bytes
    problems = []
    for r in records:
        if r.kernel != kernel or r.arch != arch:
            continue
        if r.vgpr_spills or r.sgpr_spills or r.scratch_bytes:
            problems.append(
                f"{r.label}: spills {r.vgpr_spills} VGPRs and {r.sgpr_spills} SGPRs, "
                f"{r.scratch_bytes} B scratch per lane ({r.vgprs} VGPRs, {r.sgprs} SGPRs)"
            )
        if r.lds_bytes > lds_limit:
            problems.append(f"{r.label}: {r.lds_bytes} B of LDS, the CU has {lds_limit}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_attention_tiles_leave_room_for_two_workgroups_per_cu(records, arch):
    limits = ARCHS[arch]
    problems = []
    for r in records:
        if r.kernel != "triton_attn" or r.arch != arch:
            continue
        if r.workgroups_by_lds is not None and r.workgroups_by_lds < MIN_ATTENTION_WORKGROUPS_PER_CU:
            problems.append(
                f"{r.label}: {r.workgroups_by_lds} workgroup(s) per CU by LDS "
                f"({r.lds_bytes} B each of {limits.lds_bytes}; two need at most {limits.lds_bytes // 2})"
            )
        if r.workgroups_by_vgpr < MIN_ATTENTION_WORKGROUPS_PER_CU:
            problems.append(
                f"{r.label}: {r.workgroups_by_vgpr} workgroup(s) per CU by VGPRs ({r.vgprs} VGPRs per lane "
                f"-> {r.waves_per_simd} waves per SIMD x {limits.simds} SIMDs, {r.num_warps} waves per workgroup)"
            )
    assert not problems, "\n".join(problems)


def test_waves_per_simd_from_vgprs_agree_with_llvms_occupancy(records):
    # The workgroup counts above rest on this: AGPRs counted, granule and file size right.
    disagree = [
        f"{r.label}: {r.vgprs} VGPRs -> {r.waves_per_simd} waves per SIMD, LLVM says {r.compiler_occupancy}"
        for r in records
        if r.waves_per_simd != r.compiler_occupancy
    ]
    assert not disagree, "\n".join(disagree)


def test_occupancy_rounds_vgprs_to_the_granule_and_spreads_waves_over_the_simds():
    asm = "\n".join(
        [
            "   ; Occupancy: 2",
            "   .agpr_count:     0",
            "   .group_segment_fixed_size: 0",
            "   .private_segment_fixed_size: 0",
            "   .sgpr_count:     98",
            "   .sgpr_spill_count: 0",
            "   .vgpr_count:     249",
            "   .vgpr_spill_count: 0",
        ]
    )
    numbers = _resources(asm, triton_shared_bytes=36_864)
    assert numbers["vgprs"] == 249 and numbers["lds_bytes"] == 36_864 and numbers["compiler_occupancy"] == 2
    four_waves = _with_occupancy(Record("triton_attn", "gfx942", "bf16", ["x"], "c", num_warps=4, **numbers))
    # 249 -> 256 allocated: 2 waves per SIMD, 8 per CU, two 4-wave workgroups; 65 536 B of LDS fit one.
    assert (four_waves.waves_per_simd, four_waves.workgroups_by_vgpr, four_waves.workgroups_by_lds) == (2, 2, 1)
    eight_waves = _with_occupancy(Record("triton_attn", "gfx950", "bf16", ["x"], "c", num_warps=8, **numbers))
    assert (eight_waves.workgroups_by_vgpr, eight_waves.workgroups_by_lds) == (1, 4)


def test_kernels_that_round_as_eager_are_compiled_for_sm_90_too(ptx_records):
    compiled = {(r.kernel, r.dtype) for r in ptx_records}
    assert compiled == {(kernel, dtype) for kernel in ROUNDS_AS_EAGER for dtype in DTYPES}


def test_kernels_that_round_as_eager_launch_without_fp_fusion(records, ptx_records):
    """The option as each wrapper's real launch passed it: without it Triton's default contracts
    (``TRITON_DEFAULT_FP_FUSION=1``), in some kernels' code only where a shape allows it."""
    fused = [r.label for r in (*records, *ptx_records) if r.kernel in ROUNDS_AS_EAGER and r.enable_fp_fusion]
    assert not fused, "launched with fp fusion on:\n" + "\n".join(fused)
    # A kernel launched with fusion off promises eager's roundings: it must be checked as one.
    assert {r.kernel for r in records if not r.enable_fp_fusion} <= set(ROUNDS_AS_EAGER)


@pytest.mark.parametrize("arch", [*ARCHS, PTX_ARCH])
def test_kernels_that_round_as_eager_hold_no_contracted_multiply_add(records, ptx_records, arch):
    """A product and a sum fused into one rounding differ from eager torch in the last bit; only the
    fp32 divisions' own FMAs (exact by design) may be there."""
    contracted = [
        f"{r.label}: {r.contracted_ops} contracted ({r.fused_ops}, {r.precise_divisions} precise divisions)"
        for r in (*records, *ptx_records)
        if r.arch == arch and r.kernel in ROUNDS_AS_EAGER and r.contracted_ops
    ]
    assert not contracted, "\n".join(contracted)


def test_fused_multiply_adds_are_told_from_integer_and_separate_ops():
    amdgcn = "\n".join(
        [
            "\tv_pk_mul_f32 v[0:1], v[2:3], v[4:5]",
            "\tv_sub_f32_e32 v6, v0, v1",
            "\tv_mad_u32_u24 v7, s2, v8, v9",  # address arithmetic
            "\tv_pk_fma_f32 v[0:1], v[2:3], v[4:5], v[6:7]",
            "\tv_fmac_f32_e32 v1, v2, v3",
            "\tv_fma_mixlo_f16 v1, v2, v3, v4",
            "\tv_fma_mix_f32 v10, v0, s4, neg(0) op_sel_hi:[1,0,0]",  # an fp16 times an fp32, rounded once
            "\tv_fma_mix_f32 v11, v0, 1.0, v3 op_sel_hi:[1,0,0]",  # an fp16 plus an fp32, rounded once
            "\tv_fma_f32 v12, v0, v1, v2 op_sel_hi:[1,0,0]",
            "\tv_div_fmas_f32 v9, v9, v10, v13",
            "\t.vgpr_count:     14",
        ]
    )
    assert amdgcn_fused_ops(amdgcn) == {
        "v_pk_fma_f32": 1,
        "v_fmac_f32": 1,
        "v_fma_mixlo_f16": 1,
        "v_fma_f32": 1,
        "v_div_fmas_f32": 1,
    }
    ptx = "\n".join(
        [
            "\tmul.rn.f32 \t%r35, %r1, %r31;",
            "\tmad.lo.s32 \t%r4, %r2, 72, %r3;",
            "\tmad.wide.u32 \t%rd2, %r4, 2, %rd1;",
            "\tfma.rn.f32 \t%r38, %r1, %r31, %r37;",
            "\t@%p1 fma.rn.ftz.f32 \t%r39, %r1, %r31, %r37;",
        ]
    )
    assert ptx_fused_ops(ptx) == {"fma.rn.f32": 1, "fma.rn.ftz.f32": 1}
    # One precise division's five FMAs and v_div_fmas are not contractions; a sixth FMA is.
    division = {"v_fma_f32": 3, "v_fmac_f32": 2, "v_div_fmas_f32": 1}
    record = Compiled("triton_add_norm", "gfx950", "bf16", ["x"], "c", 4, False, division, precise_divisions=1)
    assert record.contracted_ops == 0
    record.fused_ops = {**division, "v_pk_fma_f32": 1}
    assert record.contracted_ops == 1
