"""rocm-vit: Qwen3-VL-family vision encoders, fast and exact under HIP/CUDA graphs."""

import importlib.util
import sys
from pathlib import Path

from rocm_vit.version import __version__ as __version__


def _alias_checkout_backends() -> None:
    """Register the checkout's top-level ``backends/`` as ``rocm_vit.backends``, as the wheel maps it."""
    package_dir = Path(__file__).resolve().parent
    if (package_dir / "backends").is_dir() or "rocm_vit.backends" in sys.modules:
        return
    checkout_backends = package_dir.parent / "backends"
    if not (checkout_backends / "__init__.py").is_file():
        return
    spec = importlib.util.spec_from_file_location(
        "rocm_vit.backends",
        checkout_backends / "__init__.py",
        submodule_search_locations=[str(checkout_backends)],
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["rocm_vit.backends"] = module
    spec.loader.exec_module(module)


_alias_checkout_backends()
