"""Exact-layout CUDA/HIP graphs for the vision tower's block stack, within a memory budget."""

from rocm_vit.graphs.capture import CudaGraphs, GraphMechanism
from rocm_vit.graphs.runner import (
    DEFAULT_CAPACITY,
    DEFAULT_MAX_TOKENS,
    DEFAULT_MIN_HITS,
    EAGER_REASONS,
    ViTGraphRunner,
    default_budget_bytes,
)

__all__ = [
    "DEFAULT_CAPACITY",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_MIN_HITS",
    "EAGER_REASONS",
    "CudaGraphs",
    "GraphMechanism",
    "ViTGraphRunner",
    "default_budget_bytes",
]
