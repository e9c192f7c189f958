"""Imports point down only (docs/design.md, "Layers"): checked on every module's top-level imports.

Imports inside functions (lazy, to keep heavy or optional modules out of ``import rocm_vit``) and
under ``TYPE_CHECKING`` do not count: they run after every module is loaded.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Lowest first; a module may import its own layer and any below. Longest prefix wins.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("backends", "rocm_vit.backends", "rocm_vit.version", "rocm_vit"),
    ("rocm_vit.platform", "rocm_vit.emulation"),
    ("rocm_vit.profile", "rocm_vit.settings"),
    ("rocm_vit.layout", "rocm_vit.tower_config"),
    ("rocm_vit.graphs",),
    ("rocm_vit.backend_requirements", "rocm_vit.policy"),
    ("rocm_vit.attention", "rocm_vit.rotary", "rocm_vit.fusion"),
    ("rocm_vit.models",),
    ("rocm_vit.integrations",),
    ("rocm_vit.workloads",),
    ("rocm_vit.report",),
    ("rocm_vit.cli", "rocm_vit.__main__"),
)


def _layer(module: str) -> int:
    matches = [
        (len(prefix), rank)
        for rank, prefixes in enumerate(LAYERS)
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    assert matches, f"{module} is in no layer: add it to LAYERS and to docs/design.md"
    return max(matches)[1]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _top_level_imports(path: Path) -> set[str]:
    imported = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for inner in ast.walk(node) if isinstance(node, (ast.Import, ast.ImportFrom, ast.If, ast.Try)) else ():
            if isinstance(inner, ast.Import):
                imported.update(alias.name for alias in inner.names)
            elif isinstance(inner, ast.ImportFrom) and inner.level == 0 and inner.module:
                imported.add(inner.module)
    return {name for name in imported if name.split(".")[0] in ("rocm_vit", "backends")}


MODULES = sorted([*(ROOT / "rocm_vit").rglob("*.py"), *(ROOT / "backends").rglob("*.py")])


@pytest.mark.parametrize("path", MODULES, ids=[_module_name(path) for path in MODULES])
def test_a_module_imports_only_its_own_layer_and_those_below(path: Path) -> None:
    module = _module_name(path)
    upward = sorted(name for name in _top_level_imports(path) if _layer(name) > _layer(module))
    assert upward == [], f"{module} (layer {_layer(module)}) imports upward: {upward}"


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    source = tmp_path / "policy.py"
    source.write_text("from rocm_vit.models import preset\nif TYPE_CHECKING:\n    import rocm_vit.cli\n")
    assert _top_level_imports(source) == {"rocm_vit.models"}
    assert _layer("rocm_vit.models") > _layer("rocm_vit.policy")


def _sglang_imports(path: Path) -> list[str]:
    """Every ``sglang`` import in ``path``, inside functions too."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        found += [f"{path.name}:{node.lineno} {name}" for name in names if name.split(".")[0] == "sglang"]
    return found


def test_only_the_sglang_adapter_imports_sglang_even_lazily() -> None:
    """The core never knows SGLang exists (docs/design.md, "Layers"): a lazy import counts too."""
    adapter = ROOT / "rocm_vit" / "integrations" / "sglang"
    outside = [found for path in MODULES if adapter not in path.parents for found in _sglang_imports(path)]
    assert outside == []
    assert _sglang_imports(adapter / "standalone.py"), "the check must see the adapter's own lazy imports"
