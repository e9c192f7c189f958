"""Rotary on the device: kernel numerics, bit equality with the eager helper, graph capture/replay.

On a GPU the Triton kernel rounds like eager torch (separate fp32 roundings, round-to-nearest-even
casts), so everything here is compared bit for bit against ``rotary_native_`` run eagerly on the
same device, plus a float64 reference as the independent check.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from rocm_vit.backends.rope_torch import rotary_native_

import rocm_vit.rotary as rotary
from rocm_vit.policy import reset_policy

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU (torch.cuda.is_available() is False)"
    ),
]

HEAD_DIMS = (64, 72, 80, 128)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
Args = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
RotaryFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]


@pytest.fixture
def triton_rope():
    return pytest.importorskip("rocm_vit.backends.triton_rope")


@pytest.fixture
def device_generator() -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(4321)


@pytest.fixture
def selection(monkeypatch):
    """Choose the rotary implementation anew under a given ``ROCM_VIT_ROTARY`` (None: the default)."""

    def select(value: str | None) -> str:
        if value is None:
            monkeypatch.delenv("ROCM_VIT_ROTARY", raising=False)
        else:
            monkeypatch.setenv("ROCM_VIT_ROTARY", value)
        reset_policy()
        return rotary.rotary_impl_name()

    yield select
    reset_policy()


def _random_args(
    generator: torch.Generator,
    num_tokens: int,
    q_heads: int,
    k_heads: int,
    head_dim: int,
    q_dtype: torch.dtype,
    k_dtype: torch.dtype | None = None,
) -> Args:
    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, device="cuda")

    return (
        randn(num_tokens, q_heads, head_dim).to(q_dtype),
        randn(num_tokens, k_heads, head_dim).to(k_dtype or q_dtype),
        randn(num_tokens, head_dim),
        randn(num_tokens, head_dim),
    )


def _rotated(fn: RotaryFn, args: Args) -> Args:
    q, k, cos, sin = (t.clone() for t in args)
    fn(q, k, cos, sin)
    return q, k, cos, sin


def _assert_equal_bits(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype
    assert torch.equal(actual, expected), f"max |diff| {(actual.double() - expected.double()).abs().max()}"


def _assert_close_to_float64(actual: torch.Tensor, original: torch.Tensor, cos, sin) -> None:
    x, cos, sin = original.double(), cos.double().unsqueeze(-2), sin.double().unsqueeze(-2)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    reference = x * cos + rotated * sin
    magnitude = (x * cos).abs() + (rotated * sin).abs()
    # fp32 math error is at most 2**-23 * magnitude (2**-22 leaves margin).
    # 16-bit outputs add half an ulp: relative, or absolute below fp16's normal range.
    unit_roundoff, subnormal_step = {
        torch.float32: (0.0, 0.0),
        torch.float16: (2.0**-11, 2.0**-25),
        torch.bfloat16: (2.0**-8, 0.0),
    }[actual.dtype]
    bound = 2.0**-22 * magnitude + unit_roundoff * reference.abs() + subnormal_step
    assert ((actual.double() - reference).abs() <= bound).all()


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("q_heads", "k_heads"), [(16, 16), (16, 4), (3, 5)])
def test_kernel_matches_eager_helper_bitwise(triton_rope, device_generator, head_dim, dtype, q_heads, k_heads):
    # 1001 tokens: the last program holds a partial token block.
    args = _random_args(device_generator, 1001, q_heads, k_heads, head_dim, dtype)
    assert triton_rope.triton_rotary_supports(*args)
    q, k, cos, sin = _rotated(triton_rope.triton_rotary_, args)
    q_native, k_native, _, _ = _rotated(rotary_native_, args)
    _assert_equal_bits(q, q_native)
    _assert_equal_bits(k, k_native)
    _assert_close_to_float64(q, args[0], args[2], args[3])
    _assert_close_to_float64(k, args[1], args[2], args[3])
    _assert_equal_bits(cos, args[2])
    _assert_equal_bits(sin, args[3])


@pytest.mark.parametrize(
    ("q_dtype", "k_dtype"),
    [(torch.float16, torch.bfloat16), (torch.bfloat16, torch.float16), (torch.float32, torch.bfloat16)],
    ids=str,
)
def test_kernel_mixed_dtypes_match_single_dtype_runs(triton_rope, device_generator, q_dtype, k_dtype):
    q, k, cos, sin = _random_args(device_generator, 777, 16, 8, 72, torch.float32)
    q_mixed, k_mixed, _, _ = _rotated(triton_rope.triton_rotary_, (q.to(q_dtype), k.to(k_dtype), cos, sin))
    q_alone, _, _, _ = _rotated(triton_rope.triton_rotary_, (q.to(q_dtype), k.to(q_dtype), cos, sin))
    _, k_alone, _, _ = _rotated(triton_rope.triton_rotary_, (q.to(k_dtype), k.to(k_dtype), cos, sin))
    _assert_equal_bits(q_mixed, q_alone)
    _assert_equal_bits(k_mixed, k_alone)


def test_kernel_writes_only_q_and_k(triton_rope, device_generator):
    q, k, cos, sin = _random_args(device_generator, 333, 16, 16, 80, torch.bfloat16)
    q_buffer = torch.cat([q.flatten(), torch.randn(4096, generator=device_generator, device="cuda").bfloat16()])
    k_buffer = torch.cat([k.flatten(), torch.randn(4096, generator=device_generator, device="cuda").bfloat16()])
    q_tail, k_tail = q_buffer[q.numel() :].clone(), k_buffer[k.numel() :].clone()
    q_view, k_view = q_buffer[: q.numel()].view(q.shape), k_buffer[: k.numel()].view(k.shape)
    triton_rope.triton_rotary_(q_view, k_view, cos, sin)
    q_native, k_native, _, _ = _rotated(rotary_native_, (q, k, cos, sin))
    _assert_equal_bits(q_view, q_native)
    _assert_equal_bits(k_view, k_native)
    _assert_equal_bits(q_buffer[q.numel() :], q_tail)
    _assert_equal_bits(k_buffer[k.numel() :], k_tail)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_kernel_rotates_views_of_a_fused_qkv_buffer_in_place(triton_rope, device_generator, head_dim):
    # The tower's q and k are slices of one [N, 3, H, D] projection (token stride 3 * H * D).
    qkv = torch.randn(999, 3, 16, head_dim, generator=device_generator, device="cuda").bfloat16()
    _, _, cos, sin = _random_args(device_generator, 999, 16, 16, head_dim, torch.bfloat16)
    v_before = qkv[:, 2].clone()
    q_native, k_native, _, _ = _rotated(rotary_native_, (qkv[:, 0], qkv[:, 1], cos, sin))
    q_view, k_view = qkv[:, 0], qkv[:, 1]
    assert triton_rope.triton_rotary_supports(q_view, k_view, cos, sin)
    triton_rope.triton_rotary_(q_view, k_view, cos, sin)
    _assert_equal_bits(qkv[:, 0], q_native)
    _assert_equal_bits(qkv[:, 1], k_native)
    _assert_equal_bits(qkv[:, 2], v_before)


def test_kernel_allocates_nothing_and_never_syncs(triton_rope, device_generator):
    args = _random_args(device_generator, 4096, 16, 16, 72, torch.bfloat16)
    triton_rope.triton_rotary_(*args)  # compile outside the measurement
    torch.cuda.synchronize()
    allocations = torch.cuda.memory_stats()["allocation.all.allocated"]
    torch.cuda.set_sync_debug_mode("error")
    try:
        triton_rope.triton_rotary_(*args)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == allocations


def test_kernel_offsets_do_not_overflow_past_2_to_31_elements(triton_rope, device_generator):
    num_tokens, heads, head_dim = (1 << 20) + 3, 16, 128  # q holds just over 2**31 elements
    if torch.cuda.get_device_properties(0).total_memory < 24 << 30:
        pytest.skip("needs 24 GiB of device memory for a 4 GiB q")
    q = torch.empty(num_tokens, heads, head_dim, device="cuda", dtype=torch.bfloat16)
    _, k, cos, sin = _random_args(device_generator, num_tokens, 1, 1, head_dim, torch.bfloat16)
    q[-2:] = torch.randn(2, heads, head_dim, generator=device_generator, device="cuda").bfloat16()
    tail = (q[-2:].clone(), k[-2:].clone(), cos[-2:], sin[-2:])
    triton_rope.triton_rotary_(q, k, cos, sin)
    q_native, k_native, _, _ = _rotated(rotary_native_, tail)
    _assert_equal_bits(q[-2:], q_native)
    _assert_equal_bits(k[-2:], k_native)


def _capture(fn: RotaryFn, static: Args) -> torch.cuda.CUDAGraph:
    """Capture as the graph runner does: eager warm-up on the capture stream, then capture."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # the second call settles torch.compile's guards for these shapes
            fn(*(t.clone() for t in static))
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
        fn(*static)
    return graph


