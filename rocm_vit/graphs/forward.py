"""The one forward a runner runs, three ways: eagerly on a copy, captured on staging, replayed.

Invariants (docs/design.md, "Runner" and "Streams and threads"): an eager run never writes the
caller's tensors (SGLang's blocks add into their input in place, and a caller's fallback after a
failure starts from its input); a replay runs on the caller's stream, its output cloned there for the
caller; one marker orders the runner's device work across the streams it runs on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from rocm_vit.graphs.store import Graph
from rocm_vit.graphs.torch_graphs import GraphMechanism, Marker
from rocm_vit.layout import AttentionLayout

# forward_blocks(x, attn_args, cos, sin, *inputs) -> output
ForwardBlocks = Callable[..., torch.Tensor]
# layout_args(layout, cu_seqlens) -> attn_args: per segmentation, built on the given offsets tensors
# (a tower's: rocm_vit.attention.AttnArgs). The runner passes them on unread.
LayoutArgs = Callable[[AttentionLayout, Mapping[str, torch.Tensor]], Mapping[str, Any]]


class Forward:
    """``forward_blocks(x, layout_args(layout, cu_seqlens), cos, sin, *inputs)`` run eagerly
    (``eager``), built for a capture on staging views (``on_staging``) or replayed (``replay``)."""

    def __init__(self, forward_blocks: ForwardBlocks, layout_args: LayoutArgs, mechanism: GraphMechanism) -> None:
        self.forward_blocks = forward_blocks
        self.layout_args = layout_args
        self._mechanism = mechanism
        self.order = Marker(mechanism)  # the runner's device work, in order across streams

    def eager(self, tensors: tuple[torch.Tensor, ...], layout: AttentionLayout) -> torch.Tensor:
        """``forward_blocks`` on a copy of ``x``, on the layout's own offsets: the caller's tensors are
        never written."""
        x, cos, sin, *inputs = tensors
        attn_args = self.layout_args(layout, layout.cu_seqlens_tensors(x.device))
        return self.forward_blocks(x.clone(), attn_args, cos, sin, *inputs)

    def on_staging(
        self, views: tuple[torch.Tensor, ...], layout: AttentionLayout, offsets: dict[str, torch.Tensor]
    ) -> Callable[[], torch.Tensor]:
        """The forward a capture records: on staging ``views`` and the graph's own ``offsets``. A
        padded layout's kernels read its offsets from a copy that a kernel of the graph makes, never
        from what a copy wrote (``capture._graph_offsets``)."""
        attn_args = None if layout.offsets_per_call else self.layout_args(layout, offsets)

        def forward() -> torch.Tensor:
            x, cos, sin, *inputs = views
            if layout.offsets_per_call:  # read from a copy that a kernel of the graph writes
                made = {name: torch.add(given, 0) for name, given in offsets.items()}
                return self.forward_blocks(x, self.layout_args(layout, made), cos, sin, *inputs)
            return self.forward_blocks(x, attn_args, cos, sin, *inputs)

        return forward

    def replay(
        self, entry: Graph, layout: AttentionLayout, tensors: tuple[torch.Tensor, ...], immutable: bool
    ) -> torch.Tensor:
        self.launch(entry, layout, tensors, immutable)
        return self.take_output(entry)

    def launch(self, entry: Graph, layout: AttentionLayout, tensors: tuple[torch.Tensor, ...], immutable: bool) -> None:
        """Fill staging and replay ``entry`` on the caller's stream: ordered after the caller's pending
        work (its inputs) by the stream itself, after the runner's last work on other streams by the
        marker."""
        stream = self._mechanism.current_stream(tensors[0].device)
        self.order.follow(stream)
        try:
            entry.staging.fill(entry.inputs, tensors, immutable)
            if entry.offsets_per_call:
                self._write_offsets(entry, layout)
            self._mechanism.replay(entry.graph)
        except BaseException:
            self.order.mark(stream)  # what was enqueued before the error reads staging on this stream
            raise

    def take_output(self, entry: Graph) -> torch.Tensor:
        """The replay's output, cloned for the caller on its stream, allocated there; the marker
        goes after the clone, which reads staging."""
        stream = self._mechanism.current_stream(entry.output.device)
        output = entry.output.clone()
        self.order.mark(stream)
        return output

    @staticmethod
    def _write_offsets(entry: Graph, layout: AttentionLayout) -> None:
        """A padded graph's offsets input: this call's, device-to-device on the caller's stream."""
        for name, offsets in entry.offsets.items():
            offsets.copy_(layout.cu_seqlens_tensor(offsets.device, name))
