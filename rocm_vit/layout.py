"""VisionLayout: everything about one batch of images and videos that is known on the host.

Invariants: built from host ``grid_thw``, a layout never reads the device; each segmentation's int32
``cu_seqlens`` is copied to a device once, with an event readers wait for. Contract: docs/design.md, "Layout".
"""

from __future__ import annotations

import functools
import itertools
import operator
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

GridTHW = tuple[int, int, int]


@dataclass(frozen=True)
class Segmentation:
    """One cut of the packed tokens into attention segments: host lengths and offsets."""

    seq_lens: tuple[int, ...]
    cu_seqlens: tuple[int, ...]
    max_seqlen: int

    @classmethod
    def from_lengths(cls, seq_lens: Sequence[int]) -> Segmentation:
        cu_seqlens = [0]
        for length in seq_lens:
            cu_seqlens.append(cu_seqlens[-1] + length)
        return cls(tuple(seq_lens), tuple(cu_seqlens), max(seq_lens))

    @classmethod
    def from_offsets(cls, cu_seqlens: Sequence[int]) -> Segmentation:
        """These host offsets as given (empty segments kept); ``ValueError`` unless >= 2, from 0, non-decreasing."""
        offsets = tuple(operator.index(offset) for offset in cu_seqlens)
        if len(offsets) < 2 or offsets[0] != 0:
            raise ValueError(f"cu_seqlens = {offsets} must start at 0 and end after at least one segment")
        seq_lens = tuple(end - start for start, end in itertools.pairwise(offsets))
        for index, length in enumerate(seq_lens):
            if length < 0:
                raise ValueError(f"cu_seqlens[{index + 1}] = {offsets[index + 1]} is below cu_seqlens[{index}]")
        return cls(seq_lens, offsets, max(seq_lens))


class DeviceCopies:
    """Host tensors copied to a device once per device; ``get`` makes the current stream wait on the copy.

    No host sync. Inside a graph capture nothing waits (the runner hands captures its static buffers).
    """

    def __init__(self) -> None:
        self._copies: dict[tuple, tuple[torch.Tensor, torch.cuda.Event | None]] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable, device: torch.device | str, make_host: Callable[[], torch.Tensor]) -> torch.Tensor:
        device = torch.device(device)
        with self._lock:
            entry = self._copies.get((key, device))
            if entry is None:
                tensor = to_device_async(make_host(), device)
                ready = None
                if device.type == "cuda":
                    ready = torch.cuda.Event()
                    ready.record(torch.cuda.current_stream(device))
                entry = self._copies[(key, device)] = (tensor, ready)
        tensor, ready = entry
        if ready is not None and not torch.cuda.is_current_stream_capturing():
            torch.cuda.current_stream(device).wait_event(ready)
        return tensor


