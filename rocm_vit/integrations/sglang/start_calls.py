"""The calls an SGLang vision tower makes at server start, through SGLang's own entries.

``startup.py`` says when they run (after SGLang's own graphs, on every rank in the model's module
order); this module says what they are: the padded buckets' captures (the routine ``VisionTower``
runs too, ``graphs.padding.capture_buckets``) and an eager warm-up that compiles what a request's
eager call would.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from rocm_vit.graphs.padding import bucket_calls, capture_buckets, pixel_width


def capture_tower_buckets(vit: nn.Module, runner: Any, still_serving: Callable[[], bool]) -> int:
    """Capture ``runner``'s bucket graphs through ``vit.forward_with_cuda_graph``, SGLang's graph
    path, so each graph has a request's shapes and dtypes. Returns how many were captured: 0 for a
    tower without SGLang's patch embedding or graph path, or once ``still_serving()`` is false."""
    width = pixel_width(getattr(vit, "patch_embed", None))
    if width is None or not callable(getattr(vit, "forward_with_cuda_graph", None)):
        return 0

    def forward(pixels: torch.Tensor, grids: list) -> None:
        vit.forward_with_cuda_graph(pixels, torch.tensor(grids, dtype=torch.int32))

    return capture_buckets(runner, forward, vit.spatial_merge_size, width, vit.device, vit.dtype, still_serving)


def warm_up_tower(vit: nn.Module, max_tokens: int | None) -> None:
    """An eager call of a random image through SGLang's own ``forward`` under ``no_grad`` and one
    under ``inference_mode``: what a request's eager call compiles (rocm-vit's compiled rotary where
    it is chosen: seconds) compiles here instead. Dynamo compiles once per kind of tensor (an inference
    tensor's dispatch keys differ) and for every token count (no duck sizing); captures at start
    compile the ``no_grad`` kind only. With ``max_tokens`` (a runner serves the tower) the image is
    larger, so nothing is captured or counted towards a capture; else two merge blocks square."""
    width = pixel_width(getattr(vit, "patch_embed", None))
    merge = getattr(vit, "spatial_merge_size", None)
    if width is None or not isinstance(merge, int):
        return
    rows = 2 * merge
    columns = rows if max_tokens is None else merge * -(-(max_tokens + 1) // (rows * merge))
    for grad_mode in (torch.no_grad, torch.inference_mode):
        with grad_mode():  # the pixels too: made under inference mode, they are inference tensors
            for grids, pixels in bucket_calls([[(1, rows, columns)]], width, vit.device, vit.dtype):
                vit(pixels, torch.tensor(grids, dtype=torch.int32))
