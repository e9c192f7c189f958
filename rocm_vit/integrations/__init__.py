"""Adapters that hook rocm-vit into serving frameworks; the only code that imports them."""
