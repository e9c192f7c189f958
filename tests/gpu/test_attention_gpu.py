"""Attention backends on a real GPU: accuracy against fp32, graph replay bit-equal to eager, no host sync.

CUDA: sdpa (cuDNN first), torch_varlen, triton_attn, gluon_attn (Hopper), fa4 (where flash-attn-4 is
installed) and auto.
ROCm: sdpa and triton_attn (with the arch's HIP tiles), plus aiter_attn (marked ``rocm``) when aiter is
installed — the MI355X checks of ``make rocm-test``; emulated on NVIDIA (``ROCM_VIT_EMULATE=rocm``), the
same, with aiter_attn through aiter's stand-in computing with torch's varlen kernel.
q, k and v are views of one packed ``[N, 3, H, D]`` projection, as the tower makes them.
"""

from __future__ import annotations

import pytest
import torch

from rocm_vit.attention import BACKENDS, VarlenArgs, get_backend
from rocm_vit.layout import VisionLayout
from rocm_vit.platform import current_platform

pytestmark = pytest.mark.gpu

DEVICE = torch.device("cuda")
HEADS = 16
TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 2e-3}
LAYOUTS = {
    # 256, 1, 960, 96, 96 and 15 tokens: one-token and partial tiles, a video of two frames.
    "ragged": [(1, 16, 16), (1, 1, 1), (1, 24, 40), (2, 8, 12), (1, 3, 5)],
    "single_4096": [(1, 64, 64)],
    "uniform": [(1, 16, 16)] * 4,
}
GENERIC_BACKENDS = ["sdpa", "triton_attn", "gluon_attn", "torch_varlen", "fa4", "auto"]


def _has_aiter() -> bool:
    """ROCm with aiter, or ROCm emulated on NVIDIA (ROCM_VIT_EMULATE=rocm), with aiter's stand-in."""
    return torch.cuda.is_available() and BACKENDS["aiter_attn"].unavailable_reason(current_platform()) is None


AITER = pytest.param(
    "aiter_attn",
    marks=[
        pytest.mark.rocm,
        pytest.mark.skipif(not _has_aiter(), reason="needs ROCm with aiter installed, or ROCM_VIT_EMULATE=rocm"),
    ],
)
BACKEND_NAMES = [*GENERIC_BACKENDS, AITER]


def _backend(name: str):
    if torch.cuda.is_available():
        missing = BACKENDS[name].unavailable_reason(current_platform())
        if missing:
            pytest.skip(f"{name}: {missing}")
    return get_backend(name)


def _layout(name: str) -> VisionLayout:
    return VisionLayout.from_grid_thw(LAYOUTS[name], spatial_merge_size=1)


def _qkv(tokens: int, head_dim: int, dtype: torch.dtype, kv_heads: int = HEADS, seed: int = 0):
    """q ``[N, H, D]`` and k, v ``[N, KH, D]`` as strided views of one packed buffer."""
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    packed = torch.randn(tokens, HEADS + 2 * kv_heads, head_dim, generator=generator, device=DEVICE).to(dtype)
    return packed[:, :HEADS], packed[:, HEADS : HEADS + kv_heads], packed[:, HEADS + kv_heads :]


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens, scale: float) -> torch.Tensor:
    """fp32 attention per segment (plain matmuls and softmax), k/v heads repeated for GQA."""
    groups = q.shape[1] // k.shape[1]
    q, k, v = q.float(), k.float().repeat_interleave(groups, 1), v.float().repeat_interleave(groups, 1)
    outputs = []
    for qs, ks, vs in zip(q.split(list(seq_lens)), k.split(list(seq_lens)), v.split(list(seq_lens)), strict=True):
        weights = torch.softmax(torch.einsum("qhd,khd->hqk", qs, ks) * scale, dim=-1)
        outputs.append(torch.einsum("hqk,khd->qhd", weights, vs))
    return torch.cat(outputs)


def _relative_error(out: torch.Tensor, expected: torch.Tensor) -> float:
    return float((out.float() - expected).norm() / expected.norm())


