"""Environment variables set for a block and put back after it, for the test scripts that run as
processes of their own (``aot_rocm.py``, ``sglang_support/``), where pytest's ``monkeypatch`` is not."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping


@contextlib.contextmanager
def set_env(variables: Mapping[str, str]) -> Iterator[None]:
    """``variables`` set in ``os.environ`` for the block, each put back as it was after it."""
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
