"""What every reference tower shares: the forward path, graphs, the prepared-layout cache and the
layers common to Qwen3-VL and Qwen2.5-VL.

Invariant: ``encode`` (embedding, blocks, mergers) is the one function eager and graph mode run and
what a graph captures, so a replay costs the host one input copy per tensor and one launch
(docs/design.md, "Tower").
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from rocm_vit.attention import AttentionBackend, AttnArgs, LayerArgs, get_backend
from rocm_vit.fusion import add_norm
from rocm_vit.graphs import ViTGraphRunner
from rocm_vit.graphs.padding import capture_buckets, pixel_width
from rocm_vit.layout import VisionLayout, host_grid_thw
from rocm_vit.policy import active_policy, runner_options
from rocm_vit.recent import remember
from rocm_vit.rotary import apply_rotary
from rocm_vit.settings import load_settings
from rocm_vit.tower_config import TowerConfig

logger = logging.getLogger(__name__)

ACTIVATIONS = {
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "silu": F.silu,
}

# Prepared layouts kept per tower; each holds a few tensors per patch.
_LAYOUT_CACHE_SIZE = 64


@dataclass(frozen=True)
class PreparedLayout:
    """A layout with its device tensors, copied once from pinned host memory. ``embed_inputs`` reach a
    graph as per-call inputs: layouts sharing a graph may differ in them (16x32 and 32x16 images)."""

    layout: VisionLayout
    cos: torch.Tensor  # [N, head_dim] fp32, in the order the blocks see tokens
    sin: torch.Tensor
    embed_inputs: tuple[torch.Tensor, ...] = ()
    # Recorded on the stream that made the tensors above; readers on other streams wait for it.
    ready: torch.cuda.Event | None = None

    def wait_ready(self) -> None:
        """Make the current stream wait until the tensors are written (no host sync); once the event
        completed, a query replaces the wait (host time measured in 83841a0)."""
        if self.ready is not None and not self.ready.query():
            torch.cuda.current_stream(self.cos.device).wait_event(self.ready)


class VisionTower(nn.Module, ABC):
    """Base of the reference towers: subclasses set ``config_class``, build a ``patch_embed`` and
    implement ``embed``, ``forward_blocks``, ``_prepare_layout`` (and ``_restore_token_order`` if they
    reorder tokens)."""

    config_class: ClassVar[type[TowerConfig]]

    def __init__(self, config: TowerConfig, attention_backend: str | None = None) -> None:
        super().__init__()
        config.validate()
        if config.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act = {config.hidden_act!r} is not one of {sorted(ACTIVATIONS)}")
        self.config = config
        self.attention: AttentionBackend = get_backend(attention_backend, head_dim=config.head_dim)
        self._layouts: OrderedDict[tuple, PreparedLayout] = OrderedDict()
        self._layouts_lock = threading.Lock()  # several serving threads may share one tower
        self._graph_runner: ViTGraphRunner | None = None

    @classmethod
    def from_config(cls, config: Any, attention_backend: str | None = None) -> VisionTower:
        """Build from the matching transformers vision config, a dict of its fields, or a ``config_class``."""
        return cls(cls.config_class.from_config(config), attention_backend=attention_backend)

    @property
    def graph_runner(self) -> ViTGraphRunner | None:
        """The runner ``enable_graphs`` installed, or ``None`` while the tower runs eagerly."""
        return self._graph_runner

    @property
    def dtype(self) -> torch.dtype:
        return self.patch_embed.proj.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.patch_embed.proj.weight.device

    def forward(
        self,
        pixel_values: torch.Tensor,
        grid_thw: Sequence[Sequence[int]] | torch.Tensor,
        *,
        use_graphs: bool = True,
    ) -> torch.Tensor:
        """Encode packed patches ``[N, C * T * P * P]`` described by host-side ``grid_thw``.

        ``use_graphs=False`` runs eagerly, padded where the runner pads (what ``verify`` compares
        against). Nothing reads the device. Raises ``ValueError`` naming the value before anything
        runs when ``pixel_values`` or ``grid_thw`` do not fit this tower.
        """
        self._check_pixels(pixel_values)
        prepared = self._prepare(grid_thw, pixel_values.shape[0])
        prepared.wait_ready()
        layout, cos, sin, inputs = prepared.layout, prepared.cos, prepared.sin, prepared.embed_inputs
        runner = self._graph_runner
        if runner is not None and use_graphs:
            # The prepared tensors are this tower's, never written after they are made.
            out = runner.run(pixel_values, layout.attention, cos, sin, *inputs, immutable=True)
        elif runner is not None:  # the same function, padded where the runner pads
            out = runner.run_eager(pixel_values, layout.attention, cos, sin, *inputs)
        else:
            attn_args = self.attention.layout_args(layout, layout.cu_seqlens_tensors(pixel_values.device))
            out = self.encode(pixel_values, attn_args, cos, sin, *inputs)
        return self._restore_token_order(out, layout)

    def encode(
        self, pixel_values: torch.Tensor, attn_args: AttnArgs, cos: torch.Tensor, sin: torch.Tensor, *embed_inputs
    ) -> torch.Tensor:
        """``embed`` then ``forward_blocks``: what eager mode runs and graphs capture. Must not read the device."""
        return self.forward_blocks(self.embed(pixel_values, *embed_inputs), attn_args, cos, sin)

    def prepare_capture(self) -> None:
        """Make now what ``forward_blocks`` would make lazily in a capture's warm-up, from the graph pool."""

    @abstractmethod
    def embed(self, pixel_values: torch.Tensor, *embed_inputs: torch.Tensor) -> torch.Tensor:
        """``x`` ``[N, hidden]`` from packed patches, in the blocks' token order (``PreparedLayout.embed_inputs``)."""

    @abstractmethod
    def forward_blocks(
        self, x: torch.Tensor, attn_args: AttnArgs, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        """All blocks and the merger(s); ``attn_args`` by segmentation (``"full"``, ``"window"``).
        Must not read the device."""

    def enable_graphs(
        self,
        capacity: int | None = None,
        min_hits: int | None = None,
        max_tokens: int | None = None,
        budget_bytes: int | None = None,
        by_benefit: bool = True,
        padded: bool | None = None,
        **runner_extras: Any,
    ) -> ViTGraphRunner:
        """Run later calls through a ``ViTGraphRunner`` and return it.

        Options default to ``policy.runner_options``, as under SGLang; given ones replace them.
        ``by_benefit=False`` captures every layout within the limits (``bench``, ``verify``);
        ``padded`` (``None``: the settings', with ``by_benefit``) pads layouts that pay padded to a
        bucket so one-offs share a graph (docs/design.md, "Runner", "Padding"). On a CPU tower every
        call runs eagerly.
        """
        options = runner_options(
            active_policy(),
            load_settings(),
            self.config.depth,
            takes_device_offsets=self.attention.reads_offsets_on_device,
            padded=padded,
            by_benefit=by_benefit,
        )
        if max_tokens is not None:
            options = options.with_max_tokens(max_tokens)
        given = {"capacity": capacity, "min_hits": min_hits, "budget_bytes": budget_bytes}
        options = dataclasses.replace(options, **{name: value for name, value in given.items() if value is not None})
        self._graph_runner = ViTGraphRunner(
            self.encode,
            self.attention.layout_args,
            options,
            prepare_capture=self.prepare_capture,  # on the runner's stream, before the pool takes memory
            **runner_extras,
        )
        return self._graph_runner

    def prepare_kernels(self) -> None:
        """Compile every attention kernel variant before serving (3-5 s each inside a request on the
        H200); the tower's other kernels have no size-dependent variants."""
        config = self.config
        self.attention.prepare(config.head_dim, config.num_heads, config.num_heads, self.dtype, self.device)

    def capture_padded_buckets(self) -> int:
        """Capture each padded bucket's graph before serving, so first requests do not pay for it; returns
        how many. Call it under the server's grad mode: tensors made under inference mode cannot be
        written outside it, and the staging made here serves its calls."""
        self.prepare_kernels()
        runner = self._graph_runner
        if runner is None or runner.padding is None:
            return 0
        config = self.config
        merge, width = config.spatial_merge_size, pixel_width(config)
        captured = capture_buckets(
            runner, lambda pixels, grids: self(pixels, grids), merge, width, self.device, self.dtype
        )
        logger.info("captured %d padded bucket graphs before serving", captured)
        return captured

    def _apply(self, fn: Callable, recurse: bool = True) -> VisionTower:
        # .to() / .cuda() / .half() replace parameters and buffers: prepared layouts hold tensors
        # of the old device and dtype, and captured graphs read the old weights' memory.
        self._layouts.clear()
        if self._graph_runner is not None:
            logger.warning("the tower moved or changed dtype: its graphs are dropped; call enable_graphs() again")
            self._graph_runner = None
        return super()._apply(fn, recurse)

    def __getstate__(self) -> dict[str, Any]:
        # copy.deepcopy and pickle: the lock cannot be copied, and prepared layouts (device tensors
        # and ready events of this process) are a cache the copy rebuilds.
        state = self.__dict__.copy()
        state["_layouts"] = OrderedDict()
        del state["_layouts_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._layouts_lock = threading.Lock()

    def disable_graphs(self) -> None:
        """Back to eager; the runner's graphs and pool are released when nothing else holds it."""
        self._graph_runner = None

    @abstractmethod
    def _prepare_layout(self, layout: VisionLayout) -> PreparedLayout:
        """The device tensors this tower needs for ``layout`` (on ``self.device``, non-blocking)."""

    def _restore_token_order(self, merged: torch.Tensor, layout: VisionLayout) -> torch.Tensor:
        """Merged tokens back in ``grid_thw`` order; identity for towers that never reorder them."""
        return merged

    def _check_pixels(self, pixel_values: torch.Tensor) -> None:
        config = self.config
        width = config.in_channels * config.temporal_patch_size * config.patch_size**2
        if not isinstance(pixel_values, torch.Tensor):
            raise ValueError(f"pixel_values must be a tensor, got {type(pixel_values).__name__}")
        if pixel_values.dim() != 2 or pixel_values.shape[1] != width:
            raise ValueError(
                f"pixel_values has shape {tuple(pixel_values.shape)}; expected [num_patches, {width}] "
                f"({config.in_channels} channels x {config.temporal_patch_size} frames x {config.patch_size}² pixels)"
            )
        if not pixel_values.is_floating_point():
            raise ValueError(f"pixel_values has dtype {pixel_values.dtype}; expected a floating-point tensor")
        if pixel_values.device != self.device:
            raise ValueError(f"pixel_values is on {pixel_values.device}; the tower is on {self.device}")

    def _prepare(self, grid_thw: Sequence[Sequence[int]] | torch.Tensor, num_patches: int) -> PreparedLayout:
        # Only valid grids are cached: a miss builds the layout, which validates and raises.
        key = (host_grid_thw(grid_thw), num_patches, self.device)
        with self._layouts_lock:
            prepared = self._layouts.get(key)
            if prepared is not None:
                self._layouts.move_to_end(key)
                return prepared
            layout = VisionLayout.from_grid_thw(
                key[0],
                self.config.spatial_merge_size,
                num_patches=num_patches,
                window_merge_blocks=self.config.window_merge_blocks,
            )
            prepared = self._prepare_layout(layout)
            if prepared.cos.is_cuda:
                ready = torch.cuda.Event()
                ready.record(torch.cuda.current_stream(prepared.cos.device))
                prepared = dataclasses.replace(prepared, ready=ready)
            return remember(self._layouts, key, prepared, _LAYOUT_CACHE_SIZE)


class PatchEmbed(nn.Module):
    """Conv3d patchify with kernel == stride, computed as one matmul (same weights as transformers)."""

    def __init__(self, config: TowerConfig, bias: bool) -> None:
        super().__init__()
        kernel = (config.temporal_patch_size, config.patch_size, config.patch_size)
        self.proj = nn.Conv3d(config.in_channels, config.hidden_size, kernel_size=kernel, stride=kernel, bias=bias)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        weight = self.proj.weight.view(self.proj.out_channels, -1)
        return F.linear(pixel_values.to(weight.dtype), weight, self.proj.bias)


class VisionRotaryEmbedding(nn.Module):
    """Axial 2-D rotary angles, as transformers' Qwen3-VL and Qwen2.5-VL: half of each head by row,
    half by column."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        axis_dim = head_dim // 2
        inv_freq = 1.0 / (theta ** (torch.arange(0, axis_dim, 2, dtype=torch.float) / axis_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``positions`` ``[N, 2]`` (row, column) -> fp32 ``cos``, ``sin`` ``[N, head_dim]`` in NEOX layout."""
        angles = (positions[..., None].float() * self.inv_freq).flatten(1)
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos(), angles.sin()


class VisionAttention(nn.Module):
    def __init__(self, config: TowerConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=True)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.backend = backend

    def forward(self, x: torch.Tensor, layer_args: LayerArgs, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(x.shape[0], 3, self.num_heads, self.head_dim).unbind(1)
        apply_rotary(q, k, cos, sin)
        out = self.backend(q, k, v, layer_args, self.scale)
        return self.proj(out.reshape(x.shape[0], -1))


class VisionBlock(nn.Module):
    """Pre-norm attention and MLP. Each residual add is fused with the norm after it, so a block takes
    its input normalised by ``norm1`` and returns it normalised by the next norm in the stack."""

    def __init__(
        self, config: TowerConfig, backend: AttentionBackend, norm: Callable[[int], nn.Module], mlp: nn.Module
    ) -> None:
        super().__init__()
        self.norm1 = norm(config.hidden_size)
        self.norm2 = norm(config.hidden_size)
        self.attn = VisionAttention(config, backend)
        self.mlp = mlp

    def forward(
        self,
        x: torch.Tensor,
        normed: torch.Tensor,
        layer_args: LayerArgs,
        cos: torch.Tensor,
        sin: torch.Tensor,
        next_norm: nn.Module,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x', next_norm(x'))`` for the residual stream ``x`` and ``normed = norm1(x)``."""
        x, normed = add_norm(x, self.attn(normed, layer_args, cos, sin), self.norm2)
        return add_norm(x, self.mlp(normed), next_norm)


def run_blocks(
    blocks: Sequence[VisionBlock],
    x: torch.Tensor,
    block_layer_args: Sequence[LayerArgs],
    cos: torch.Tensor,
    sin: torch.Tensor,
    final_norm: nn.Module,
    taps: Mapping[int, Callable[[torch.Tensor], torch.Tensor]] = MappingProxyType({}),
) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """``(final_norm(x), {i: taps[i](x after block i)})``; a tap runs as soon as its block is done (it
    may launch work on another stream)."""
    x, normed = add_norm(x, None, blocks[0].norm1)
    tapped = {}
    for index, (block, layer_args) in enumerate(zip(blocks, block_layer_args, strict=True)):
        next_norm = blocks[index + 1].norm1 if index + 1 < len(blocks) else final_norm
        x, normed = block(x, normed, layer_args, cos, sin, next_norm)
        if index in taps:
            tapped[index] = taps[index](x)
    return normed, tapped


class RMSNorm(nn.Module):
    """transformers' ``Qwen2_5_VLRMSNorm``: normalise in fp32, round to the input dtype, then scale."""

    norm_kind: ClassVar[str] = "rms_norm"  # what rocm_vit.fusion.add_norm fuses it as

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


layer_norm = functools.partial(nn.LayerNorm, eps=1e-6)
rms_norm = functools.partial(RMSNorm, eps=1e-6)
