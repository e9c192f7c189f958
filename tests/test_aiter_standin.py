"""The aiter stand-in (rocm_vit/emulation): aiter's pinned signature, aiter's refusals, the math, install().

The pinned lists come from aiter's source (aiter_signature.py says where); where a real aiter is
importable, its signature is compared with them too.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import itertools
import sys
import types

import pytest
import torch
from rocm_vit.backends.aiter_attn import aiter_varlen_attention
from rocm_vit.backends.sdpa import sdpa_varlen

from rocm_vit.attention import AiterAttention
from rocm_vit.emulation import aiter_signature, aiter_standin
from rocm_vit.emulation.aiter_signature import PINNED, PYPI_PARAMETERS, RELEASE_PARAMETERS, parameter_list

SEQ_LENS = (5, 17, 1, 33)
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 2e-3}


@pytest.fixture
def standin() -> types.ModuleType:
    """The stand-in as ``aiter`` for one test; removed from sys.modules afterwards."""
    report = aiter_standin.install()
    if not aiter_standin.installed():
        pytest.skip(report)
    try:
        yield sys.modules["aiter"]
    finally:
        sys.modules.pop("aiter", None)


def _offsets(seq_lens) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(seq_lens)], dtype=torch.int32)


def _qkv(generator, heads=4, kv_heads=4, head_dim=72, dtype=torch.bfloat16, seq_lens=SEQ_LENS):
    tokens = sum(seq_lens)
    return tuple(torch.randn(tokens, n, head_dim, generator=generator).to(dtype) for n in (heads, kv_heads, kv_heads))


def _valid_call(generator, **changes) -> dict:
    q, k, v = _qkv(generator)
    offsets = _offsets(SEQ_LENS)
    call = {
        "q": q,
        "k": k,
        "v": v,
        "cu_seqlens_q": offsets,
        "cu_seqlens_k": offsets,
        "max_seqlen_q": max(SEQ_LENS),
        "max_seqlen_k": max(SEQ_LENS),
    }
    return {**call, **changes}


def _reference(q, k, v, seq_lens, scale, causal=False) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 ``(out [N, H, D], lse [H, N])``, per segment, bottom-right causal as aiter."""
    groups = q.shape[1] // k.shape[1]
    outs, lses = [], []
    for start, end in itertools.pairwise([0, *itertools.accumulate(seq_lens)]):
        q_seg = q[start:end].double().transpose(0, 1)
        k_seg = k[start:end].double().transpose(0, 1).repeat_interleave(groups, dim=0)
        v_seg = v[start:end].double().transpose(0, 1).repeat_interleave(groups, dim=0)
        scores = q_seg @ k_seg.transpose(1, 2) * scale
        if causal:
            scores = scores.masked_fill(~torch.ones(end - start, end - start, dtype=torch.bool).tril(), float("-inf"))
        lse = scores.logsumexp(dim=-1)
        outs.append(((scores - lse[..., None]).exp() @ v_seg).transpose(0, 1))
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses, dim=1)


# ---------------------------------------------------------------------------------------------
# the signature, against the lists read from aiter's source


def test_standin_signature_is_the_pinned_release_list():
    actual = parameter_list(aiter_standin.flash_attn_varlen_func)
    for position, (got, pinned) in enumerate(itertools.zip_longest(actual, RELEASE_PARAMETERS)):
        assert got == pinned, f"parameter {position}: stand-in {got}, aiter {aiter_signature.TARGET_RELEASE} {pinned}"


def test_pinned_pypi_and_release_lists_differ_by_window_size_and_sink_ptr_only():
    pypi, release = dict((name, p) for name, *p in PYPI_PARAMETERS), dict((name, p) for name, *p in RELEASE_PARAMETERS)
    assert set(release) - set(pypi) == {"sink_ptr"} and not set(pypi) - set(release)
    assert [name for name in pypi if pypi[name] != release[name]] == ["window_size"]
    assert aiter_signature.MAIN_PARAMETERS == RELEASE_PARAMETERS


