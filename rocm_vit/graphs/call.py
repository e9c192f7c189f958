"""One call as the runner serves it: checked, the layout it runs as (padded or exact), its graph key.

Invariant: whether a call runs padded follows from its layout alone, so a replay, a capture and an
eager run of it compute the same function; a replay pads in staging, with no copies.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from rocm_vit.graphs.padding import Padding, pad_rows, padded_shape, real_rows
from rocm_vit.graphs.staging import Signature, signature_of
from rocm_vit.layout import AttentionLayout


@dataclass(frozen=True)
class Call:
    """The caller's ``tensors`` run as ``layout`` (``real_tokens``: the caller's tokens where padded;
    ``None``: exact); ``key``: the graph that serves it."""

    tensors: tuple[torch.Tensor, ...]
    layout: AttentionLayout
    real_tokens: int | None
    immutable: bool
    key: tuple

    @classmethod
    def of(
        cls, tensors: tuple[torch.Tensor, ...], layout: AttentionLayout, padding: Padding | None, immutable: bool
    ) -> Call:
        """The call of ``tensors`` laid out as ``layout``, padded where ``padding`` says. Raises
        ``ValueError`` (``check_call``) before anything runs."""
        check_call(tensors, layout)
        padded = padding.padded(layout) if padding is not None else None
        if padded is None:
            key = (layout.graph_key, tuple((t.dtype, t.shape) for t in tensors))
            return cls(tensors, layout, None, immutable, key)
        tokens, padded_tokens = layout.num_patches, padded.num_patches
        shapes = tuple((t.dtype, padded_shape(t, tokens, padded_tokens)) for t in tensors)
        return cls(tensors, padded, tokens, False, (padded.graph_key, shapes))

    @functools.cached_property
    def run_tensors(self) -> tuple[torch.Tensor, ...]:
        """The tensors for an eager run or a capture: padded copies for a padded call, made once."""
        if self.real_tokens is None:
            return self.tensors
        return tuple(pad_rows(tensor, self.real_tokens, self.layout.num_patches) for tensor in self.tensors)

    @functools.cached_property
    def signature(self) -> Signature:
        """What staging is shared by (``signature_of``): derived only when a capture is due."""
        return signature_of(self.run_tensors, self.layout.num_patches)

    def callers_rows(self, output: torch.Tensor) -> torch.Tensor:
        """The rows of ``output`` that belong to the caller's tokens: all of an exact call's."""
        if self.real_tokens is None:
            return output
        return real_rows(output, self.real_tokens, self.layout.num_patches)


def check_call(tensors: tuple[torch.Tensor, ...], layout: AttentionLayout) -> None:
    """``x``, ``cos``, ``sin`` have one row per token of ``layout``; every tensor sits on ``x``'s device."""
    names = ("x", "cos", "sin", *(f"inputs[{index}]" for index in range(len(tensors) - 3)))
    device = tensors[0].device
    for index, (name, tensor) in enumerate(zip(names, tensors, strict=True)):
        if not isinstance(tensor, torch.Tensor) or tensor.dim() < 1:
            raise ValueError(f"{name} must be a tensor with a first dim; got {type(tensor).__name__}")
        if index < 3 and tensor.shape[0] != layout.num_patches:
            raise ValueError(f"{name} has {tensor.shape[0]} rows but the layout describes {layout.num_patches} patches")
        if tensor.device != device:
            raise ValueError(f"{name} is on {tensor.device}, x on {device}: pass every tensor on one device")
