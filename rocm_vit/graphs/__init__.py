"""Exact-layout CUDA/HIP graphs for the vision tower's block stack, within a memory budget."""

from rocm_vit.graphs.admission import EAGER_REASONS
from rocm_vit.graphs.options import RunnerOptions
from rocm_vit.graphs.runner import ViTGraphRunner
from rocm_vit.graphs.store import default_budget_bytes
from rocm_vit.graphs.torch_graphs import CudaGraphs, GraphMechanism
from rocm_vit.settings import DEFAULT_CAPACITY, DEFAULT_MAX_TOKENS, DEFAULT_MIN_HITS

__all__ = [
    "DEFAULT_CAPACITY",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_MIN_HITS",
    "EAGER_REASONS",
    "CudaGraphs",
    "GraphMechanism",
    "RunnerOptions",
    "ViTGraphRunner",
    "default_budget_bytes",
]
