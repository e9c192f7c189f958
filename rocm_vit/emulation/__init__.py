"""Emulation of ROCm on an NVIDIA GPU (``ROCM_VIT_EMULATE=rocm``), for tests and ``rocm-vit verify``.

``rocm_vit.platform`` reports ROCm when the variable is set on a CUDA machine, so every decision
(rotary, fused ops, attention backend and tiles, side stream, SGLang's aiter switch) is ROCm's;
``activate`` then supplies what a ROCm machine has and this one lacks: aiter, through a stand-in
with aiter's exact signature and argument checks (``aiter_standin``), computing with a real CUDA
varlen kernel. Never used where a real aiter can be imported.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def activate() -> None:
    """Make ``import aiter`` give the stand-in in this process (where no real aiter exists)."""
    from rocm_vit.emulation import aiter_standin

    logger.info("ROCm emulation: %s", aiter_standin.install())
