"""Every kernel variant a serving stream launches is one that ``prepare`` compiled before serving.

Triton compiles a variant (constexprs, and the divisibility and alignment it specialises arguments
on) at its first launch: on the H200, nine of gluon_attn's compiled inside a stream of 300 chat
calls, 3-5 s each, the last at call 248 (docs/benchmarks.md, "Compiles inside requests"). Here the
real wrappers are called on CPU tensors shaped like the tower's fused-qkv views while
``JITFunction.run`` records each launch (nothing runs), and Triton's own binder gives the key it
would compile under for sm_90a (tests/aot_rocm.py's ``_specialise``).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable

import pytest
import torch
from aot_rocm import _recording, _specialise

pytest.importorskip("triton.backends.nvidia.compiler", reason="Triton without its NVIDIA backend")

from rocm_vit.backends import gluon_attn, triton_attn

from rocm_vit.attention import TritonAttention

HEADS, HEAD_DIM = 16, 72  # Qwen3-VL's vision attention
H200_SMS = 132


def _stream_layouts(seed: int, calls: int) -> list[list[int]]:
    """Segment lengths of serving calls: one image, several unequal ones, a video's equal frames."""
    rng = random.Random(seed)
    layouts = []
    for _ in range(calls):
        kind = rng.choice(("image", "images", "video"))
        if kind == "image":
            layouts.append([4 * rng.randint(16, 4096)])
        elif kind == "images":
            layouts.append([4 * rng.randint(16, 2048) for _ in range(rng.randint(2, 4))])
        else:
            layouts.append([4 * rng.randint(64, 1024)] * rng.randint(2, 16))
    return layouts


def _compile_keys(call: Callable[[], object], target: object) -> set[tuple]:
    """What Triton would compile for each launch ``call`` makes: kernel, argument types, constexprs,
    specialisations and launch options."""
    with _recording() as launches:
        call()
    keys = set()
    for fn, args, kwargs in launches:
        job = _specialise(fn, args, kwargs, "sm_90a", target)
        options = {name: job["options"][name] for name in ("num_warps", "num_stages")}
        keys.add((job["name"], repr(job["signature"]), repr(job["constexprs"]), repr(job["attrs"]), repr(options)))
    return keys


def _keys_of(attend: Callable[..., torch.Tensor], layouts: list[list[int]], target: object) -> set[tuple]:
    keys = set()
    for lengths in layouts:
        q, k, v = torch.empty(sum(lengths), 3, HEADS, HEAD_DIM, dtype=torch.bfloat16).unbind(1)
        offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        keys |= _compile_keys(functools.partial(attend, q, k, v, offsets, max(lengths), HEAD_DIM**-0.5), target)
    return keys


def _sm90():
    from triton.backends.compiler import GPUTarget

    return GPUTarget("cuda", 90, 32)


def _layouts(variants: list[tuple[int, int]]) -> list[list[int]]:
    return [[tokens] * segments for segments, tokens in variants]


def test_gluon_attn_prepared_variants_cover_every_launch_of_a_serving_stream(monkeypatch):
    monkeypatch.setattr(gluon_attn, "gluon_unsupported_reason", lambda *tensors: None)
    monkeypatch.setattr(gluon_attn, "_sm_count", lambda index: H200_SMS)
    attend = gluon_attn.gluon_varlen_attention
    prepared = _keys_of(attend, _layouts(gluon_attn.variant_layouts(HEADS, torch.device("cuda"))), _sm90())
    # Two and three consumers, whole and tail split, and the merge.
    assert sorted(key[0] for key in prepared) == ["_attn_fwd"] * 4 + ["_merge_kernel"]
    missing = _keys_of(attend, _stream_layouts(0, 300), _sm90()) - prepared
    assert not missing, f"{len(missing)} variants a stream launches that prepare did not: {sorted(missing)[:2]}"


@pytest.mark.parametrize("arch", ["sm_90", "gfx950"])
def test_triton_attn_prepared_variants_cover_every_launch_of_a_serving_stream(arch):
    from triton.backends.compiler import GPUTarget

    target = _sm90() if arch == "sm_90" else GPUTarget("hip", arch, 64)
    attend = functools.partial(triton_attn.triton_varlen_attention, arch=arch)
    variants = triton_attn.variant_layouts(HEADS, HEAD_DIM, torch.bfloat16, torch.device("cpu"), arch=arch)
    prepared = _keys_of(attend, _layouts(variants), target)
    assert len(prepared) == (2 if arch == "sm_90" else 1)  # NVIDIA's few-tiles config, and the usual one
    missing = _keys_of(attend, _stream_layouts(1, 200), target) - prepared
    assert not missing, f"{len(missing)} variants a stream launches that prepare did not: {sorted(missing)[:2]}"


def test_prepare_calls_each_variant_on_views_of_one_fused_qkv_as_the_towers_pass_them():
    calls = []
    backend = TritonAttention()
    backend._attend = lambda q, k, v, offsets, max_seqlen, scale: calls.append((q, k, v, offsets, max_seqlen))
    backend._compile_variants([(1, 640), (4, 256)], HEAD_DIM, HEADS, HEADS, torch.float32, torch.device("cpu"))
    assert [(offsets.tolist(), longest) for *_, offsets, longest in calls] == [
        ([0, 640], 640),
        ([0, 256, 512, 768, 1024], 256),
    ]
    for q, k, v, offsets, _ in calls:
        assert offsets.dtype == torch.int32
        assert q.stride() == k.stride() == v.stride() == (3 * HEADS * HEAD_DIM, HEAD_DIM, 1)
        assert k.data_ptr() - q.data_ptr() == v.data_ptr() - k.data_ptr() == HEADS * HEAD_DIM * 4
