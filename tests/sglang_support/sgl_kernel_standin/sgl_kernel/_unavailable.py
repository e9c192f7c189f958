"""The one kind of object the ``sgl_kernel`` stand-in holds: a function that refuses to run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn


def unavailable(module: str, name: str) -> Callable[..., NoReturn]:
    """``module.name`` as a function that raises ``RuntimeError`` naming itself when called."""
    qualified = f"{module}.{name}"

    def call(*args: Any, **kwargs: Any) -> NoReturn:
        raise RuntimeError(f"{qualified} called: not available here (test stand-in for sgl_kernel)")

    call.__name__ = call.__qualname__ = name
    call.__module__ = module
    return call
