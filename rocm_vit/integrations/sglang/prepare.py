"""Qwen3-VL's work before the blocks on SGLang's graph path, from a cache per ``grid_thw`` layout.

SGLang 0.5.23's ``_prepare_graph_inputs`` rebuilds the position-embedding taps, the rotary position ids
and the offsets from ``grid_thw`` at every call: host loops and small kernels per image; its
``forward_with_cuda_graph`` then copies the offsets to the device with a blocking copy (a stream
synchronize per call). Here all of it is built once per layout (SGLang's own ops on the tower's
device, so the same bits) and kept, the offsets on the device too; a call on a known layout runs the
patch embedding (SGLang's module) and rocm-vit's position-embedding add (SGLang's lookup where the
table is split over ranks), inside rocm-vit's graphs where its adapter serves the tower, nothing that
grows with the image count and nothing that waits for the device. Output equals SGLang's graph path
under hook ``qwen3_vl_graph_interpolation`` bit for bit; other cases run SGLang's functions
(docs/sglang.md).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import torch

from rocm_vit.fusion import add_position_embedding
from rocm_vit.integrations.sglang.qwen3_vl import fast_pos_embed_interpolate
from rocm_vit.layout import GridTHW, VisionLayout, host_grid_thw, to_device_async
from rocm_vit.models.positions import rotary_position_ids

logger = logging.getLogger(__name__)

# Device bytes of prepared layouts kept per tower, least recently used out first (the newest always
# stays). Qwen3-VL-8B: 336 bytes a patch (cos/sin 2 x 36 fp32, taps, weights), 5.4 MiB at 16k patches.
LAYOUT_CACHE_BYTES = 64 << 20
_CACHE_ATTRIBUTE = "_rocm_vit_prepared_layouts"


class HoldsDeviceBytes(Protocol):
    @property
    def device_bytes(self) -> int: ...


Prepared = TypeVar("Prepared", bound=HoldsDeviceBytes)


@dataclass(frozen=True)
class PreparedLayout:
    """What one ``grid_thw`` layout needs before the blocks, on the tower's device; offsets on the host."""

    taps: torch.Tensor  # [N, 4] int64 rows of the position table, spatial-merge-block order
    weights: torch.Tensor  # [N, 4] fp32 holding values of the tower's dtype, as SGLang rounds them
    cos: torch.Tensor  # [N, rotary_dim]
    sin: torch.Tensor
    cu_seqlens: torch.Tensor  # [frames + 1] int32, CPU: what ``_prepare_graph_inputs`` returns
    device_cu_seqlens: torch.Tensor  # the same on the tower's device: what the graph runner is given
    offsets: tuple[int, ...]  # the same as host ints: the runner's layout key

    @property
    def device_bytes(self) -> int:
        held = (self.taps, self.weights, self.cos, self.sin, self.device_cu_seqlens)
        return sum(t.numel() * t.element_size() for t in held)


def prepare_graph_inputs_from_cache(original: Callable[..., tuple]) -> Callable[..., tuple]:
    """``_prepare_graph_inputs`` served from the per-layout cache; ``original`` where it does not cover the tower."""

    def _prepare_graph_inputs(self: Any, x: torch.Tensor, grid_thw: torch.Tensor | list) -> tuple:
        embedded = embedded_from_cache(self, x, grid_thw)
        if embedded is None:
            return original(self, x, grid_thw)
        x, prepared = embedded
        return x, prepared.cu_seqlens, prepared.cos, prepared.sin

    functools.update_wrapper(_prepare_graph_inputs, original, assigned=("__doc__",))
    return _prepare_graph_inputs


def forward_with_cuda_graph_from_cache(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``forward_with_cuda_graph`` handing the runner the cached offsets: on the device and as its key.

    SGLang's reads the key from its host offsets, then copies them to the device with a blocking copy.
    rocm-vit's adapter gets the patches and the cached inputs (``run_embedding``: the embedding in its
    graphs) where the whole position table is on this rank; any other runner SGLang's arguments.
    ``original`` runs where the cache does not cover the tower.
    """

    def forward_with_cuda_graph(self: Any, x: torch.Tensor, grid_thw: torch.Tensor | list) -> torch.Tensor:
        prepared = _covered(self, grid_thw)
        if prepared is None:
            return original(self, x, grid_thw)
        pixels = x.to(device=self.device, dtype=self.dtype, non_blocking=True)
        run_embedding = getattr(self.graph_runners, "run_embedding", None)
        if run_embedding is not None and whole_table(self):  # rocm-vit's adapter: the embedding in the graph
            embed_inputs = (prepared.taps, prepared.weights)
            return run_embedding(
                pixels, embed_inputs, prepared.cos, prepared.sin, prepared.device_cu_seqlens, prepared.offsets
            )
        x = _embedded(self, pixels, prepared)
        return self.graph_runners.run(
            x=x,
            position_embeddings=None,
            rotary_pos_emb_cos=prepared.cos,
            rotary_pos_emb_sin=prepared.sin,
            cu_seqlens=prepared.device_cu_seqlens,
            cu_window_seqlens=None,
            output_indices=None,
            attention_layout_key=(prepared.offsets, None),
        )

    functools.update_wrapper(forward_with_cuda_graph, original, assigned=("__doc__",))
    return forward_with_cuda_graph


def embedded_from_cache(
    tower: Any, x: torch.Tensor, grid_thw: torch.Tensor | list
) -> tuple[torch.Tensor, PreparedLayout] | None:
    """``x`` patch-embedded with its position embedding added, and its layout; ``None`` where SGLang's must run."""
    prepared = _covered(tower, grid_thw)
    if prepared is None:
        return None
    x = x.to(device=tower.device, dtype=tower.dtype, non_blocking=True)
    return _embedded(tower, x, prepared), prepared