def test_rocm_vit_passes_only_parameters_every_pinned_aiter_takes(generator, standin, monkeypatch):
    calls = []
    kernel = standin.flash_attn_varlen_func

    def recording(*args, **kwargs):
        calls.append((args, kwargs))
        return kernel(*args, **kwargs)

    monkeypatch.setattr(standin, "flash_attn_varlen_func", recording)
    q, k, v = _qkv(generator)
    aiter_varlen_attention(q, k, v, _offsets(SEQ_LENS), max(SEQ_LENS), 0.125)
    ((args, kwargs),) = calls
    assert args == (), "pass aiter keywords only: its positional order changed before (window_size, sink_ptr)"
    for version, parameters in PINNED.items():
        missing = set(kwargs) - {name for name, _, _ in parameters}
        assert not missing, f"aiter {version} has no parameter {sorted(missing)}"
    assert not {"window_size", "sink_ptr"} & set(kwargs)


def test_real_aiter_signature_matches_a_pinned_list():
    if aiter_standin.installed() or importlib.util.find_spec("aiter") is None:
        pytest.skip("no real aiter importable here (ROCm machines with amd-aiter only)")
    aiter = importlib.import_module("aiter")
    if not hasattr(aiter, "flash_attn_varlen_func"):
        pytest.skip(f"the 'aiter' at {aiter.__file__} is not AMD's aiter")
    try:
        version = importlib.metadata.version("amd-aiter")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    actual = [tuple(parameter) for parameter in parameter_list(aiter.flash_attn_varlen_func)]
    own = {key: parameters for key, parameters in PINNED.items() if key.lstrip("v") == version}
    matching = [key for key, parameters in PINNED.items() if list(parameters) == actual]
    if own:
        ((key, parameters),) = own.items()
        assert actual == list(parameters), f"aiter {version} differs from its pinned list {key}"
    assert matching, f"aiter {version}'s flash_attn_varlen_func matches no pinned list: {actual}"


# ---------------------------------------------------------------------------------------------
# what aiter refuses, the stand-in refuses


def _strided(tensor: torch.Tensor) -> torch.Tensor:
    return torch.stack([tensor, tensor], dim=1)[:, 0]


REFUSALS = {
    "int64-cu_seqlens": (
        lambda call: {"cu_seqlens_q": call["cu_seqlens_q"].long()},
        RuntimeError,
        "cu_seqlens_q must have dtype int32",
    ),
    "strided-cu_seqlens": (
        lambda call: {"cu_seqlens_k": _strided(call["cu_seqlens_k"])},
        RuntimeError,
        "cu_seqlens_k must be contiguous",
    ),
    "cu_seqlens-on-another-device": (
        lambda call: {"cu_seqlens_q": call["cu_seqlens_q"].to("meta")},
        RuntimeError,
        "cu_seqlens_q must be on CUDA",
    ),
    "cu_seqlens-of-other-lengths": (
        lambda call: {"cu_seqlens_k": call["cu_seqlens_k"][:-1]},
        RuntimeError,
        "cu_seqlens_k must have shape",
    ),
    "tensor-max_seqlen": (
        lambda call: {"max_seqlen_q": torch.tensor(call["max_seqlen_q"])},
        TypeError,
        "max_seqlen_q must be a host int",
    ),
    "float-max_seqlen": (
        lambda call: {"max_seqlen_k": float(call["max_seqlen_k"])},
        RuntimeError,
        "Expected a value of type 'int' for argument 'max_seqlen_k'",
    ),
    "fp32-q": (
        lambda call: {name: call[name].float() for name in "qkv"},
        NotImplementedError,
        "Unsupported dtype for MHA",
    ),
    "k-dtype-differs": (lambda call: {"k": call["k"].half()}, RuntimeError, "query and key must have the same dtype"),
    "v-dtype-differs": (lambda call: {"v": call["v"].half()}, RuntimeError, "query and value must have the same dtype"),
    "out-dtype": (
        lambda call: {"out": torch.empty(call["q"].shape, dtype=torch.float16)},
        RuntimeError,
        "output must have the same dtype as inputs",
    ),
    "out-shape": (
        lambda call: {"out": torch.empty(call["q"].shape[0] + 1, *call["q"].shape[1:], dtype=call["q"].dtype)},
        RuntimeError,
        "out must have shape",
    ),
    "out-strided": (
        lambda call: {"out": torch.empty(*call["q"].shape, 2, dtype=call["q"].dtype)[..., 0]},
        RuntimeError,
        "Output tensor must have contiguous last dimension",
    ),
    "head-dim-over-256": (
        lambda call: {name: call[name].new_zeros(*call[name].shape[:2], 264) for name in "qkv"},
        RuntimeError,
        "CK only supports head dimension at most 256",
    ),
    "heads-not-a-multiple": (
        lambda call: {name: call[name][:, :3] for name in "kv"},
        RuntimeError,
        "Number of heads in key/value must divide number of heads in query",
    ),
    "grad-without-lse": (
        lambda call: {"q": call["q"].clone().requires_grad_()},
        AssertionError,
        "return_lse",
    ),
    "dropout": (lambda call: {"dropout_p": 0.1}, NotImplementedError, "dropout_p=0.1"),
    "sink_ptr": (lambda call: {"sink_ptr": torch.zeros(4)}, NotImplementedError, "sink_ptr"),
    "sliding-window": (lambda call: {"window_size": (8, 8, 0)}, NotImplementedError, "window_size"),
}


