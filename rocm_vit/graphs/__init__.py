"""Exact-layout CUDA/HIP graphs for the vision tower's block stack."""

from rocm_vit.graphs.capture import CudaGraphs, GraphMechanism
from rocm_vit.graphs.runner import EAGER_REASONS, ViTGraphRunner

__all__ = ["EAGER_REASONS", "CudaGraphs", "GraphMechanism", "ViTGraphRunner"]
