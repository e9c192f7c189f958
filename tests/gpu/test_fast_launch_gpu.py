"""backends/fast_launch.py against Triton on the device: after a kernel's first launch, launches skip
``JITFunction.run``; each keeps the kernel ``run`` would pick (``VERIFY``), and outputs equal the slow
path's bit for bit, per kernel and for whole towers, eager and replayed, and for one kernel launched
across every edge ``run`` specialises on (ints equal to 1 and 16, unaligned pointers, storages over
2 GiB). Also: bench's eager cost columns count a known number of kernels."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from rocm_vit.backends import fast_launch, triton_add_norm, triton_attn, triton_pos_embed, triton_rope, triton_silu_mul
from triton.runtime.jit import JITFunction

from rocm_vit.models import preset, tower_class
from rocm_vit.workloads.launch_cost import eager_cost

pytestmark = pytest.mark.gpu

DEVICE = torch.device("cuda")


@pytest.fixture(autouse=True)
def verified(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every fast launch asks run() for its kernel too and raises if it kept another."""
    monkeypatch.setattr(fast_launch, "VERIFY", True)


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list:
    """The launches that went through ``JITFunction.run`` (VERIFY's own warm-up asks not counted)."""
    seen = []
    original = JITFunction.run

    def counting(self, *args, grid, warmup, **kwargs):
        if not warmup:
            seen.append(self)
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    monkeypatch.setattr(JITFunction, "run", counting)
    return seen


def _slow_path(monkeypatch: pytest.MonkeyPatch, slow: bool) -> None:
    # A launch hook sends every launch through run(); the kept kernels stay for later.
    monkeypatch.setattr(fast_launch, "_hooks_set", lambda: slow)


def _cases():
    generator = torch.Generator(device=DEVICE).manual_seed(0)

    def randn(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=generator, device=DEVICE, dtype=dtype)

    x, update, weight, bias = randn(300, 1152), randn(300, 1152), randn(1152), randn(1152)
    qkv = randn(2116, 3, 16, 72)
    cos, sin = randn(2116, 72, dtype=torch.float32), randn(2116, 72, dtype=torch.float32)
    table, taps = randn(2304, 1152), torch.randint(0, 2304, (300, 4), device=DEVICE)
    weights, gate_up = randn(300, 4, dtype=torch.float32), randn(300, 2 * 1152)
    offsets = torch.tensor([0, 2116], dtype=torch.int32, device=DEVICE)

    def rotary():
        q, k = qkv[:, 0].clone(), qkv[:, 1].clone()
        triton_rope.triton_rotary_(q, k, cos, sin)
        return q, k

    def attention(kernel):
        q, k, v = qkv.unbind(1)
        return (kernel(q, k, v, offsets, 2116, 72**-0.5),)

    cases = {
        "add_norm rms": lambda: triton_add_norm.add_norm(x, update, weight, None, 1e-6, "rms_norm"),
        "add_norm layer": lambda: triton_add_norm.add_norm(x, None, weight, bias, 1e-6, "layer_norm"),
        "rotary": rotary,
        "silu_mul": lambda: (triton_silu_mul.silu_mul(gate_up),),
        "position": lambda: (triton_pos_embed.add_position_embedding_(x.clone(), table, taps, weights),),
        "triton_attn": lambda: attention(triton_attn.triton_varlen_attention),
    }
    if torch.cuda.get_device_capability() == (9, 0) and torch.version.hip is None:
        from rocm_vit.backends import gluon_attn

        # One 2,116-token image at 16 heads: the tail split and its merge on an H100 or H200.
        cases["gluon_attn"] = lambda: attention(gluon_attn.gluon_varlen_attention)
    return cases


_CASE_NAMES = ["add_norm rms", "add_norm layer", "rotary", "silu_mul", "position", "triton_attn", "gluon_attn"]


@torch.inference_mode()
@pytest.mark.parametrize("name", _CASE_NAMES)
def test_a_kernel_after_its_first_launch_skips_run_and_equals_the_slow_path(
    monkeypatch: pytest.MonkeyPatch, runs: list, name: str
) -> None:
    cases = _cases()
    if name not in cases:
        pytest.skip("gluon_attn runs on sm_90 only")
    call = cases[name]
    _slow_path(monkeypatch, True)
    slow = call()
    _slow_path(monkeypatch, False)
    call()  # keeps the compiled kernels (a miss) or hits already
    runs.clear()
    fast = call()
    torch.cuda.synchronize()
    assert runs == []
    assert all(torch.equal(a, b) for a, b in zip(fast, slow, strict=True))
    if name == "gluon_attn" and fast_launch._triton_version() == (3, 6):
        from rocm_vit.backends import gluon_attn

        # Its kept launches reuse the descriptors' encoded tensor maps.
        entries = fast_launch.launcher(gluon_attn._attn_fwd, num_warps=4)._entries.values()
        assert any(isinstance(entry[0], fast_launch._DescriptorLaunch) for entry in entries)