class AttentionLayout:
    """The attention segmentations of one packed batch by name (``"full"``, maybe ``"window"``); host data.
    ``offsets_per_call``: layouts sharing its key differ in offsets, so a graph takes them per call."""

    offsets_per_call = False

    def __init__(self, segmentations: Mapping[str, Segmentation]) -> None:
        if "full" not in segmentations:
            raise ValueError(f"segmentations {list(segmentations)} must include 'full'")
        self.segmentations: dict[str, Segmentation] = dict(segmentations)
        ends = {name: segmentation.cu_seqlens[-1] for name, segmentation in self.segmentations.items()}
        if len(set(ends.values())) != 1:
            raise ValueError(f"segmentations cover different token counts: {ends}")
        self._copies = DeviceCopies()

    @classmethod
    def from_offsets(cls, cu_seqlens: Sequence[int], cu_window_seqlens: Sequence[int] | None = None) -> AttentionLayout:
        """From host offsets as a model hands them over (SGLang's ``cu_seqlens``, ``cu_window_seqlens``)."""
        segmentations = {"full": Segmentation.from_offsets(cu_seqlens)}
        if cu_window_seqlens is not None:
            segmentations["window"] = Segmentation.from_offsets(cu_window_seqlens)
        return cls(segmentations)

    @property
    def num_patches(self) -> int:
        return self.segmentations["full"].cu_seqlens[-1]

    @functools.cached_property
    def graph_key(self) -> tuple:
        """Every segmentation's boundaries: layouts share a key exactly when their segmentations agree."""
        return tuple(
            part
            for name, segmentation in self.segmentations.items()
            for part in (name, segmentation.cu_seqlens, segmentation.max_seqlen)
        )

    def cu_seqlens_host(self, segmentation: str = "full") -> torch.Tensor:
        """The int32 offsets of ``segmentation`` as a CPU tensor, made once (pinned where a GPU is visible)."""
        return self._copies.get(("host", segmentation), "cpu", lambda: _pinned(self._offsets(segmentation)))

    def cu_seqlens_tensor(self, device: torch.device | str, segmentation: str = "full") -> torch.Tensor:
        """The int32 ``cu_seqlens`` of ``segmentation`` on ``device``, made once per device, non-blocking."""
        return self._copies.get(("cu_seqlens", segmentation), device, lambda: self._offsets(segmentation))

    def cu_seqlens_tensors(self, device: torch.device | str) -> dict[str, torch.Tensor]:
        """``cu_seqlens_tensor`` of every segmentation, by name."""
        return {name: self.cu_seqlens_tensor(device, name) for name in self.segmentations}

    def _offsets(self, segmentation: str) -> torch.Tensor:
        if segmentation not in self.segmentations:
            raise ValueError(f"segmentation = {segmentation!r} is not one of this layout's {list(self.segmentations)}")
        return torch.tensor(self.segmentations[segmentation].cu_seqlens, dtype=torch.int32)


class PaddedLayout(AttentionLayout):
    """``real``'s segmentation and a segment of padding, ``tokens`` in all: real tokens never attend to
    the padding, and a kernel writes every padding row. Layouts of one token and segment count share
    a key and a graph: offsets per call, ``max_seqlen`` = ``tokens``, a bound for all of them."""

    offsets_per_call = True

    def __init__(self, real: AttentionLayout, tokens: int) -> None:
        if set(real.segmentations) != {"full"}:
            raise ValueError(f"only a layout with one segmentation is padded; this one has {list(real.segmentations)}")
        if tokens <= real.num_patches:
            raise ValueError(f"tokens = {tokens} must exceed the layout's {real.num_patches} patches")
        full = real.segmentations["full"]
        seq_lens = (*full.seq_lens, tokens - real.num_patches)
        super().__init__({"full": Segmentation(seq_lens, (*full.cu_seqlens, tokens), tokens)})
        self.real_patches = real.num_patches

    @functools.cached_property
    def graph_key(self) -> tuple:
        """The token count and segment count: what every layout sharing this graph has in common."""
        return ("padded", self.num_patches, len(self.segmentations["full"].seq_lens))


