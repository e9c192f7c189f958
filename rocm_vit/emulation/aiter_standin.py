"""A stand-in for aiter's ``flash_attn_varlen_func``: aiter's signature and argument checks, torch's math.

Invariants: installed only where no real aiter imports; raises what aiter ``TARGET_RELEASE`` raises on
rocm-vit's path (stricter where aiter would sync or leave rows unwritten), ``NotImplementedError`` for what
it does not emulate; rows outside the segments stay unwritten; each call records its module in ``builds``.
Every check, with its source in aiter: docs/design.md, "The aiter stand-in".
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import inspect
import itertools
import operator
import sys
import types
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from rocm_vit.emulation.aiter_modules import PREBUILT_VARLEN, SGLANG_IMAGE_AITER_COMMIT, varlen_forward_module
from rocm_vit.emulation.aiter_signature import TARGET_RELEASE

try:
    from torch.nn.attention.varlen import AuxRequest, varlen_attn
except ImportError:  # torch < 2.10
    varlen_attn = None
_VARLEN_PARAMETERS = inspect.signature(varlen_attn).parameters if varlen_attn is not None else {}
# 2.10's varlen_attn takes neither a scale nor a window; 2.12 adds enable_gqa (backends/torch_varlen.py).
_VARLEN_USABLE = {"scale", "window_size"} <= set(_VARLEN_PARAMETERS)

_CK_CHECK = "TORCH_CHECK in aiter's mha_varlen_fwd, csrc/py_itfs_ck/mha_varlen_fwd_kernels.cu"
_MAX_HEAD_DIM = 256
# The GPU the stand-in's module choice is made for: MI355X.
ARCH = "gfx950"


@dataclass
class Builds:
    """What the stand-in's aiter has built: the image's modules, plus those compiled in this process."""

    built: set[str]
    loaded: list[str] = field(default_factory=list)  # the module of every call, in order
    compiled: list[str] = field(default_factory=list)  # modules a call had to build first

    def load(self, module: str) -> None:
        self.loaded.append(module)
        if module not in self.built:
            self.compiled.append(module)
            self.built.add(module)


def reset_builds(prebuilt: frozenset[str] = PREBUILT_VARLEN[SGLANG_IMAGE_AITER_COMMIT]) -> Builds:
    """Start over from an install that ships ``prebuilt`` (default: SGLang's ROCm image)."""
    global builds
    builds = Builds(set(prebuilt))
    return builds


builds = reset_builds()


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    min_seqlen_q=0,
    dropout_p=0.0,
    softmax_scale=None,
    logits_soft_cap=0.0,
    causal=False,
    window_size=(-1, -1, 0),
    bias=None,
    alibi_slopes=None,
    deterministic=False,
    return_lse=False,
    return_attn_probs=False,
    how_v3_bf16_cvt=1,
    block_table=None,
    out=None,
    cu_seqlens_q_padded: torch.Tensor | None = None,
    cu_seqlens_k_padded: torch.Tensor | None = None,
    sink_ptr: torch.Tensor | None = None,
):
    """Attention per segment of packed q ``[total_q, H, D]``, k/v ``[total_k, KH, D/Dv]``; returns
    what aiter returns (output, then lse and an empty probs tensor where asked)."""
    _refuse_unemulated(
        {"min_seqlen_q": min_seqlen_q, "dropout_p": dropout_p, "logits_soft_cap": logits_soft_cap},
        bias=bias,
        alibi_slopes=alibi_slopes,
        block_table=block_table,
        cu_seqlens_q_padded=cu_seqlens_q_padded,
        cu_seqlens_k_padded=cu_seqlens_k_padded,
        sink_ptr=sink_ptr,
    )
    max_seqlen_q = _host_int("max_seqlen_q", max_seqlen_q)
    max_seqlen_k = _host_int("max_seqlen_k", max_seqlen_k)
    _refuse_windows(window_size, causal, max_seqlen_k)
    _check_like_aiter(q, k, v, cu_seqlens_q, cu_seqlens_k, out)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        # FlashAttnVarlenFunc.forward saves the lse for its backward: ``if is_grad: assert return_lse``.
        if not return_lse:
            raise AssertionError("aiter asserts return_lse when q, k or v requires grad (FlashAttnVarlenFunc)")
        raise NotImplementedError("the aiter stand-in is forward-only: run it under torch.no_grad()")

    scale = q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)
    head_dim_v = v.shape[-1]
    module = varlen_forward_module(
        q.dtype,
        _padded(q.shape[-1]),
        _padded(head_dim_v),
        heads=q.shape[1],
        kv_heads=k.shape[1],
        causal=causal,
        return_lse=return_lse,
        arch=ARCH,
    )
    builds.load(module)
    q, k, v = (_pad_head_dim(t) for t in (q, k, v))
    if q.is_cuda and _VARLEN_USABLE:
        result, lse = _attend_varlen(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal, return_lse
        )
        if out is not None:
            rows = torch.arange(q.shape[0], device=q.device)
            inside = (rows >= cu_seqlens_q[0]) & (rows < cu_seqlens_q[-1])
            result = out.copy_(torch.where(inside[:, None, None], result, out))
    else:
        result = out if out is not None else q.new_empty(q.shape[0], q.shape[1], v.shape[2])
        lse = _attend_per_segment(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, scale, causal, result, return_lse)
    outputs = [result[..., :head_dim_v]]
    if return_lse:
        outputs.append(lse)
    if return_attn_probs:
        # Without dropout aiter returns the empty ``p`` tensor mha_varlen_fwd allocates.
        outputs.append(q.new_empty((0,)))
    return outputs[0] if len(outputs) == 1 else tuple(outputs)