@triton.jit
def _gather_kernel(src_ptr, dst_ptr, n, src_offset, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(dst_ptr + offsets, tl.load(src_ptr + src_offset + offsets, mask=mask), mask=mask)


@torch.inference_mode()
def test_launches_across_every_specialisation_edge_equal_run(monkeypatch: pytest.MonkeyPatch, runs: list) -> None:
    """One kernel launched in turn with ints equal to 1 and 16 (and not), 16-byte aligned and unaligned
    pointers, in storages within and over 2 GiB (AMD's buffer ops: 32-bit offsets from the pointer): a
    kernel kept for one of these and launched for another would read wrong elements or fault; VERIFY
    checks each launch kept run's kernel, and the outputs equal run's."""
    generator = torch.Generator(device=DEVICE).manual_seed(0)
    small = torch.randn(4096, generator=generator, device=DEVICE)
    big = torch.empty(2**29 + 4096, device=DEVICE)  # 2 GiB + 16 KiB
    big[2**29 - 4096 :] = torch.randn(8192, generator=generator, device=DEVICE)
    cases = [  # src, dst offset, n, src_offset, BLOCK
        (small, 0, 16, 0, 64),
        (small, 0, 1, 0, 64),
        (small, 0, 17, 1, 64),
        (small, 0, 16, 16, 64),
        (small[1:], 1, 16, 16, 64),
        (small[1:], 0, 1, 17, 64),
        (small[4:], 4, 33, 1, 64),
        (small, 0, 64, 32, 128),
        (big, 0, 64, 2**29, 64),  # 2 GiB past the pointer
        (big[1:], 1, 17, 2**29 - 17, 64),
        (big[2**29 :], 0, 16, 16, 64),  # near its end, in a storage over 2 GiB
        (big[-4096:].clone(), 0, 16, 16, 64),  # the same values, in a storage of its own
    ]
    fast = fast_launch.launcher(_gather_kernel, num_warps=4)

    def launch(case, through_run: bool) -> torch.Tensor:
        src, dst_offset, n, src_offset, block = case
        dst = torch.zeros(256, device=DEVICE)[dst_offset:]
        if through_run:
            _gather_kernel[(1,)](src, dst, n, src_offset, BLOCK=block, num_warps=4)
        else:
            fast((1,), src, dst, n, src_offset, block)
        return dst

    expected = [launch(case, through_run=True) for case in cases]
    first = [launch(case, through_run=False) for case in cases]  # misses keep run's kernels
    runs.clear()
    second = [launch(case, through_run=False) for case in cases]  # hits
    torch.cuda.synchronize()
    for case, want, got_first, got_second in zip(cases, expected, first, second, strict=True):
        assert torch.equal(got_first, want) and torch.equal(got_second, want), case[1:]
    if fast_launch._process_off_reason() is None:
        assert fast.off_reason is None  # this Triton's binder agreed with the key at the first launch
        assert runs == []
    else:
        assert not fast.enabled and len(runs) == len(cases)


@torch.inference_mode()
def test_a_tower_is_exact_with_fast_launches_eager_and_replayed(monkeypatch: pytest.MonkeyPatch) -> None:
    # The 8B tower's widths (head dim 72: the kernels the bench compiled), four blocks.
    torch.manual_seed(0)
    config = preset("qwen3-vl-8b", depth=4, deepstack_visual_indexes=[1, 2])
    tower = tower_class(config)(config).to(DEVICE, torch.bfloat16).eval()
    tower.enable_graphs(min_hits=1, by_benefit=False, max_tokens=1 << 15, budget_bytes=64 << 30)
    for grid in ([[1, 14, 14]], [[1, 46, 46]], [[1, 90, 90]], [[1, 128, 100]], [[1, 16, 16], [1, 30, 20]]):
        patches = sum(t * h * w for t, h, w in grid)
        width = config.in_channels * config.temporal_patch_size * config.patch_size**2
        pixels = torch.randn(patches, width, device=DEVICE, dtype=torch.bfloat16)
        _slow_path(monkeypatch, True)
        slow = tower(pixels, grid, use_graphs=False)
        _slow_path(monkeypatch, False)
        tower(pixels, grid, use_graphs=False)
        eager = tower(pixels, grid, use_graphs=False)
        replayed = tower(pixels, grid)
        assert torch.equal(eager, slow), grid
        assert torch.equal(replayed, eager), grid


def test_eager_cost_counts_the_kernels_of_a_call_and_holds_the_device_busy_ahead() -> None:
    x = torch.randn(1024, 1024, device=DEVICE)

    def three_kernels():
        return (x + 1) * 2 - 3

    cost = eager_cost(three_kernels, DEVICE, repeats=3)
    assert cost.kernels == 3
    assert cost.busy_ahead
    assert cost.device_ms > 0 and cost.host_ms > 0