@torch.inference_mode()
@pytest.mark.parametrize("layout_name", list(LAYOUTS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("head_dim", [64, 72, 80, 128])
@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_backend_matches_fp32_reference(name, head_dim, dtype, layout_name):
    backend = _backend(name)
    layout = _layout(layout_name)
    q, k, v = _qkv(layout.num_patches, head_dim, dtype)
    scale = head_dim**-0.5
    out = backend(q, k, v, backend.runner_args(layout, layout.cu_seqlens_tensor(DEVICE)), scale)
    assert out.shape == q.shape and out.dtype == dtype
    error = _relative_error(out, _reference(q, k, v, layout.seq_lens, scale))
    assert error < TOLERANCE[dtype], f"{name} d{head_dim} {dtype} {layout_name}: relative error {error:.2e}"


@torch.inference_mode()
@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_grouped_query_heads(name):
    backend = _backend(name)
    layout = _layout("ragged")
    q, k, v = _qkv(layout.num_patches, 72, torch.bfloat16, kv_heads=4)
    out = backend(q, k, v, backend.runner_args(layout, layout.cu_seqlens_tensor(DEVICE)), 0.1)
    assert _relative_error(out, _reference(q, k, v, layout.seq_lens, 0.1)) < TOLERANCE[torch.bfloat16]


@torch.inference_mode()
@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_output_dtype_follows_v_when_q_is_fp16_beside_bf16_kv(name):
    backend = _backend(name)
    layout = _layout("ragged")
    q, k, v = _qkv(layout.num_patches, 72, torch.bfloat16)
    out = backend(q.half(), k, v, backend.runner_args(layout, layout.cu_seqlens_tensor(DEVICE)), 72**-0.5)
    assert out.dtype == torch.bfloat16
    assert _relative_error(out, _reference(q.half(), k, v, layout.seq_lens, 72**-0.5)) < TOLERANCE[torch.bfloat16]


@torch.inference_mode()
@pytest.mark.parametrize("layout_name", ["ragged", "single_4096"])
@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_graph_replay_equals_eager_bitwise_with_runner_args(name, layout_name):
    backend = _backend(name)
    layout = _layout(layout_name)
    q, k, v = _qkv(layout.num_patches, 72, torch.bfloat16)
    static_cu = layout.cu_seqlens_tensor(DEVICE).clone()  # the graph runner's static buffer
    layer_args = backend.runner_args(layout, static_cu)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: kernel compilation, library handles, cuDNN plans
        backend(q, k, v, layer_args, 72**-0.5)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = backend(q, k, v, layer_args, 72**-0.5)
    for seed in (1, 2):
        fresh_q, fresh_k, fresh_v = _qkv(layout.num_patches, 72, torch.bfloat16, seed=seed)
        for static, fresh in ((q, fresh_q), (k, fresh_k), (v, fresh_v)):
            static.copy_(fresh)
        graph.replay()
        eager = backend(q, k, v, layer_args, 72**-0.5)
        torch.cuda.synchronize()
        assert torch.equal(static_out, eager), f"{name}: replay differs from eager (seed {seed})"


@torch.inference_mode()
@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_no_host_sync_in_the_runner_args_and_tensor_paths(name):
    backend = _backend(name)
    layout = _layout("ragged")
    q, k, v = _qkv(layout.num_patches, 72, torch.bfloat16)
    cu_seqlens = layout.cu_seqlens_tensor(DEVICE)
    from_layout = backend.runner_args(layout, cu_seqlens)
    tensor_args = backend.layer_args_from_tensor(cu_seqlens, layout.max_seqlen, layout.seq_lens)
    max_only_args = backend.layer_args_from_tensor(cu_seqlens, max_seqlen=layout.max_seqlen) if name != "sdpa" else None
    for layer_args in filter(None, (from_layout, tensor_args, max_only_args)):
        backend(q, k, v, layer_args, 0.1)  # warm-up outside the check: compilation may query the device
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for layer_args in filter(None, (from_layout, tensor_args, max_only_args)):
            backend(q, k, v, layer_args, 0.1)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@torch.inference_mode()
def test_triton_attn_without_max_seqlen_bounds_its_grid_by_tokens_without_a_sync():
    backend = _backend("triton_attn")
    layout = _layout("ragged")
    q, k, v = _qkv(layout.num_patches, 80, torch.float16)
    cu_seqlens = layout.cu_seqlens_tensor(DEVICE)
    layer_args = backend.layer_args_from_tensor(cu_seqlens)
    assert layer_args == VarlenArgs(cu_seqlens, None)
    backend(q, k, v, layer_args, 0.1)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = backend(q, k, v, layer_args, 0.1)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert _relative_error(out, _reference(q, k, v, layout.seq_lens, 0.1)) < TOLERANCE[torch.float16]


@torch.inference_mode()
def test_triton_attn_writes_into_out_and_allocates_nothing_else():
    from rocm_vit.backends.triton_attn import triton_varlen_attention

    _backend("triton_attn")
    layout = _layout("ragged")
    q, k, v = _qkv(layout.num_patches, 72, torch.bfloat16)
    cu_seqlens = layout.cu_seqlens_tensor(DEVICE)
    out = torch.empty_like(q)
    triton_varlen_attention(q, k, v, cu_seqlens, layout.max_seqlen, 0.1, out=out)  # compile
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    result = triton_varlen_attention(q, k, v, cu_seqlens, layout.max_seqlen, 0.1, out=out)
    assert result is out
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before
    assert _relative_error(out, _reference(q, k, v, layout.seq_lens, 0.1)) < TOLERANCE[torch.bfloat16]


def _gluon_kernel_only(monkeypatch, consumers: int | None = None):
    """gluon_attn's wrapper with its triton_attn fallback made to fail: what passes ran the Gluon kernel
    (with ``consumers`` warpgroups per program whatever the lengths, where given)."""
    _backend("gluon_attn")
    from rocm_vit.backends import gluon_attn

    def no_fallback(*args, **kwargs):
        raise AssertionError("gluon_attn fell back to triton_attn")

    monkeypatch.setattr(gluon_attn, "triton_varlen_attention", no_fallback)
    if consumers is not None:
        monkeypatch.setattr(gluon_attn, "THREE_CONSUMER_WAVES", 0 if consumers == 3 else float("inf"))
    return gluon_attn.gluon_varlen_attention


@torch.inference_mode()
@pytest.mark.parametrize("consumers", [2, 3])
@pytest.mark.parametrize("head_dim", [64, 72, 80])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_gluon_kernel_writes_every_valid_row_into_a_poisoned_out(monkeypatch, head_dim, dtype, consumers):
    attend = _gluon_kernel_only(monkeypatch, consumers)
    # 1-token, 7-token and partial-tile segments, a 300-token one spanning three key tiles, and 16384
    # tokens: every last-tile and last-query-tile case, and programs whose later warpgroups are idle.
    layout = VisionLayout.from_grid_thw([(1, 10, 10), (1, 1, 7), (1, 1, 1), (1, 15, 20), (1, 128, 128)], 1)
    q, k, v = _qkv(layout.num_patches, head_dim, dtype)
    out = torch.full_like(q, float("nan"))
    cu_seqlens = layout.cu_seqlens_tensor(DEVICE)
    assert attend(q, k, v, cu_seqlens, layout.max_seqlen, head_dim**-0.5, out=out) is out
    error = _relative_error(out, _reference(q, k, v, layout.seq_lens, head_dim**-0.5))
    assert not out.isnan().any() and error < TOLERANCE[dtype]


@torch.inference_mode()
@pytest.mark.parametrize("consumers", [2, 3])
def test_gluon_kernel_is_deterministic_and_masks_the_next_segments_keys(monkeypatch, consumers):
    attend = _gluon_kernel_only(monkeypatch, consumers)
    layout = VisionLayout.from_grid_thw([(1, 30, 37), (1, 16, 16), (1, 9, 13)], 1)
    q, k, v = _qkv(layout.num_patches, 72, torch.bfloat16)
    cu_seqlens = layout.cu_seqlens_tensor(DEVICE)
    first = attend(q, k, v, cu_seqlens, layout.max_seqlen, 0.1)
    assert torch.equal(first, attend(q, k, v, cu_seqlens, layout.max_seqlen, 0.1))
    # The first segment's last key tile reads the second segment's rows: NaN keys and huge (finite)
    # values there must leave the first segment's output bit for bit. (An inf or NaN value would
    # reach it through 0 x inf, as in FlashAttention-3 and -4; triton_attn never reads there.)
    end = layout.seq_lens[0]
    k[end:] = float("nan")
    v[end:] = 3e4
    again = attend(q, k, v, cu_seqlens, layout.max_seqlen, 0.1)
    assert torch.equal(again[:end], first[:end])


# gluon_attn's tail split (backends/tail_split.py). The plan is taken for an H200's 132 SMs whatever
# the GPU, so each case splits; segments of equal length, as one image or a video's frames.
SPLIT_CASES = {  # (segments, tokens each, head dim, dtype, consumer warpgroups)
    "1x12800_d72_bf16_3": (1, 12800, 72, torch.bfloat16, 3),
    "2x6400_d64_fp16_3": (2, 6400, 64, torch.float16, 3),
    "1x6400_d80_bf16_2": (1, 6400, 80, torch.bfloat16, 2),
    "1x2176_d72_bf16_2": (1, 2176, 72, torch.bfloat16, 2),
}


def _split_case(monkeypatch, case: str):
    """The kernel-only wrapper on 132 SMs, inputs, offsets, the plan it will run and its block rows."""
    from rocm_vit.backends import gluon_attn
    from rocm_vit.backends.tail_split import plan_tail_split

    segments, seq_len, head_dim, dtype, consumers = SPLIT_CASES[case]
    attend = _gluon_kernel_only(monkeypatch, consumers)
    monkeypatch.setattr(gluon_attn, "_sm_count", lambda index: 132)
    q, k, v = _qkv(segments * seq_len, head_dim, dtype)
    cu_seqlens = torch.arange(segments + 1, dtype=torch.int32, device=DEVICE) * seq_len
    block_rows = consumers * gluon_attn.CONSUMER_ROWS
    plan = plan_tail_split(seq_len, block_rows, gluon_attn.BLOCK_N, HEADS * segments, 132)
    assert plan is not None, f"{case} does not split on 132 SMs"
    return attend, (q, k, v, cu_seqlens, seq_len, head_dim**-0.5), plan, block_rows


@torch.inference_mode()
@pytest.mark.parametrize("case", list(SPLIT_CASES))
def test_gluon_tail_split_rows_match_fp32_and_the_rest_equal_whole_programs(monkeypatch, case):
    from rocm_vit.backends import gluon_attn

    attend, (q, k, v, cu_seqlens, seq_len, scale), plan, block_rows = _split_case(monkeypatch, case)
    split = attend(q, k, v, cu_seqlens, seq_len, scale, out=torch.full_like(q, float("nan")))
    monkeypatch.setattr(gluon_attn, "plan_tail_split", lambda *args: None)
    whole = attend(q, k, v, cu_seqlens, seq_len, scale)
    assert not split.isnan().any()
    segments = len(cu_seqlens) - 1
    tail_row = plan.first_tail_block * block_rows
    for seq in range(segments):
        start, end = seq * seq_len, (seq + 1) * seq_len
        assert torch.equal(split[start : start + tail_row], whole[start : start + tail_row])
        rows = slice(start + tail_row, end)
        weights = torch.softmax(torch.einsum("qhd,khd->hqk", q[rows].float(), k[start:end].float()) * scale, -1)
        expected = torch.einsum("hqk,khd->qhd", weights, v[start:end].float())
        split_error = _relative_error(split[rows], expected)
        # The merge reorders fp32 sums only: its error is the whole programs' (the output's rounding).
        assert split_error < TOLERANCE[q.dtype] and split_error < 1.05 * _relative_error(whole[rows], expected)


@torch.inference_mode()
def test_gluon_tail_split_replays_bitwise_and_syncs_nothing(monkeypatch):
    attend, (q, k, v, cu_seqlens, seq_len, scale), _, _ = _split_case(monkeypatch, "1x12800_d72_bf16_3")
    out = torch.empty_like(q)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        attend(q, k, v, cu_seqlens, seq_len, scale, out=out)  # compile
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        attend(q, k, v, cu_seqlens, seq_len, scale, out=out)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # a sync, or a host read of cu_seqlens, would fail the capture
        attend(q, k, v, cu_seqlens, seq_len, scale, out=out)
    for seed in (1, 2):
        for static, fresh in zip((q, k, v), _qkv(len(q), 72, torch.bfloat16, seed=seed), strict=True):
            static.copy_(fresh)
        graph.replay()
        eager = attend(q, k, v, cu_seqlens, seq_len, scale)
        again = attend(q, k, v, cu_seqlens, seq_len, scale)
        torch.cuda.synchronize()
        assert torch.equal(out, eager) and torch.equal(eager, again), f"seed {seed}"


def _compiled_variants(*kernels) -> int:
    """Variants compiled in this process so far, of each kernel on every device (Triton's own cache)."""
    return sum(len(cache[0]) for kernel in kernels for cache in kernel.device_caches.values())


@pytest.mark.parametrize("name", ["triton_attn", "gluon_attn"])
def test_prepare_compiles_every_variant_a_stream_of_serving_layouts_launches(name):
    from rocm_vit.backends import gluon_attn, tail_split, triton_attn

    backend = _backend(name)
    backend.prepare(72, HEADS, HEADS, torch.bfloat16, DEVICE)
    kernels = (triton_attn._varlen_attn_fwd, gluon_attn._attn_fwd, tail_split._merge_kernel)
    prepared = _compiled_variants(*kernels)
    generator = torch.Generator().manual_seed(0)
    for _ in range(60):  # one image, several, a video's frames: up to 16,384 tokens
        kind = int(torch.randint(3, (), generator=generator))
        count = 1 if kind == 0 else int(torch.randint(2, 9, (), generator=generator))
        longest = 16384 // count // 4
        lengths = [4 * int(torch.randint(16, longest, (), generator=generator))] * count
        if kind == 1:
            lengths = [4 * int(torch.randint(16, longest, (), generator=generator)) for _ in range(count)]
        q, k, v = torch.randn(sum(lengths), 3, HEADS, 72, device=DEVICE, dtype=torch.bfloat16).unbind(1)
        offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
        backend(q, k, v, VarlenArgs(offsets, max(lengths)), 72**-0.5)
    assert _compiled_variants(*kernels) == prepared
