"""Every Triton kernel compiled ahead of time for gfx942 (MI300X) and gfx950 (MI355X), on a CPU.

One child process (``python -m tests.aot_rocm --json``, without ``TRITON_INTERPRET``, into a fresh
Triton cache) compiles every specialisation the shipped presets launch on a ROCm build, taken from
the real wrappers (tests/aot_rocm.py says how); the tests check what the code objects need.
"""

from __future__ import annotations

import json

import pytest
from aot_rocm import ARCHS, DTYPES, KERNEL_NAMES, Record, _resources, _with_occupancy
from triton_interpreter import run_in_child

# Attention programs are long-running and latency-bound on their K/V loads: a second resident
# workgroup per CU is what hides one workgroup's loads behind the other's matmuls.
MIN_ATTENTION_WORKGROUPS_PER_CU = 2


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> list[Record]:
    pytest.importorskip("triton.backends.amd.compiler", reason="Triton without its AMD backend")
    out = tmp_path_factory.mktemp("aot_rocm") / "records.json"
    run_in_child(
        ["-m", "tests.aot_rocm", "--json", str(out)], {"TRITON_INTERPRET": None}, "python -m tests.aot_rocm", 600
    )
    return [Record(**fields) for fields in json.loads(out.read_text())]


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
