"""Launch arithmetic for the Triton wrappers, in plain Python.

Triton 3.5+ wraps ``triton.cdiv`` and ``triton.next_power_of_2`` as constexpr functions so kernels can
call them; called from the host they go through that wrapper's argument unwrapping. On the H200's
host (Triton 3.6) the rotary wrapper made seven such calls per launch and they were a fifth of its
host time (cProfile, docs/benchmarks.md sixth round); the eager tower launches ~110 Triton kernels
per forward. These are the same functions without the wrapper.
"""

from __future__ import annotations


def cdiv(numerator: int, denominator: int) -> int:
    """``ceil(numerator / denominator)`` for non-negative integers."""
    return -(-numerator // denominator)


def next_power_of_2(value: int) -> int:
    """The smallest power of two ``>= value`` (0 for 0), as ``triton.next_power_of_2``."""
    return 1 << (value - 1).bit_length() if value > 0 else 0
