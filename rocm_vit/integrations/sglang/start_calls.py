"""The calls an SGLang vision tower makes at server start, through SGLang's own entries.

``startup.py`` says when they run; this module says what they are: the padded buckets' captures and
an eager warm-up that compiles what a request's eager call would.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from rocm_vit.graphs.padding import bucket_calls, capture_buckets, pixel_width


def capture_tower_buckets(vit: nn.Module, runner: Any, still_serving: Callable[[], bool]) -> int:
    """Capture ``runner``'s bucket graphs through SGLang's graph path, so each has a request's shapes
    and dtypes. Returns how many (0 for a tower without that path)."""
    width = pixel_width(getattr(vit, "patch_embed", None))
    if width is None or not callable(getattr(vit, "forward_with_cuda_graph", None)):
        return 0

    def forward(pixels: torch.Tensor, grids: list) -> None:
        vit.forward_with_cuda_graph(pixels, torch.tensor(grids, dtype=torch.int32))

    return capture_buckets(runner, forward, vit.spatial_merge_size, width, vit.device, vit.dtype, still_serving)


def warm_up_tower(vit: nn.Module, max_tokens: int | None) -> None:
    """An eager call through SGLang's ``forward`` under ``no_grad`` and one under ``inference_mode``
    (Dynamo compiles once per kind of tensor), so no request compiles. With ``max_tokens`` the image
    is larger than it, so nothing is captured or counted towards a capture."""
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