@dataclass(frozen=True)
class VisionLayout:
    """Host-side description of a packed batch: one attention segment per frame of ``grid_thw``, and
    with ``window_merge_blocks`` windows, whose host permutations (``window_index`` / ``window_inverse``)
    are transformers' ``get_vision_window_index``."""

    grid_thw: tuple[GridTHW, ...]
    spatial_merge_size: int
    seq_lens: tuple[int, ...]
    cu_seqlens: tuple[int, ...]
    max_seqlen: int
    window_merge_blocks: int | None = None
    window_seq_lens: tuple[int, ...] | None = None
    cu_window_seqlens: tuple[int, ...] | None = None
    max_window_seqlen: int | None = None
    window_index: torch.Tensor | None = field(default=None, repr=False, compare=False, hash=False)
    window_inverse: torch.Tensor | None = field(default=None, repr=False, compare=False, hash=False)
    _copies: DeviceCopies = field(default_factory=DeviceCopies, init=False, repr=False, compare=False, hash=False)
    offsets_per_call = False  # as AttentionLayout's: the graph key carries the offsets

    @classmethod
    def from_grid_thw(
        cls,
        grid_thw: Sequence[Sequence[int]] | torch.Tensor,
        spatial_merge_size: int = 2,
        *,
        num_patches: int | None = None,
        window_merge_blocks: int | None = None,
    ) -> VisionLayout:
        """Validate ``grid_thw`` (list of ``(t, h, w)`` or CPU int tensor) and build the layout.

        ``num_patches`` must equal the sum of ``t * h * w``; ``window_merge_blocks`` is 4 for Qwen2.5-VL.
        Raises ``ValueError`` naming field and value on bad input and on a device tensor.
        """
        if not isinstance(spatial_merge_size, int) or spatial_merge_size < 1:
            raise ValueError(f"spatial_merge_size = {spatial_merge_size!r} must be a positive int")
        if window_merge_blocks is not None and (not isinstance(window_merge_blocks, int) or window_merge_blocks < 1):
            raise ValueError(f"window_merge_blocks = {window_merge_blocks!r} must be a positive int or None")
        items = host_grid_thw(grid_thw)
        for index, (t, h, w) in enumerate(items):
            for name, value in (("t", t), ("h", h), ("w", w)):
                if value <= 0:
                    raise ValueError(f"grid_thw[{index}].{name} = {value} must be positive")
            for name, value in (("h", h), ("w", w)):
                if value % spatial_merge_size:
                    raise ValueError(
                        f"grid_thw[{index}].{name} = {value} is not divisible by "
                        f"spatial_merge_size {spatial_merge_size}"
                    )
        full = Segmentation.from_lengths([h * w for t, h, w in items for _ in range(t)])
        if num_patches is not None and num_patches != full.cu_seqlens[-1]:
            raise ValueError(
                f"pixel_values has {num_patches} rows but grid_thw {list(items)} "
                f"describes {full.cu_seqlens[-1]} patches"
            )
        if window_merge_blocks is None:
            return cls(items, spatial_merge_size, *_fields(full))
        window_lens, window_index = _window_partition(items, spatial_merge_size, window_merge_blocks)
        window = Segmentation.from_lengths(window_lens)
        window_inverse = torch.empty_like(window_index)
        window_inverse[window_index] = torch.arange(window_index.numel())
        return cls(
            items,
            spatial_merge_size,
            *_fields(full),
            window_merge_blocks,
            *_fields(window),
            window_index=window_index,
            window_inverse=window_inverse,
        )

    @property
    def num_patches(self) -> int:
        return self.cu_seqlens[-1]

    @property
    def num_merged_tokens(self) -> int:
        return self.num_patches // (self.spatial_merge_size**2)

    @functools.cached_property
    def segmentations(self) -> dict[str, Segmentation]:
        """The attention segmentations by name: ``"full"``, then ``"window"`` for a windowed layout."""
        full = {"full": Segmentation(self.seq_lens, self.cu_seqlens, self.max_seqlen)}
        if self.window_merge_blocks is None:
            return full
        return {**full, "window": Segmentation(self.window_seq_lens, self.cu_window_seqlens, self.max_window_seqlen)}

    @functools.cached_property
    def attention(self) -> AttentionLayout:
        return AttentionLayout(self.segmentations)

    @property
    def graph_key(self) -> tuple:
        return self.attention.graph_key

    def cu_seqlens_tensor(self, device: torch.device | str, segmentation: str = "full") -> torch.Tensor:
        return self.attention.cu_seqlens_tensor(device, segmentation)

    def cu_seqlens_tensors(self, device: torch.device | str) -> dict[str, torch.Tensor]:
        return self.attention.cu_seqlens_tensors(device)

    def to_window_order(self, rows: torch.Tensor) -> torch.Tensor:
        """Permute ``rows`` ``[N, ...]`` from merge-block into window order, whole merge blocks; no sync."""
        index = self.window_tensor("window_index", rows.device)
        return permute_merge_blocks(rows, index, self.spatial_merge_size**2)

    def from_window_order(self, merged: torch.Tensor) -> torch.Tensor:
        """Put merged tokens ``[N / merge², ...]`` (one row per merge block) back in merge-block order."""
        return merged.index_select(0, self.window_tensor("window_inverse", merged.device))

    def window_tensor(self, name: str, device: torch.device | str) -> torch.Tensor:
        """``window_index`` (merge blocks into window order) or ``window_inverse`` on ``device``, made once."""
        host = getattr(self, name)
        if host is None:
            raise ValueError(f"{name}: this layout has no windows (built without window_merge_blocks)")
        return self._copies.get(name, device, lambda: host)