def _assert_replays_match_eager(
    fn: RotaryFn, generator: torch.Generator, make_args, static: Args, graph: torch.cuda.CUDAGraph
) -> None:
    """Replay with new contents copied into the captured buffers; each replay equals an eager run."""
    for _ in range(3):
        fresh = make_args(generator)
        for buffer, values in zip(static, fresh, strict=True):
            buffer.copy_(values)
        graph.replay()
        expected = _rotated(fn, fresh)
        for actual, wanted in zip(static, expected, strict=True):
            _assert_equal_bits(actual, wanted)


def _capture_and_check(fn: RotaryFn, generator: torch.Generator, make_args) -> None:
    static = make_args(generator)
    graph = _capture(fn, static)
    _assert_replays_match_eager(fn, generator, make_args, static, graph)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_kernel_graph_replay_with_new_contents_matches_eager(triton_rope, device_generator, head_dim):
    def make_args(generator):
        return _random_args(generator, 2048 + 5, 16, 16, head_dim, torch.float16, torch.bfloat16)

    _capture_and_check(triton_rope.triton_rotary_, device_generator, make_args)


def test_apply_rotary_graph_replay_matches_eager(device_generator, selection):
    """The platform default (the Triton kernel on CUDA and ROCm) under capture."""
    selection(None)

    def make_args(generator):
        return _random_args(generator, 1536, 16, 16, 72, torch.bfloat16)

    _capture_and_check(rotary.apply_rotary, device_generator, make_args)