def embed_patches(tower: Any, pixels: torch.Tensor, taps: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """SGLang's patch embedding, then rocm-vit's position add from the whole table (``whole_table``):
    what the adapter's runner runs before the blocks for ``run_embedding``, inside its graphs."""
    x = tower.patch_embed(pixels)
    return add_position_embedding(x, tower.pos_embed.weight, taps, weights, round_products=True)


def _embedded(tower: Any, pixels: torch.Tensor, prepared: PreparedLayout) -> torch.Tensor:
    if whole_table(tower):
        return embed_patches(tower, pixels, prepared.taps, prepared.weights)
    x = tower.patch_embed(pixels)
    x += _looked_up_position_embedding(tower, prepared)
    return x


def _covered(tower: Any, grid_thw: torch.Tensor | list) -> PreparedLayout | None:
    """``grid_thw``'s prepared layout, or ``None`` (logged once per reason) where SGLang's function must run."""
    reason = unsupported_reason(tower)
    if reason is not None:
        log_once(reason)
        return None
    try:
        return prepared_layout(tower, host_grid_thw(grid_thw))
    except ValueError as error:  # a grid SGLang may still serve (or reject in its own words)
        log_once("a grid_thw the cache does not take", error)
        return None


def unsupported_reason(tower: Any) -> str | None:
    """Why the cache cannot stand in for ``tower``'s own ``_prepare_graph_inputs``, or ``None``."""
    if getattr(type(tower), "fast_pos_embed_interpolate", None) is not fast_pos_embed_interpolate:
        return "hook qwen3_vl_graph_interpolation is not applied, so SGLang's graph path interpolates by its own rule"
    if getattr(tower.pos_embed, "weight", None) is None:
        return f"pos_embed is {type(tower.pos_embed).__name__}, not a table on this rank"
    return None


def whole_table(tower: Any) -> bool:
    """Whether ``pos_embed.weight`` is the whole table in the tower's dtype, which the fused add reads.

    Otherwise (split over tensor-parallel ranks, quantized) SGLang's module looks the rows up.
    """
    table = tower.pos_embed.weight
    quant_method = type(getattr(tower.pos_embed, "quant_method", None)).__name__
    return (
        getattr(tower.pos_embed, "tp_size", 1) == 1
        and quant_method in ("UnquantizedEmbeddingMethod", "NoneType")
        and table.dtype == tower.dtype
        and table.shape[0] >= tower.num_position_embeddings
    )


def prepared_layout(tower: Any, grid: tuple[GridTHW, ...]) -> PreparedLayout:
    """``grid``'s ``PreparedLayout`` for ``tower``, built at its first call; ``ValueError`` on a bad grid."""
    return cached_layout(tower, grid, lambda: _build(tower, VisionLayout.from_grid_thw(grid, tower.spatial_merge_size)))


def cached_layout(tower: Any, grid: tuple[GridTHW, ...], build: Callable[[], Prepared]) -> Prepared:
    """``tower``'s entry for ``grid``, from ``build()`` at its first call in this grad mode.

    Per grad mode, as SGLang's per-call tensors are: Dynamo guards on the kind of tensor (inference or
    not), so an entry built by the start's ``no_grad`` warm-up and read in an ``inference_mode`` request
    would hand the compiled rotary a mix the start never compiled.
    """
    cache = tower_cache(tower)
    key = (grid, torch.is_inference_mode_enabled())
    prepared = cache.get(key)
    if prepared is None:
        prepared = build()
        cache.put(key, prepared)
    return prepared


def _looked_up_position_embedding(tower: Any, prepared: PreparedLayout) -> torch.Tensor:
    """SGLang's interpolation ops at the cached taps: its module's lookup (and all-reduce), its roundings."""
    rows = tower.pos_embed(prepared.taps.t())  # [4, N, C]
    rows *= prepared.weights.t().to(rows.dtype)[:, :, None]
    return rows.sum(dim=0)


def _build(tower: Any, layout: VisionLayout) -> PreparedLayout:
    device = tower.device
    by_size: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
    taps, weights = [], []
    for t, h, w in layout.grid_thw:
        if (h, w) not in by_size:
            by_size[h, w] = _interpolation_taps(tower, h, w, device)
        item_taps, item_weights = by_size[h, w]
        taps.append(item_taps.repeat(t, 1))
        weights.append(item_weights.repeat(t, 1))
    # SGLang's rot_pos_emb: rows of its own cos/sin cache, gathered by (row, column) per patch.
    cos_table, sin_table = tower.rotary_pos_emb.get_cos_sin(max(max(h, w) for _, h, w in layout.grid_thw))
    positions = to_device_async(rotary_position_ids(layout), device)
    cu_seqlens = torch.tensor(layout.cu_seqlens, dtype=torch.int32)
    return PreparedLayout(
        taps=torch.cat(taps),
        weights=torch.cat(weights),
        cos=cos_table[positions].flatten(1),
        sin=sin_table[positions].flatten(1),
        cu_seqlens=cu_seqlens,
        device_cu_seqlens=to_device_async(cu_seqlens, device),
        offsets=tuple(layout.cu_seqlens),
    )


def _interpolation_taps(tower: Any, h: int, w: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """One frame's ``[h * w, 4]`` taps and weights in merge-block order.

    SGLang's ``fast_pos_embed_interpolate_from_list`` ops on the same device (linspace rounds there as
    it does for SGLang), so the weights are its bits; rounded to the tower's dtype as it rounds them.
    """
    side = tower.num_grid_per_side
    h_src = torch.linspace(0, side - 1, h, dtype=torch.float32, device=device)
    w_src = torch.linspace(0, side - 1, w, dtype=torch.float32, device=device)
    h_floor, w_floor = h_src.to(torch.long), w_src.to(torch.long)
    h_ceil = torch.clamp(h_floor + 1, max=side - 1)
    w_ceil = torch.clamp(w_floor + 1, max=side - 1)
    dh, dw = torch.meshgrid(h_src - h_floor, w_src - w_floor, indexing="ij")
    # SGLang's form (the corner products from w11), not (1 - dh) * (1 - dw): the last bits differ.
    w11 = dh * dw
    w10 = dh - w11
    w01 = dw - w11
    w00 = 1 - dh - w01
    rows = torch.stack([h_floor, h_floor, h_ceil, h_ceil])[:, :, None] * side
    cols = torch.stack([w_floor, w_ceil, w_floor, w_ceil])[:, None, :]
    taps = (rows + cols).permute(1, 2, 0)  # [h, w, 4]
    weights = torch.stack([w00, w01, w10, w11], dim=-1).to(tower.dtype).float()
    merge = tower.spatial_merge_size
    return _merge_block_order(taps, merge), _merge_block_order(weights, merge)


def _merge_block_order(grid: torch.Tensor, merge: int) -> torch.Tensor:
    h, w, channels = grid.shape
    blocks = grid.reshape(h // merge, merge, w // merge, merge, channels).permute(0, 2, 1, 3, 4)
    return blocks.reshape(h * w, channels)


class _LayoutCache:
    """Prepared layouts by ``grid_thw`` and grad mode, least recently used out first past ``LAYOUT_CACHE_BYTES``."""

    def __init__(self) -> None:
        self._layouts: OrderedDict[Hashable, HoldsDeviceBytes] = OrderedDict()
        self.bytes_held = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._layouts)

    def get(self, key: Hashable) -> Any:
        with self._lock:
            prepared = self._layouts.get(key)
            if prepared is not None:
                self._layouts.move_to_end(key)
            return prepared

    def put(self, key: Hashable, prepared: HoldsDeviceBytes) -> None:
        with self._lock:
            if key in self._layouts:  # another thread built it meanwhile
                return
            self._layouts[key] = prepared
            self.bytes_held += prepared.device_bytes
            while self.bytes_held > LAYOUT_CACHE_BYTES and len(self._layouts) > 1:
                self.bytes_held -= self._layouts.popitem(last=False)[1].device_bytes


_CACHES_LOCK = threading.Lock()


def tower_cache(tower: Any) -> _LayoutCache:
    # On the tower: its layouts live and die with it, and no other tower's device or dtype can mix in.
    with _CACHES_LOCK:
        found = tower.__dict__.get(_CACHE_ATTRIBUTE)
        if found is None:
            found = tower.__dict__[_CACHE_ATTRIBUTE] = _LayoutCache()
    return found


_logged: set[tuple[str, str]] = set()


def log_once(reason: str, detail: object = None, family: str = "Qwen3-VL") -> None:
    """One warning per ``family`` and ``reason`` (a fixed text); ``detail``, the first case's, is logged with it."""
    if (family, reason) not in _logged:
        _logged.add((family, reason))
        suffix = "" if detail is None else f" ({detail})"
        logger.warning("rocm-vit: %s's inputs before the blocks are SGLang's: %s%s", family, reason, suffix)