def to_device_async(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Copy a host tensor to ``device`` without blocking the host (pinned source on a GPU)."""
    if device.type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def _pinned(host: torch.Tensor) -> torch.Tensor:
    return host.pin_memory() if torch.cuda.is_available() else host


def permute_merge_blocks(rows: torch.Tensor, index: torch.Tensor, unit: int) -> torch.Tensor:
    """Rows ``[N, ...]`` with their merge blocks (``unit`` consecutive rows each) reordered by ``index``."""
    return rows.reshape(rows.shape[0] // unit, unit, *rows.shape[1:]).index_select(0, index).reshape(rows.shape)


def _fields(segmentation: Segmentation) -> tuple:
    return segmentation.seq_lens, segmentation.cu_seqlens, segmentation.max_seqlen


def _window_partition(items: Sequence[GridTHW], merge: int, window: int) -> tuple[list[int], torch.Tensor]:
    """Window lengths in tokens and the merge-block permutation making each window contiguous.

    Row-major per frame; last row and column may be partial; as transformers' ``get_vision_window_index``.
    """
    unit = merge * merge
    lengths: list[int] = []
    index_parts = []
    offset = 0
    for t, h, w in items:
        rows, cols = h // merge, w // merge
        windows_h, windows_w = -(-rows // window), -(-cols // window)
        padded = torch.full((t, windows_h * window, windows_w * window), -1, dtype=torch.int64)
        padded[:, :rows, :cols] = torch.arange(offset, offset + t * rows * cols).view(t, rows, cols)
        by_window = padded.view(t, windows_h, window, windows_w, window).permute(0, 1, 3, 2, 4)
        by_window = by_window.reshape(t * windows_h * windows_w, window * window)
        present = by_window >= 0
        lengths.extend((present.sum(1) * unit).tolist())
        index_parts.append(by_window[present])
        offset += t * rows * cols
    return lengths, torch.cat(index_parts)


def host_grid_thw(grid_thw: Sequence[Sequence[int]] | torch.Tensor) -> tuple[GridTHW, ...]:
    """``grid_thw`` as int triples from a list or CPU tensor (form only); a device tensor is refused."""
    if isinstance(grid_thw, torch.Tensor):
        if grid_thw.device.type != "cpu":
            raise ValueError(
                f"grid_thw is on {grid_thw.device}; pass host data (a list or a CPU tensor): "
                "reading a device tensor would force a device-to-host sync"
            )
        if grid_thw.is_floating_point() or grid_thw.is_complex():
            raise ValueError(f"grid_thw has dtype {grid_thw.dtype}; expected an integer tensor")
        if grid_thw.dim() != 2 or grid_thw.shape[1] != 3:
            raise ValueError(f"grid_thw has shape {tuple(grid_thw.shape)}; expected [num_items, 3]")
        rows = grid_thw.tolist()
    else:
        rows = list(grid_thw)
    if not rows:
        raise ValueError("grid_thw is empty; expected at least one (t, h, w)")
    items = []
    for index, row in enumerate(rows):
        values = tuple(row)
        if len(values) != 3:
            raise ValueError(f"grid_thw[{index}] = {row!r} must be a (t, h, w) triple")
        try:
            if any(isinstance(value, bool) for value in values):
                raise TypeError
            items.append(tuple(operator.index(value) for value in values))
        except TypeError:
            raise ValueError(f"grid_thw[{index}] = {row!r} must hold integers") from None
    return tuple(items)
