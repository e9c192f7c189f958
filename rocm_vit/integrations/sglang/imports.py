"""Patch a module when it is imported, and replace its attributes where SGLang bound them.

Invariant: a hook never imports its module (most SGLang processes run no encoder); it applies at once
or right after the import, before a later ``from module import name`` can copy the old binding.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

# Only SGLang's modules are rebound: the graph runner adapter delegates to SGLang's originals.
_REBIND_PREFIX = "sglang."

_lock = threading.Lock()
_originals: dict[str, Any] = {}
_finder: _PostImportFinder | None = None


def when_imported(module_name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call ``callback(module)`` now or right after its import; it runs inside the importer's
    ``import`` statement, so it must not raise."""
    module = sys.modules.get(module_name)
    if module is not None:
        callback(module)
        return
    with _lock:
        _post_import_finder().add(module_name, callback)


def replace_attribute(owner: ModuleType | type, name: str, replacement: Any, *, rebind: bool = True) -> None:
    """Set ``owner.name = replacement``, remembering the original; with ``rebind``, SGLang's
    module-level references (``from`` imports, tables) follow too."""
    current = getattr(owner, name)
    _originals.setdefault(_key(owner, name), current)
    setattr(owner, name, replacement)
    if rebind and isinstance(owner, ModuleType):
        _rebind(current, replacement)


def original(module_name: str, name: str) -> Any:
    """What ``module_name.name`` was before ``replace_attribute`` (the current value if never replaced)."""
    module = importlib.import_module(module_name)
    return _originals.get(_key(module, name), getattr(module, name))


def pending() -> Sequence[str]:
    """Modules with callbacks still waiting for their import."""
    with _lock:
        return () if _finder is None else tuple(_finder.callbacks)


def _key(owner: ModuleType | type, name: str) -> str:
    prefix = owner.__name__ if isinstance(owner, ModuleType) else f"{owner.__module__}.{owner.__qualname__}"
    return f"{prefix}.{name}"


def _rebind(current: Any, replacement: Any) -> None:
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith(_REBIND_PREFIX) or not isinstance(module, ModuleType):
            continue
        for attribute, value in list(vars(module).items()):
            if value is current:
                setattr(module, attribute, replacement)
            elif isinstance(value, dict):
                # The stored entries only: transformers' lazy mappings import every config when iterated.
                for key, entry in list(dict.items(value)):
                    if entry is current:
                        value[key] = replacement


def _post_import_finder() -> _PostImportFinder:
    global _finder
    if _finder is None:
        _finder = _PostImportFinder()
        sys.meta_path.insert(0, _finder)
    return _finder


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds watched modules through the other finders and wraps their loader to run callbacks."""

    def __init__(self) -> None:
        self.callbacks: dict[str, list[Callable[[ModuleType], None]]] = {}

    def add(self, module_name: str, callback: Callable[[ModuleType], None]) -> None:
        self.callbacks.setdefault(module_name, []).append(callback)

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.callbacks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        with _lock:
            callbacks = self.callbacks.pop(fullname, [])
        spec.loader = _CallbackLoader(spec.loader, callbacks)
        return spec


class _CallbackLoader(importlib.abc.Loader):
    """Runs the real loader, then the callbacks; everything else is the real loader's."""

    def __init__(self, loader: importlib.abc.Loader, callbacks: list[Callable[[ModuleType], None]]) -> None:
        self._loader = loader
        self._callbacks = callbacks

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        for callback in self._callbacks:
            callback(module)

    def __getattr__(self, name: str) -> Any:
        # get_source (tracebacks, inspect), get_resource_reader, is_package, ...
        return getattr(self._loader, name)