def install() -> str:
    """Put the stand-in into ``sys.modules["aiter"]`` unless a real aiter imports; returns a line saying which."""
    if installed():
        return f"already installed: the aiter stand-in ({TARGET_RELEASE} signature)"
    real_origin = _real_aiter_origin()
    if real_origin is not None:
        return f"not installed: a real aiter is importable ({real_origin}); the stand-in is never used beside it"
    module = types.ModuleType("aiter", f"rocm-vit's stand-in for aiter {TARGET_RELEASE} ({__name__}).")
    module.__spec__ = importlib.machinery.ModuleSpec("aiter", loader=None, origin=__file__)
    module.flash_attn_varlen_func = flash_attn_varlen_func
    module.ROCM_VIT_STANDIN = True
    module.TARGET_RELEASE = TARGET_RELEASE
    sys.modules["aiter"] = module
    return f"installed: the aiter stand-in ({TARGET_RELEASE} signature) as sys.modules['aiter']"


def installed() -> bool:
    """Whether ``import aiter`` returns the stand-in in this process."""
    return getattr(sys.modules.get("aiter"), "ROCM_VIT_STANDIN", False) is True


def _real_aiter_origin() -> str | None:
    if sys.modules.get("aiter") is not None:
        return getattr(sys.modules["aiter"], "__file__", None) or "already imported"
    try:
        spec = importlib.util.find_spec("aiter")
    except (ImportError, ValueError):
        return None
    return None if spec is None else spec.origin or "namespace package"


def _refuse_unemulated(numbers: dict[str, float], **tensors) -> None:
    """Options off at 0 (``numbers``) or at None (``tensors``) that aiter takes and the stand-in cannot mimic."""
    given = [f"{name}={value!r}" for name, value in numbers.items() if value != 0]
    given += [f"{name} (a {type(value).__name__})" for name, value in tensors.items() if value is not None]
    if given:
        raise NotImplementedError(
            f"{', '.join(given)}: aiter {TARGET_RELEASE} takes it, the stand-in does not emulate it"
        )