@pytest.mark.parametrize("case", REFUSALS, ids=list(REFUSALS))
def test_standin_refuses_what_aiter_refuses(generator, case):
    change, error, message = REFUSALS[case]
    call = _valid_call(generator)
    aiter_standin.flash_attn_varlen_func(**call)  # the unchanged call is accepted
    with pytest.raises(error, match=message):
        aiter_standin.flash_attn_varlen_func(**{**call, **change(call)})


def test_standin_refuses_a_segment_longer_than_max_seqlen_q(generator):
    # Stricter than aiter, whose grid (sized by max_seqlen_q) would leave the segment's last rows unwritten.
    with pytest.raises(ValueError, match="longer than max_seqlen_q 32"):
        aiter_standin.flash_attn_varlen_func(**_valid_call(generator, max_seqlen_q=32))


# ---------------------------------------------------------------------------------------------
# the math


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("head_dim", [72, 80])
@pytest.mark.parametrize("kv_heads", [4, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_output_and_lse_match_float64_over_ragged_segments(generator, dtype, head_dim, kv_heads, causal):
    q, k, v = _qkv(generator, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype)
    offsets = _offsets(SEQ_LENS)
    out, lse = aiter_standin.flash_attn_varlen_func(
        q, k, v, offsets, offsets, max(SEQ_LENS), max(SEQ_LENS), softmax_scale=0.11, causal=causal, return_lse=True
    )
    expected_out, expected_lse = _reference(q, k, v, SEQ_LENS, 0.11, causal)
    assert out.dtype == dtype and out.shape == q.shape
    assert lse.dtype == torch.float32 and lse.shape == (q.shape[1], q.shape[0])
    torch.testing.assert_close(out.double(), expected_out, atol=TOLERANCE[dtype], rtol=0)
    torch.testing.assert_close(lse.double(), expected_lse, atol=1e-4, rtol=1e-5)


def test_default_scale_is_one_over_sqrt_head_dim(generator):
    call = _valid_call(generator)
    torch.testing.assert_close(
        aiter_standin.flash_attn_varlen_func(**call),
        aiter_standin.flash_attn_varlen_func(**call, softmax_scale=72**-0.5),
        atol=0,
        rtol=0,
    )


def test_out_is_written_and_returned(generator):
    call = _valid_call(generator)
    out = torch.full(call["q"].shape, float("nan"), dtype=call["q"].dtype)
    returned = aiter_standin.flash_attn_varlen_func(**call, out=out)
    # aiter returns ``out[..., :head_dim_v]``: a view of out, not out itself.
    assert returned.data_ptr() == out.data_ptr() and returned.shape == out.shape
    assert not out.isnan().any()
    torch.testing.assert_close(out, aiter_standin.flash_attn_varlen_func(**call), atol=0, rtol=0)


def test_out_takes_the_head_dim_padded_to_a_multiple_of_8(generator):
    # FlashAttnVarlenFunc pads q/k/v from 100 to 104 before mha_varlen_fwd checks out's shape.
    q, k, v = _qkv(generator, head_dim=100)
    call = _valid_call(generator, q=q, k=k, v=v)
    with pytest.raises(RuntimeError, match="out must have shape"):
        aiter_standin.flash_attn_varlen_func(**call, out=torch.empty(q.shape, dtype=q.dtype))
    out = torch.full((*q.shape[:2], 104), float("nan"), dtype=q.dtype)
    returned = aiter_standin.flash_attn_varlen_func(**call, out=out, softmax_scale=0.1)
    assert returned.shape == q.shape and returned.data_ptr() == out.data_ptr()
    assert (out[..., 100:] == 0).all()
    torch.testing.assert_close(returned.double(), _reference(q, k, v, SEQ_LENS, 0.1)[0], atol=2e-2, rtol=0)


def test_rows_outside_the_segments_are_left_unwritten_as_aiter_leaves_them(generator):
    call = _valid_call(generator, cu_seqlens_q=_offsets(SEQ_LENS[:-1]), cu_seqlens_k=_offsets(SEQ_LENS[:-1]))
    out = torch.full(call["q"].shape, float("nan"), dtype=call["q"].dtype)
    aiter_standin.flash_attn_varlen_func(**call, out=out)
    written = sum(SEQ_LENS[:-1])
    assert not out[:written].isnan().any() and out[written:].isnan().all()


def test_return_attn_probs_without_dropout_adds_an_empty_tensor(generator):
    call = _valid_call(generator)
    out, lse, probs = aiter_standin.flash_attn_varlen_func(**call, return_lse=True, return_attn_probs=True)
    assert probs.shape == (0,) and probs.dtype == call["q"].dtype
    assert out.shape == call["q"].shape and lse.shape == (4, sum(SEQ_LENS))


# ---------------------------------------------------------------------------------------------
# install(), and rocm-vit's aiter_attn through the stand-in


def test_install_makes_import_aiter_return_the_standin(standin):
    import aiter

    assert aiter is standin and aiter.ROCM_VIT_STANDIN is True
    assert aiter.flash_attn_varlen_func is aiter_standin.flash_attn_varlen_func
    assert importlib.util.find_spec("aiter") is not None
    assert AiterAttention.unavailable_reason("rocm") is None
    assert aiter_standin.install().startswith("already installed")


def test_install_leaves_a_real_aiter_alone(monkeypatch):
    real = types.ModuleType("aiter")
    real.__file__ = "/opt/rocm/aiter/__init__.py"
    monkeypatch.setitem(sys.modules, "aiter", real)
    report = aiter_standin.install()
    assert report.startswith("not installed") and sys.modules["aiter"] is real
    assert not aiter_standin.installed()


@pytest.mark.parametrize("kv_heads", [4, 2], ids=["mha", "gqa"])
def test_aiter_attn_through_the_standin_matches_sdpa(generator, standin, kv_heads):
    q, k, v = _qkv(generator, kv_heads=kv_heads, head_dim=80)
    out = aiter_varlen_attention(q, k, v, _offsets(SEQ_LENS), max(SEQ_LENS), 80**-0.5)
    expected = sdpa_varlen(q, k, v, SEQ_LENS, 80**-0.5)
    assert out.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=0)