def test_compiled_helper_numerics(device_generator, selection):
    assert selection("compiled") == "compiled"
    args = _random_args(device_generator, 1001, 16, 4, 80, torch.bfloat16)
    q, k, cos, sin = _rotated(rotary.apply_rotary, args)
    # Inductor may contract a product and a sum into one FMA, so this is close, not bitwise.
    _assert_close_to_float64(q, args[0], cos, sin)
    _assert_close_to_float64(k, args[1], cos, sin)


def test_compiled_helper_graph_replay_matches_eager(device_generator, selection):
    assert selection("compiled") == "compiled"

    def make_args(generator):
        return _random_args(generator, 1536, 16, 16, 72, torch.bfloat16)

    static = make_args(device_generator)
    graph = _capture(rotary.apply_rotary, static)
    _assert_replays_match_eager(rotary.apply_rotary, device_generator, make_args, static, graph)


@pytest.mark.parametrize("grad_mode", [torch.inference_mode, torch.no_grad], ids=["inference_mode", "no_grad"])
@pytest.mark.parametrize(("head_dim", "dtype"), [(64, torch.bfloat16), (72, torch.bfloat16), (80, torch.float16)])
def test_compiled_helper_on_fused_qkv_views_in_both_grad_modes(device_generator, selection, grad_mode, head_dim, dtype):
    """What the towers pass: q and k as views of one fused qkv, several image sizes, then a capture.

    The in-place compiled helper failed every call here under inference_mode (torch 2.11, H200).
    """
    assert selection("compiled") == "compiled"
    with grad_mode():
        for tokens in (196, 1024, 3000):  # one compile serves every token count
            qkv = torch.randn(tokens, 3, 16, head_dim, generator=device_generator, device="cuda").to(dtype)
            cos, sin = (torch.randn(tokens, head_dim, generator=device_generator, device="cuda") for _ in range(2))
            original = qkv.clone()
            q, k, _ = qkv.unbind(1)
            rotary.apply_rotary(q, k, cos, sin)
            # Inductor may contract a product and a sum into one FMA: close to float64, not bitwise.
            _assert_close_to_float64(q, original[:, 0], cos, sin)
            _assert_close_to_float64(k, original[:, 1], cos, sin)
            assert torch.equal(qkv[:, 2], original[:, 2]), "v must not be written"
        # Then a capture of the same call: replay equals an eager call bitwise.
        static_qkv = qkv.clone()
        eager = static_qkv.clone()
        rotary.apply_rotary(eager[:, 0], eager[:, 1], cos, sin)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            rotary.apply_rotary(static_qkv[:, 0], static_qkv[:, 1], cos, sin)
        static_qkv.copy_(qkv)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_qkv, eager)
