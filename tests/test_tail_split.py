"""The tail split of gluon_attn's last wave: the plan (pure arithmetic) and the merge kernel, interpreted.

The split programs themselves run only on an sm_90 GPU (tests/gpu/test_attention_gpu.py); here their
partials are computed in float64 the way the kernel defines them, poisoned where the merge must not
read, and merged by the real Triton kernel under the interpreter.
"""

from __future__ import annotations

import math

import pytest
import torch
from rocm_vit.backends import tail_split
from rocm_vit.backends.tail_split import TailSplit, plan_tail_split
from triton_interpreter import run_interpreted

H200_SMS = 132


@pytest.mark.parametrize(
    ("seq_len", "segments", "expected"),
    [
        # 1,600 programs = 12 waves + 16: the 16 programs of the last query block, 8 ways each.
        (12800, 1, TailSplit(first_tail_block=99, tail_blocks=1, splits=8)),
        (6400, 1, TailSplit(first_tail_block=49, tail_blocks=1, splits=8)),
        (6400, 2, TailSplit(first_tail_block=49, tail_blocks=1, splits=4)),
        # 2.06 waves: one tail block's 16 programs, 6 ways.
        (2176, 1, TailSplit(first_tail_block=16, tail_blocks=1, splits=6)),
        # 44.97 waves, 7.76, 13.7, 15.5: the last wave is nearly full, nothing to win.
        (47376, 1, None),
        (8160, 1, None),
        (14400, 1, None),
        (8160, 2, None),
        (1024, 1, None),  # one wave
    ],
)
def test_plan_for_128_row_programs_splits_only_a_nearly_empty_last_wave(seq_len, segments, expected):
    assert plan_tail_split(seq_len, 128, 128, 16 * segments, H200_SMS) == expected


@pytest.mark.parametrize(
    ("seq_len", "segments", "expected"),
    [
        # 192 query rows against 128-key tiles: 1,072 programs = 8 waves + 16, each 100 tiles long.
        (12800, 1, TailSplit(first_tail_block=66, tail_blocks=1, splits=8)),
        # 5.21 waves: the last two blocks' 32 programs, 4 ways (the 128-row launch, 7.76 waves, keeps whole).
        (8160, 1, TailSplit(first_tail_block=41, tail_blocks=2, splits=4)),
        (14400, 1, TailSplit(first_tail_block=74, tail_blocks=1, splits=8)),
        # 21 query blocks of 32 key tiles (2.55 waves): counting the tiles as blocks, no split would pay.
        (4008, 1, TailSplit(first_tail_block=16, tail_blocks=5, splits=3)),
        (47376, 1, None),  # 29.94 waves
        (4096, 1, None),  # 22 blocks x 16 heads: 2.67 waves, a split would not end sooner
    ],
)
def test_plan_for_192_row_programs_counts_128_key_tiles(seq_len, segments, expected):
    assert plan_tail_split(seq_len, 192, 128, 16 * segments, H200_SMS) == expected


@pytest.mark.parametrize("block_rows", [128, 192])
@pytest.mark.parametrize("sms", [78, 108, 132, 304])  # an L20, an A100, an H200, an MI300X
def test_every_plan_is_a_valid_launch_that_the_model_says_is_faster(sms, block_rows):
    for heads in (12, 16):
        for seq_len in range(256, 40000, 173):
            plan = plan_tail_split(seq_len, block_rows, 128, heads, sms)
            if plan is None:
                continue
            blocks, tiles = math.ceil(seq_len / block_rows), math.ceil(seq_len / 128)
            assert plan.first_tail_block + plan.tail_blocks == blocks
            assert 2 <= plan.splits <= tail_split.MAX_SPLITS
            assert tiles // plan.splits >= tail_split.MIN_TILES_PER_SPLIT  # every key range has tiles
            overhead = tail_split.PROGRAM_OVERHEAD_TILES
            whole = math.ceil(blocks * heads / sms) * (tiles + overhead)
            split = (
                math.ceil(plan.first_tail_block * heads / sms) * (tiles + overhead)
                + math.ceil(plan.tail_blocks * heads * plan.splits / sms) * (math.ceil(tiles / plan.splits) + overhead)
                + tail_split.SPLIT_OVERHEAD_TILES
            )
            assert split <= whole * (1 - tail_split.MIN_GAIN), (seq_len, heads, sms, plan)


# ---------------------------------------------------------------------------------------------
# The merge kernel through the Triton interpreter

