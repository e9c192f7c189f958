"""The one forward a runner runs, three ways: eagerly on a copy, captured on staging, replayed.

Invariants (docs/design.md, "Runner" and "Streams and threads"): an eager run never writes the
caller's tensors (SGLang's blocks add into their input in place, and a caller's fallback after a
failure starts from its input); a replay runs on the caller's stream, its output allocated there
before the replay launches; one marker orders the runner's device work across the streams it runs on.
Where a rank's eager call cannot stand in for its replay (``launch_agreement``), every rank agrees
that each is ready before any launches (docs/design.md, "Ranks").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from rocm_vit.graphs.ranks import AgreeMax
from rocm_vit.graphs.store import Graph
from rocm_vit.graphs.torch_graphs import GraphMechanism, Marker
from rocm_vit.layout import AttentionLayout

# forward_blocks(x, attn_args, cos, sin, *inputs) -> output
ForwardBlocks = Callable[..., torch.Tensor]
# layout_args(layout, cu_seqlens) -> attn_args, which the runner passes on unread.
LayoutArgs = Callable[[AttentionLayout, Mapping[str, torch.Tensor]], Mapping[str, Any]]


class PeerReplayNotReady(RuntimeError):
    """Another rank's replay of this call failed before its launch: none launches (``launch_agreement``)."""


class ReplayLaunchFailed(BaseException):
    """A replay's launch raised after every rank agreed to launch (``launch_agreement``): the other
    ranks' replays wait for this rank's all-reduces, and only the replay pairs with them. A
    ``BaseException``, so that no handler runs the forward eagerly in its place on this rank alone."""


class Forward:
    """``forward_blocks(x, layout_args(layout, cu_seqlens), cos, sin, *inputs)`` run eagerly
    (``eager``), built for a capture on staging views (``on_staging``) or replayed (``replay``).
    ``launch_agreement``: the ranks' maximum, taken before every replay's launch, where an eager call
    on one rank does not pair with a replay on the others (a collective whose replay reads the
    inputs registered at capture); ``None`` where it does, or for a rank alone."""

    def __init__(
        self,
        forward_blocks: ForwardBlocks,
        layout_args: LayoutArgs,
        mechanism: GraphMechanism,
        launch_agreement: AgreeMax | None = None,
    ) -> None:
        self.forward_blocks = forward_blocks
        self.layout_args = layout_args
        self._mechanism = mechanism
        self._launch_agreement = launch_agreement
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
        """The forward a capture records, on staging ``views`` and the graph's own ``offsets``."""
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
        """Fill staging and replay ``entry`` on the caller's stream, after the runner's work on others.
        The output tensor is allocated before the launch: nothing that can fail sits between a
        launched replay, whose all-reduces the other ranks wait for, and the return. Under a
        ``launch_agreement`` a failure before the launch, here or on another rank
        (``PeerReplayNotReady``), raises on every rank before any launches; a launch that raises is
        ``ReplayLaunchFailed``."""
        stream = self._mechanism.current_stream(tensors[0].device)
        self.order.follow(stream)
        try:
            error = None
            try:
                entry.staging.fill(entry.inputs, tensors, immutable)
                if entry.offsets_per_call:
                    self._write_offsets(entry, layout)
                output = torch.empty_like(entry.output)
            except Exception as raised:
                if self._launch_agreement is None:
                    raise
                error = raised
            if self._launch_agreement is not None:
                (not_ready,) = self._launch_agreement([int(error is not None)])
                if error is not None:
                    raise error
                if not_ready:
                    raise PeerReplayNotReady("another rank's replay failed before its launch: no rank launches")
            try:
                self._mechanism.replay(entry.graph)
            except Exception as raised:
                if self._launch_agreement is None:
                    raise
                message = f"the replay's launch raised after every rank agreed to launch: {raised}"
                raise ReplayLaunchFailed(message) from raised
        except BaseException:
            self.order.mark(stream)  # what was enqueued before the error reads staging on this stream
            raise
        output.copy_(entry.output)
        self.order.mark(stream)  # after the copy, which reads staging
        return output

    @staticmethod
    def _write_offsets(entry: Graph, layout: AttentionLayout) -> None:
        """A padded graph's offsets input: this call's, device-to-device on the caller's stream."""
        for name, offsets in entry.offsets.items():
            offsets.copy_(layout.cu_seqlens_tensor(offsets.device, name))