def _host_int(name: str, value) -> int:
    if isinstance(value, torch.Tensor):
        raise TypeError(
            f"{name} must be a host int, got a tensor: aiter would read it to the host through the torch "
            "dispatcher (SymInt argument), a device sync per call that fails under HIP graph capture"
        )
    try:
        return operator.index(value)
    except TypeError:
        raise RuntimeError(
            f"aiter::mha_varlen_fwd() Expected a value of type 'int' for argument '{name}' but instead found "
            f"type '{type(value).__name__}'."
        ) from None


def _refuse_windows(window_size, causal: bool, max_seqlen_k: int) -> None:
    # _flash_attn_varlen_forward drops windows and sinks as long as the longest key segment.
    left, right = (-1 if size >= max_seqlen_k else size for size in window_size[:2])
    sink_size = window_size[2] if len(window_size) > 2 else 0
    if left != -1 or (right != -1 and not causal) or (sink_size != 0 and sink_size < max_seqlen_k):
        raise NotImplementedError(
            f"window_size={tuple(window_size)!r} (a sliding window or sink tokens): aiter {TARGET_RELEASE} takes "
            "it, the stand-in does not emulate it"
        )


def _check_like_aiter(q, k, v, cu_seqlens_q, cu_seqlens_k, out) -> None:
    if q.dtype not in (torch.float16, torch.bfloat16):
        if q.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
            raise NotImplementedError("fp8 q: aiter takes it with descales, the stand-in does not emulate it")
        raise NotImplementedError(
            f"Unsupported dtype for MHA: q is {q.dtype} (aiter's cmdGenFunc_mha_varlen_fwd; the kernel's "
            "check: 'FlashAttention only support fp16, bf16 and fp8_e4m3 data type')"
        )
    _torch_check(k.dtype == q.dtype, "query and key must have the same dtype", f"q {q.dtype}, k {k.dtype}")
    _torch_check(v.dtype == q.dtype, "query and value must have the same dtype", f"q {q.dtype}, v {v.dtype}")
    _torch_check(cu_seqlens_k is not None, "cu_seqlens_k must be provided if paged_KV is false", "None")
    for name, offsets in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        _torch_check(offsets.dtype == torch.int32, f"{name} must have dtype int32", str(offsets.dtype))
    for name, tensor in (("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        _torch_check(
            tensor.device == q.device,
            f"CHECK_DEVICE({name}): '{name} must be on CUDA' (here: on q's device {q.device})",
            str(tensor.device),
        )
    for name, offsets in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        _torch_check(offsets.is_contiguous(), f"{name} must be contiguous", f"stride {offsets.stride()}")
    batch_size = cu_seqlens_q.numel() - 1
    _torch_check(batch_size > 0, "batch size must be postive", f"cu_seqlens_q of {cu_seqlens_q.numel()} entries")
    total_q, num_heads, head_dim = q.shape
    for name, size in (("q", head_dim), ("v", v.shape[-1])):
        _torch_check(
            _padded(size) <= _MAX_HEAD_DIM,
            "CK only supports head dimension at most 256",
            f"{name} head dim {size} (padded to {_padded(size)})",
        )
    num_heads_k, total_k = k.shape[-2], k.shape[0]
    _torch_check(
        num_heads % num_heads_k == 0,
        "Number of heads in key/value must divide number of heads in query",
        f"{num_heads} q heads, {num_heads_k} k heads",
    )
    for name, tensor, expected in (
        ("k", k, (total_k, num_heads_k, head_dim)),
        ("v", v, (total_k, num_heads_k, v.shape[-1])),
        ("cu_seqlens_q", cu_seqlens_q, (batch_size + 1,)),
        ("cu_seqlens_k", cu_seqlens_k, (batch_size + 1,)),
    ):
        _torch_check(tuple(tensor.shape) == expected, f"{name} must have shape {expected}", str(tuple(tensor.shape)))
    if out is not None:
        _torch_check(
            out.dtype == q.dtype,
            "For FP16/BF16 input, output must have the same dtype as inputs. "
            "For FP8 input, output must have dtype BF16",
            f"q {q.dtype}, out {out.dtype}",
        )
        _torch_check(out.device == q.device, "CHECK_DEVICE(out): 'out must be on CUDA'", str(out.device))
        _torch_check(out.stride(-1) == 1, "Output tensor must have contiguous last dimension", str(out.stride()))
        expected = (total_q, num_heads, _padded(v.shape[-1]))
        _torch_check(
            tuple(out.shape) == expected,
            f"out must have shape (total_q, num_heads, head_size_v) = {expected}, head_size_v padded to 8s",
            str(tuple(out.shape)),
        )


def _torch_check(condition: bool, message: str, got: str) -> None:
    if not condition:
        raise RuntimeError(f"{message} ({_CK_CHECK}); got {got}")


def _padded(head_dim: int) -> int:
    return -(-head_dim // 8) * 8


def _pad_head_dim(tensor: torch.Tensor) -> torch.Tensor:
    # As aiter: head dims padded to a multiple of 8, strided last dims made contiguous.
    pad = _padded(tensor.shape[-1]) - tensor.shape[-1]
    tensor = F.pad(tensor, [0, pad]) if pad else tensor
    return tensor if tensor.stride(-1) == 1 else tensor.contiguous()


def _attend_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal, with_lse):
    """``(output, lse or None)`` from torch's varlen kernel (FlashAttention-2: causal is bottom-right too)."""
    options = {"scale": scale, "window_size": (-1, 0) if causal else (-1, -1)}
    if with_lse:
        options["return_aux"] = AuxRequest(lse=True)
    if k.shape[1] != q.shape[1]:
        if "enable_gqa" in _VARLEN_PARAMETERS:
            options["enable_gqa"] = True
        else:
            groups = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    result = varlen_attn(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **options)
    return result if with_lse else (result, None)


def _attend_per_segment(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, scale, causal, result, with_lse):
    """Writes each segment's rows of ``result``; returns the lse ``[H, total_q]`` or None. Reads offsets to host."""
    lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device) if with_lse else None
    groups = q.shape[1] // k.shape[1]
    bounds_q, bounds_k = itertools.pairwise(cu_seqlens_q.tolist()), itertools.pairwise(cu_seqlens_k.tolist())
    for (q_start, q_end), (k_start, k_end) in zip(bounds_q, bounds_k, strict=True):
        if q_end - q_start > max_seqlen_q:
            raise ValueError(
                f"segment [{q_start}, {q_end}) is longer than max_seqlen_q {max_seqlen_q}: aiter's grid is sized "
                "by max_seqlen_q and would leave its last rows unwritten"
            )
        if q_end == q_start:
            continue
        # [H, L, D] in fp32, as the kernel accumulates; k/v heads repeated for grouped queries.
        q_seg = q[q_start:q_end].transpose(0, 1).float()
        k_seg = k[k_start:k_end].transpose(0, 1).float().repeat_interleave(groups, dim=0)
        v_seg = v[k_start:k_end].transpose(0, 1).float().repeat_interleave(groups, dim=0)
        # Bottom-right aligned, as aiter: query i sees keys up to i + (len_k - len_q).
        mask = None
        if causal:
            mask = torch.ones(q_end - q_start, k_end - k_start, dtype=torch.bool, device=q.device)
            mask = mask.tril(diagonal=(k_end - k_start) - (q_end - q_start))
        attended = F.scaled_dot_product_attention(q_seg, k_seg, v_seg, attn_mask=mask, scale=scale)
        result[q_start:q_end] = attended.transpose(0, 1).to(result.dtype)
        if lse is None:
            continue
        scores = q_seg @ k_seg.transpose(1, 2) * scale
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        lse[:, q_start:q_end] = scores.logsumexp(dim=-1)
    return lse