_MERGE_SCRIPT = """
import sys
import torch
from rocm_vit.backends.tail_split import merge_tail
cases = torch.load(sys.argv[1])
outputs = {}
for name, case in cases.items():
    out = case["out"].clone()
    merge_tail(case["part_o"], case["part_ml"], out, case["cu_seqlens"], case["first_tail_row"])
    outputs[name] = out
torch.save(outputs, sys.argv[2])
"""

BLOCK_ROWS = 128
WIDTH = 80


def _merge_case(generator, seq_len, segments, heads, head_dim, plan, dtype) -> dict:
    """Random q, k, v; the split programs' partials as the kernel defines them (float64, base 2).
    Poison: finite garbage in the partial rows past the segment (a merge that wrote them would leave
    numbers where ``out`` must keep its NaN), NaN in the columns past the head dim and in ``out``."""
    scale_log2 = head_dim**-0.5 * math.log2(math.e)
    tokens = seq_len * segments
    q, k, v = (torch.randn(tokens, heads, head_dim, generator=generator, dtype=torch.float64) for _ in range(3))
    first_tail_row = plan.first_tail_block * BLOCK_ROWS
    rows = plan.tail_blocks * BLOCK_ROWS
    part_o = torch.full((plan.splits, segments, rows, heads, WIDTH), 7.0, dtype=torch.float64)
    part_o[..., head_dim:] = float("nan")
    part_ml = torch.tensor([0.0, 1.0], dtype=torch.float64).repeat(plan.splits, segments, rows, heads, 1)
    tiles = math.ceil(seq_len / BLOCK_ROWS)
    expected = torch.full((tokens, heads, head_dim), float("nan"), dtype=torch.float64)
    for seq in range(segments):
        base = seq * seq_len
        valid = min(rows, seq_len - first_tail_row)
        q_tail = q[base + first_tail_row : base + first_tail_row + valid]
        scores = torch.einsum("qhd,khd->hqk", q_tail, k[base : base + seq_len]) * scale_log2
        weights = torch.softmax(scores / math.log2(math.e), dim=-1)
        expected[base + first_tail_row : base + first_tail_row + valid] = torch.einsum(
            "hqk,khd->qhd", weights, v[base : base + seq_len]
        )
        for split in range(plan.splits):
            keys = slice(split * tiles // plan.splits * BLOCK_ROWS, (split + 1) * tiles // plan.splits * BLOCK_ROWS)
            part = scores[:, :, keys]
            m = part.amax(-1)
            p = torch.exp2(part - m[..., None])
            part_o[split, seq, :valid, :, :head_dim] = torch.einsum("hqk,khd->qhd", p, v[base : base + seq_len][keys])
            part_ml[split, seq, :valid, :, 0] = m.T
            part_ml[split, seq, :valid, :, 1] = p.sum(-1).T
    case = {
        "part_o": part_o.float(),
        "part_ml": part_ml.float(),
        "out": torch.full((tokens, heads, head_dim), float("nan"), dtype=dtype),
        "cu_seqlens": torch.arange(segments + 1, dtype=torch.int32) * seq_len,
        "first_tail_row": first_tail_row,
    }
    return case, expected


@pytest.fixture(scope="module")
def merged(tmp_path_factory) -> dict:
    pytest.importorskip("triton")
    generator = torch.Generator().manual_seed(11)
    cases, expected = {}, {}
    specs = {
        # Two segments of 300: query block 1 and 2 (rows 128-383, 84 of them past the end), 3 key ranges.
        "two_segments_fp32": (300, 2, 3, 72, TailSplit(1, 2, 3), torch.float32),
        # Everything split (no main launch), 5 key ranges of 2 or 3 tiles, head dim 64, fp16 output.
        "all_tail_d64_fp16": (1200, 1, 2, 64, TailSplit(0, 10, 4), torch.float16),
        "d80_bf16": (520, 1, 2, 80, TailSplit(3, 2, 2), torch.bfloat16),
    }
    for name, spec in specs.items():
        cases[name], expected[name] = _merge_case(generator, *spec)
    outputs = run_interpreted(_MERGE_SCRIPT, cases, tmp_path_factory.mktemp("merge"), {})
    return {name: (outputs[name], expected[name]) for name in cases}


@pytest.mark.parametrize("name", ["two_segments_fp32", "all_tail_d64_fp16", "d80_bf16"])
def test_merge_writes_the_tail_rows_as_whole_attention_and_nothing_else(merged, name):
    out, expected = merged[name]
    written = ~expected.isnan()
    assert torch.equal(~out.isnan(), written), "the merge wrote rows outside the tail, or missed some"
    tolerance = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}[out.dtype]
    torch.testing.assert_close(out.double()[written], expected[written], atol=tolerance, rtol=0)
