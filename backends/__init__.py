"""Leaf kernel adapters shipped as ``rocm_vit.backends``.

Each module imports torch, triton or aiter only, never the rest of rocm_vit (DESIGN.md, Layers).
"""
