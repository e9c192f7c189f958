"""Which accelerator this process runs on: ROCm, CUDA or CPU, decided from torch alone."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

import torch

PlatformName = Literal["rocm", "cuda", "cpu"]


@dataclass(frozen=True)
class PlatformInfo:
    """What `rocm-vit doctor` reports about the device: name, architecture and count."""

    name: PlatformName
    device_name: str
    arch: str
    device_count: int


def current_platform() -> PlatformName:
    """``"rocm"`` on a HIP build with a visible GPU, ``"cuda"`` on CUDA with a GPU, else ``"cpu"``."""
    return platform_info().name


@functools.lru_cache(maxsize=1)
def platform_info() -> PlatformInfo:
    """Platform facts, computed once; never imports aiter or touches the GPU beyond device queries."""
    if not torch.cuda.is_available():
        return PlatformInfo("cpu", "cpu", "", 0)
    props = torch.cuda.get_device_properties(0)
    if torch.version.hip is not None:
        arch = getattr(props, "gcnArchName", "") or ""
        return PlatformInfo("rocm", props.name, arch.split(":")[0], torch.cuda.device_count())
    return PlatformInfo("cuda", props.name, f"sm_{props.major}{props.minor}", torch.cuda.device_count())
