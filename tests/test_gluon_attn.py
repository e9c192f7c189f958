"""gluon_attn on a CPU: its kernel compiled for sm_90a, the scope check, the fallbacks, the policy.

The kernel runs only on an sm_90 GPU (tests/gpu/test_attention_gpu.py checks its numbers there). Here
its real launch is compiled for sm_90a with the installed Triton (tests/aot_gluon.py) and the cubin
checked for what would hang or spill on the GPU; the wrapper's choice between the kernel and
``triton_attn`` is checked with the tensors real callers pass.
"""

from __future__ import annotations

import json
import logging

import pytest
import torch
from aot_gluon import FP16_HEAD_DIMS, Record, expected_pairs
from triton_interpreter import run_in_child

pytest.importorskip("triton.experimental.gluon", reason="Triton without Gluon")

from rocm_vit.backends import gluon_attn

# An sm_90 SM: 64K registers and at most 227 KB of shared memory per block.
SM90_REGISTERS = 65536
SM90_SHARED_BYTES = 227 * 1024


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> list[Record]:
    pytest.importorskip("triton.backends.nvidia.compiler", reason="Triton without its NVIDIA backend")
    out = tmp_path_factory.mktemp("aot_gluon") / "records.json"
    run_in_child(
        ["tests/aot_gluon.py", "--json", str(out)],
        {"TRITON_INTERPRET": None, "TRITON_DEFAULT_FP_FUSION": "1"},
        "python tests/aot_gluon.py",
        600,
    )
    return [Record(**fields) for fields in json.loads(out.read_text())]


# (kernel, consumer warpgroups): both attention schedules, whole and split, and the merge.
KERNELS = (("attention", 2), ("attention, tail split", 2), ("attention", 3), ("attention, tail split", 3), ("merge", 0))


def test_every_dtype_and_head_dim_compiles_for_sm90(records):
    """bf16 at every head dim, fp16 at Qwen3-VL's (its cubins are bf16's: tests/aot_gluon.py)."""
    assert {dtype for dtype, _ in expected_pairs()} == {"bf16", "fp16"}
    assert {head_dim for dtype, head_dim in expected_pairs() if dtype == "bf16"} == set(gluon_attn.GLUON_HEAD_DIMS)
    assert set(FP16_HEAD_DIMS) <= set(gluon_attn.GLUON_HEAD_DIMS)
    compiled = {(r.kernel, r.consumers, r.dtype, r.head_dim) for r in records}
    expected = {(kernel, consumers, *pair) for kernel, consumers in KERNELS for pair in expected_pairs()}
    assert compiled == expected, f"missing: {sorted(expected - compiled)}"


def test_kernels_compile_without_spills_within_an_sm(records):
    for r in records:
        label = f"{r.kernel} {r.dtype} d{r.head_dim}"
        assert r.local_bytes == 0, f"{label}: {r.local_bytes} B of local memory (spills)"
        assert r.shared_bytes <= SM90_SHARED_BYTES, f"{label}: {r.shared_bytes} B of shared memory"
        assert r.registers * r.threads <= SM90_REGISTERS, label


def test_attention_kernel_uses_wgmma_and_tma_in_its_warpgroups(records):
    for r in _attention(records):
        assert r.sass_ops["HGMMA"] > 0 and r.sass_ops["UTMALDG"] > 0, (
            f"{r.kernel} {r.dtype} d{r.head_dim}: {r.sass_ops}"
        )
        assert r.threads == (r.consumers + 1) * 128  # the consumers and the loader's (padded) warpgroup


def test_partition_register_requests_fit_the_pool(records):
    # setmaxnreg blocks until the registers it asks for are free: requests beyond the pool the
    # kernel was launched with (its register count times its threads) wait forever on the GPU.
    # Outside the warp-specialised region the default warpgroup holds max(inc) (256) while the
    # others idle at the smallest dec above the loader's; inside it, the default warpgroup (the first
    # consumer) holds what the workers leave: a dec below 256 where that is less, else the 256.
    for r in _attention(records):
        pool_per_warpgroup = r.registers * r.threads // 128
        workers = gluon_attn.CONSUMER_REGS[r.consumers]
        assert workers in r.setmaxnreg_inc and gluon_attn.LOADER_REGS in r.setmaxnreg_dec
        idle = min(n for n in r.setmaxnreg_dec if n > gluon_attn.LOADER_REGS)
        assert max(r.setmaxnreg_inc) + r.consumers * idle <= pool_per_warpgroup, r
        leftover = [n for n in r.setmaxnreg_dec if n > r.registers]
        default = leftover[0] if leftover else max(r.setmaxnreg_inc)
        assert default + (r.consumers - 1) * workers + gluon_attn.LOADER_REGS <= pool_per_warpgroup, r


