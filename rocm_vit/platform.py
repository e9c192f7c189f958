"""Which accelerator this process runs on: ROCm, CUDA or CPU, decided from torch alone.

``ROCM_VIT_EMULATE=rocm[:gfxNNN]`` on an NVIDIA GPU takes every decision a ROCm machine takes while the
kernels run on the NVIDIA GPU (docs/rocm.md).
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from typing import Literal

import torch

logger = logging.getLogger(__name__)

PlatformName = Literal["rocm", "cuda", "cpu"]

EMULATE_ENV = "ROCM_VIT_EMULATE"
# What ``ROCM_VIT_EMULATE=rocm`` emulates: the MI355X, rocm-vit's target.
DEFAULT_EMULATED_ARCH = "gfx950"
EMULATED_ARCHS = ("gfx942", "gfx950")


@dataclass(frozen=True)
class Facts:
    """What the machine offers, gathered once: what the policy decides from besides settings, and
    what each backend's requirements are checked against."""

    platform: PlatformName
    arch: str = ""
    device_name: str = ""
    emulated_on: str = ""
    modules: frozenset[str] = frozenset()
    triton_interpret: bool = False
    gelu_epilogue_op: bool = True  # torch._addmm_activation exists (private, so checked)
    capability: tuple[int, int] | None = None  # CUDA compute capability, from arch ("sm_90" -> (9, 0))


@dataclass(frozen=True)
class PlatformInfo:
    """The device's name, arch and count; ``emulated_on``: the real NVIDIA arch under emulation, else ``""``."""

    name: PlatformName
    device_name: str
    arch: str
    device_count: int
    emulated_on: str = ""


def current_platform() -> PlatformName:
    """``"rocm"`` on a HIP build with a visible GPU (or emulated), ``"cuda"`` on CUDA with a GPU, else ``"cpu"``."""
    return platform_info().name


@functools.lru_cache(maxsize=1)
def platform_info() -> PlatformInfo:
    """Platform facts, computed once; never imports aiter. ``ValueError`` for a bad ``ROCM_VIT_EMULATE``."""
    emulated_arch = emulated_rocm_arch(os.environ.get(EMULATE_ENV, ""))
    if not torch.cuda.is_available():
        if emulated_arch:
            logger.warning("%s is set but no NVIDIA GPU is visible: nothing to emulate ROCm on", EMULATE_ENV)
        return PlatformInfo("cpu", "cpu", "", 0)
    props = torch.cuda.get_device_properties(0)
    if torch.version.hip is not None:
        if emulated_arch:
            logger.info("%s is ignored: this is a ROCm build already", EMULATE_ENV)
        arch = getattr(props, "gcnArchName", "") or ""
        return PlatformInfo("rocm", props.name, arch.split(":")[0], torch.cuda.device_count())
    native_arch = f"sm_{props.major}{props.minor}"
    if emulated_arch:
        from rocm_vit.emulation import activate

        activate()
        logger.warning(
            "emulating ROCm (%s) on %s (%s): for tests and verify, not for serving",
            emulated_arch,
            props.name,
            native_arch,
        )
        return PlatformInfo("rocm", props.name, emulated_arch, torch.cuda.device_count(), emulated_on=native_arch)
    return PlatformInfo("cuda", props.name, native_arch, torch.cuda.device_count())


def emulated_rocm_arch(value: str) -> str | None:
    """The AMD arch ``ROCM_VIT_EMULATE=value`` asks for, or ``None`` when emulation is off."""
    text = value.strip().lower()
    if text in ("", "0", "off", "false", "none"):
        return None
    name, _, arch = text.partition(":")
    arch = arch or DEFAULT_EMULATED_ARCH
    if name != "rocm" or arch not in EMULATED_ARCHS:
        choices = ", ".join(["rocm", *(f"rocm:{a}" for a in EMULATED_ARCHS)])
        raise ValueError(f"{EMULATE_ENV} = {value!r} is not one of {choices} (or empty/0 for off)")
    return arch
