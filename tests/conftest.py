"""Shared fixtures. GPU-marked tests skip, with the reason, where no GPU is visible."""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA or ROCm GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords or "rocm" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def generator() -> torch.Generator:
    """A seeded CPU generator: fresh random inputs, reproducible failures."""
    return torch.Generator().manual_seed(1234)