def _attention(records: list[Record]) -> list[Record]:
    chosen = [r for r in records if r.kernel.startswith("attention")]
    assert chosen
    return chosen


def _fused_qkv(tokens: int = 40, heads: int = 4, head_dim: int = 72, dtype: torch.dtype = torch.bfloat16):
    return torch.randn(tokens, 3, heads, head_dim).to(dtype).unbind(1)


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: _fused_qkv(dtype=torch.float32), "one of bf16 or fp16"),
        (lambda: (_fused_qkv()[0].half(), *_fused_qkv()[1:]), "one of bf16 or fp16"),
        (lambda: _fused_qkv(head_dim=128), "head dim 128 is not one of"),
        (lambda: (_fused_qkv(heads=4)[0], *_fused_qkv(heads=2)[1:]), "grouped-query"),
        # A base 2 bytes past an aligned one, and a token stride of 3 * 4 * 72 + 1 elements.
        (lambda: (torch.empty(40 * 4 * 72 + 1, dtype=torch.bfloat16)[1:].view(40, 4, 72), *_fused_qkv()[1:]), "base"),
        (lambda: (torch.empty(40, 865, dtype=torch.bfloat16)[:, :288].view(40, 4, 72), *_fused_qkv()[1:]), "strides"),
        (lambda: _fused_qkv(), "not an sm_90 GPU"),
    ],
    ids=["fp32", "mixed", "d128", "gqa", "misaligned_base", "odd_stride", "cpu"],
)
def test_unsupported_reason_names_what_the_kernel_does_not_take(make, expected):
    reason = gluon_attn.gluon_unsupported_reason(*make())
    assert reason is not None and expected in reason


def test_fused_qkv_views_pass_the_tensor_checks(monkeypatch):
    monkeypatch.setattr(gluon_attn, "_capability", lambda index: (9, 0))
    q, k, v = _fused_qkv()
    # On a CPU only the device check fails: the views' layout is what TMA takes.
    assert gluon_attn.gluon_unsupported_reason(q, k, v) == "q is on cpu, not an sm_90 GPU"


class _Recorder:
    """Stands in for triton_varlen_attention (or the kernel launch) and counts its calls."""

    def __init__(self, result: torch.Tensor | Exception) -> None:
        self.result = result
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


def test_calls_outside_the_scope_run_triton_attn(monkeypatch):
    q, k, v = _fused_qkv()
    fallback = _Recorder(torch.zeros(1))
    monkeypatch.setattr(gluon_attn, "triton_varlen_attention", fallback)
    cu_seqlens = torch.tensor([0, 17, 40], dtype=torch.int32)
    assert gluon_attn.gluon_varlen_attention(q, k, v, cu_seqlens, 23, 0.1) is fallback.result
    assert fallback.calls == 1
    with pytest.raises(TypeError, match="host int"):  # the shared checks come first
        gluon_attn.gluon_varlen_attention(q, k, v, cu_seqlens, torch.tensor(23), 0.1)


def test_a_kernel_that_does_not_compile_is_logged_once_and_its_shape_runs_triton_attn(monkeypatch, caplog):
    from triton.compiler.errors import CompilationError

    q, k, v = _fused_qkv()
    fallback = _Recorder(torch.zeros(1))
    launch = _Recorder(CompilationError(None, None, "an API this Triton does not have"))
    monkeypatch.setattr(gluon_attn, "triton_varlen_attention", fallback)
    monkeypatch.setattr(gluon_attn, "gluon_unsupported_reason", lambda *tensors: None)
    monkeypatch.setattr(gluon_attn, "_sm_count", lambda index: 132)
    monkeypatch.setattr(gluon_attn, "_attn_fwd", {(1, 4, 2): launch})  # kernel[grid] -> the launch
    monkeypatch.setattr(gluon_attn, "_failed_to_compile", set())
    cu_seqlens = torch.tensor([0, 17, 40], dtype=torch.int32)
    with caplog.at_level(logging.ERROR, logger=gluon_attn.__name__):
        for _ in range(3):
            assert gluon_attn.gluon_varlen_attention(q, k, v, cu_seqlens, 23, 0.1) is fallback.result
    assert launch.calls == 1 and fallback.calls == 3
    assert len(caplog.records) == 1 and "does not compile for head dim 72" in caplog.text
    # Another head dim is its own specialisation: it tries the kernel once too.
    gluon_attn.gluon_varlen_attention(*_fused_qkv(head_dim=80), cu_seqlens, 23, 0.1)
    assert launch.calls == 2 and fallback.calls == 4


