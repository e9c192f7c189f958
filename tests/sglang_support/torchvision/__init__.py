"""A stand-in ``torchvision`` for the CPU suite's SGLang tests; never installed, never shipped.

PyPI's torchvision wheels are CUDA builds: beside the CPU torch their ``_C`` extension does not load
and ``import torchvision`` raises, so they cannot be installed into the CPU venv (transformers would
import them too). SGLang 0.5.23 imports torchvision at module level on the way to the vision tower
(``sglang.srt.multimodal.internvl_utils``, ``configs.deepseek_ocr``, the Qwen-VL processors) but
the tower itself never calls it. tests/sglang_support/scenario.py appends this folder's parent to
``sys.path`` (after site-packages, so a working torchvision wins); every ``torchvision.*`` module
and attribute is then a placeholder.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any


class _Placeholder:
    """Stands for any torchvision object: attributes, calls and indexing give more placeholders."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> _Placeholder:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder()

    def __call__(self, *args: Any, **kwargs: Any) -> _Placeholder:
        return _Placeholder()

    def __getitem__(self, key: Any) -> _Placeholder:
        return _Placeholder()


def _module_getattr(name: str) -> _Placeholder:
    if name.startswith("__"):
        raise AttributeError(name)
    return _Placeholder()


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes every ``torchvision.<sub>`` import succeed with a placeholder package."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(f"{__name__}."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _module_getattr
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


__version__ = "0.0.0+rocm-vit-test-stub"
__getattr__ = _module_getattr
sys.meta_path.append(_StubFinder())
