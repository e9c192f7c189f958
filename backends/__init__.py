"""Leaf kernel adapters shipped as ``rocm_vit.backends``.

Each module imports torch, triton or aiter only, never the rest of rocm_vit: the layers
above depend on these kernels, never the other way round.
"""