@pytest.mark.parametrize(
    ("offsets", "max_seqlen", "expected_grids"),
    [
        # One 12,800-token image: three consumers (192 query rows), 66 whole query blocks, the 67th as
        # 8 key ranges, then the merge of its 192 rows (12 blocks of 16).
        (
            [0, 12800],
            12800,
            [
                ("_attn_fwd", (66, 16, 1), 1, 3),
                ("_attn_fwd", (8, 16, 1), 8, 3),
                ("_merge_kernel", (12, 16, 1), 8, None),
            ],
        ),
        # The same tokens in unequal segments: the host does not know their lengths, one launch.
        ([0, 6000, 12800], 6800, [("_attn_fwd", (36, 16, 2), 1, 3)]),
        # 192 programs of 192 rows (1.45 waves) are too few for three consumers; with two (128 rows)
        # 2,176 tokens are 2.06 waves, so the 17th query block runs as 6 key ranges.
        (
            [0, 2176],
            2176,
            [("_attn_fwd", (16, 16, 1), 1, 2), ("_attn_fwd", (6, 16, 1), 6, 2), ("_merge_kernel", (8, 16, 1), 6, None)],
        ),
        # A full wave (1,024 tokens: 128 programs of 128 rows on 132 SMs): one launch.
        ([0, 1024], 1024, [("_attn_fwd", (8, 16, 1), 1, 2)]),
    ],
    ids=["one_image", "unequal_segments", "small_image", "full_last_wave"],
)
def test_launches_split_the_last_wave_only_where_the_host_knows_the_work(
    monkeypatch, offsets, max_seqlen, expected_grids
):
    assert _recorded_launches(monkeypatch, offsets, max_seqlen) == expected_grids


def _recorded_launches(monkeypatch, offsets: list[int], max_seqlen: int, **kwargs) -> list[tuple]:
    """``(kernel, grid, splits, CONSUMERS)`` of each launch of one call on 132 SMs, nothing run."""
    from triton.runtime.jit import JITFunction

    launches = []
    monkeypatch.setattr(gluon_attn, "gluon_unsupported_reason", lambda *tensors: None)
    monkeypatch.setattr(gluon_attn, "_sm_count", lambda index: 132)
    monkeypatch.setattr(
        JITFunction,
        "run",
        lambda self, *args, grid, warmup, **kw: launches.append(
            (self.fn.__name__, grid, dict(zip(self.arg_names, args, strict=False))["splits"], kw.get("CONSUMERS"))
        ),
    )
    q, k, v = torch.empty(offsets[-1], 3, 16, 72, dtype=torch.bfloat16).unbind(1)
    gluon_attn.gluon_varlen_attention(q, k, v, torch.tensor(offsets, dtype=torch.int32), max_seqlen, 0.1, **kwargs)
    return launches


def test_a_tuned_wave_count_overrides_the_default_rule(monkeypatch):
    # 1x1024 is 96 programs of 192 rows: two consumers by default, three from 0.5 waves; 1x12800 the reverse.
    assert [launch[3] for launch in _recorded_launches(monkeypatch, [0, 1024], 1024)] == [2]
    assert [launch[3] for launch in _recorded_launches(monkeypatch, [0, 1024], 1024, three_consumer_waves=0.5)] == [3]
    never = _recorded_launches(monkeypatch, [0, 12800], 12800, three_consumer_waves=float("inf"))
    assert {launch[3] for launch in never if launch[0] == "_attn_fwd"} == {2}


@pytest.mark.parametrize(
    ("longest_segment", "programs_per_block", "expected"),
    [
        # 16 heads on 132 SMs: 1.5 waves are 198 programs, 13 query blocks of 192 rows.
        (12 * 192, 16, 2),
        (12 * 192 + 1, 16, 3),
        (1024, 4 * 16, 3),  # four 1,024-token frames: 384 programs
        (1024, 16, 2),
        (47376, 16, 3),
    ],
)
def test_three_consumers_once_their_programs_fill_one_and_a_half_waves(longest_segment, programs_per_block, expected):
    waves = gluon_attn.THREE_CONSUMER_WAVES
    assert gluon_attn.consumer_warpgroups(longest_segment, programs_per_block, 132, waves) == expected
