"""What the adapter needs of SGLang's vision tower, checked once at construction.

A changed SGLang release is refused here with the reason, instead of failing inside a request: the
blocks and their ``forward`` parameters, the attention backend's name and workspace sizes, the
merger and the deepstack mergers.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from torch import nn


def eager_unsupported_reason(vit: nn.Module) -> str | None:
    """What in ``vit`` (SGLang's vision tower) does not fit the eager block loop, or ``None``."""
    blocks = getattr(vit, "blocks", None)
    if not isinstance(blocks, nn.ModuleList) or len(blocks) == 0:
        return f"{type(vit).__name__}.blocks is not a non-empty ModuleList"
    names = parameters(blocks[0].forward)
    takes_pair = "position_embeddings" in names
    rotary = ["position_embeddings"] if takes_pair else ["rotary_pos_emb_cos", "rotary_pos_emb_sin"]
    missing = sorted({"cu_seqlens", "forward_metadata", *rotary} - set(names))
    if missing:
        return f"{type(blocks[0]).__name__}.forward takes ({', '.join(names)}), without {', '.join(missing)}"
    if not callable(getattr(vit, "merger", None)):
        return f"{type(vit).__name__} lacks a merger"
    deepstack = getattr(vit, "deepstack_visual_indexes", None) or ()
    if len(deepstack) != len(getattr(vit, "deepstack_merger_list", ()) or ()):
        return f"{type(vit).__name__} has {len(deepstack)} deepstack indexes but not as many deepstack mergers"
    return None


def unsupported_reason(vit: nn.Module, upstream: Any) -> str | None:
    """What else rocm-vit's runner needs from ``vit`` and SGLang's runner, or ``None``."""
    blocks = vit.blocks
    attn = getattr(blocks[0], "attn", None)
    if not isinstance(getattr(attn, "qkv_backend_name", None), str):
        return f"{type(blocks[0]).__name__}.attn has no qkv_backend_name"
    if attn.qkv_backend_name == "triton_attn" and not all(
        isinstance(getattr(attn, name, None), int) for name in ("num_attention_heads_per_partition", "head_size")
    ):
        return "VisionAttention lacks num_attention_heads_per_partition/head_size (the triton_attn workspace)"
    if "output_ws" not in parameters(blocks[0].forward):
        return f"{type(blocks[0]).__name__}.forward takes no output_ws"
    if not isinstance(getattr(vit, "spatial_merge_size", None), int):
        return f"{type(vit).__name__} lacks an int spatial_merge_size"
    return None


def parameters(fn: Callable) -> list[str]:
    """The names of ``fn``'s parameters; none where Python cannot tell."""
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return []
