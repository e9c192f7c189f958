"""Staging: the buffers every graph of one input signature reads and writes, allocated once.

Per signature one set of buffers at ``max_tokens`` rows, never regrown (a workspace regrown under a
captured graph corrupted SGLang's replies: docs/design.md, "Hazards"). Graphs capture views of their
first rows; a replay's inputs are copied in device to device and its output copied out.
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch

# Per per-call tensor, in call order: dtype, shape past the first dim, and rows per token (1 for x,
# cos, sin; 1/4 for a window index with one entry per 2x2 merge block).
Signature = tuple[tuple[torch.dtype, tuple[int, ...], Fraction], ...]


class Staging:
    """The per-call inputs every graph of one signature reads and the output it writes, at
    ``max_tokens`` rows: graphs capture views of the first rows, so they all share this memory."""

    def __init__(self, signature: Signature, max_tokens: int, device: torch.device) -> None:
        self.inputs = tuple(
            torch.empty(shape, dtype=dtype, device=device) for dtype, shape in _buffer_shapes(signature, max_tokens)
        )
        # Per buffer, the immutable tensor it holds: passed again, it needs no copy. Held, so no other
        # tensor can take its memory and pass for it.
        self.sources: list[torch.Tensor | None] = [None] * len(self.inputs)
        self._max_tokens = max_tokens
        # By dtype, trailing shape and rows per token of what forward_blocks returns (one in practice).
        self.outputs: dict[tuple[torch.dtype, tuple[int, ...], Fraction], torch.Tensor] = {}

    @staticmethod
    def planned_bytes(signature: Signature, max_tokens: int) -> int:
        """What the input buffers of ``signature`` take, before allocating them."""
        return sum(math.prod(shape) * dtype.itemsize for dtype, shape in _buffer_shapes(signature, max_tokens))

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in (*self.inputs, *self.outputs.values()))

    def output_view(self, like: torch.Tensor, tokens: int) -> torch.Tensor:
        """Rows of the output buffer for an output shaped as ``like`` from ``tokens`` tokens."""
        spec = (like.dtype, tuple(like.shape[1:]), Fraction(like.shape[0], tokens))
        buffer = self.outputs.get(spec)
        if buffer is None:
            ((dtype, shape),) = _buffer_shapes((spec,), self._max_tokens)
            buffer = self.outputs[spec] = torch.empty(shape, dtype=dtype, device=like.device)
        return buffer[: like.shape[0]]

    def views(self, tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """The rows of each input buffer a graph of these tensors reads."""
        return tuple(buffer[: given.shape[0]] for buffer, given in zip(self.inputs, tensors, strict=True))

    def fill(self, views: tuple[torch.Tensor, ...], tensors: tuple[torch.Tensor, ...], immutable: bool) -> None:
        """Copy ``tensors`` into ``views``; a tensor with fewer rows than its view (a padded graph's
        call) fills the first rows, and the rest, its padding, is zeroed, as ``pad_rows`` pads."""
        # x (index 0) is the caller's per-call data: always copied.
        for index, (view, given) in enumerate(zip(views, tensors, strict=True)):
            keep = immutable and index > 0
            if keep and self.sources[index] is given:
                continue
            self.sources[index] = None  # no claim on the buffer while its copy is not enqueued
            rows = given.shape[0]
            if rows == view.shape[0]:  # every exact graph's call: no slicing on the replay path
                view.copy_(given)
                if keep:  # a claim only where the given tensor fills the view
                    self.sources[index] = given
            else:
                view[:rows].copy_(given)
                view[rows:].zero_()


def _buffer_shapes(signature: Signature, max_tokens: int) -> list[tuple[torch.dtype, tuple[int, ...]]]:
    """The staging buffer of each per-call tensor: its rows per token times ``max_tokens`` rows."""
    return [(dtype, (math.ceil(max_tokens * rows_per_token), *shape)) for dtype, shape, rows_per_token in signature]


def signature_of(tensors: tuple[torch.Tensor, ...], tokens: int) -> Signature:
    """What staging is shared by: dtypes, trailing shapes and rows per token, not the token count."""
    return tuple((t.dtype, tuple(t.shape[1:]), Fraction(t.shape[0], tokens)) for t in tensors)
