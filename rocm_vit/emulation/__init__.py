"""Emulation of ROCm on an NVIDIA GPU (``ROCM_VIT_EMULATE=rocm``), for tests and ``rocm-vit verify``.

``activate`` supplies aiter through ``aiter_standin``; never where a real aiter can be imported.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def activate() -> None:
    """Make ``import aiter`` give the stand-in in this process (where no real aiter exists)."""
    from rocm_vit.emulation import aiter_standin

    logger.info("ROCm emulation: %s", aiter_standin.install())
