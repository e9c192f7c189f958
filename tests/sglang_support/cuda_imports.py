"""Import what the SGLang GPU tests and ``bench-sglang`` import, as on a CUDA torch; prints a summary
line, then one JSON line.

``python cuda_imports.py`` on a GPU machine (after ci/cuda.sh's wheelhouse install): names every
module the image lacks in one go, not only the first (each missing one is stubbed and the import
retried), so one run says what the wheelhouse must add (ci/requirements-sglang-gpu.txt).

``--simulate-cuda`` on a CPU (tests/test_sgl_kernel_standin.py): SGLang decides its branches at import
time from ``torch.cuda.is_available()`` and ``torch.version.cuda``, so both are simulated (and the
device queries its platform probe makes, as an H100 answers them) before SGLang loads; nothing runs
on a device. Either way the ``sgl_kernel`` stand-in is on the path where the package is missing, and
every ``sgl_kernel`` import it cannot serve is recorded, also where SGLang catches the ImportError.
"""

from __future__ import annotations

import argparse
import builtins
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.append(str(HERE))  # the torchvision stand-in, after any real one
sys.path.insert(0, str(HERE.parents[1]))  # this checkout's rocm_vit

import torch  # noqa: E402

# What the scenario, the benchmark worker and rocm-vit's plugin import on a GPU.
MODULES = (
    "sglang.srt.models.qwen3_vl",
    "sglang.srt.multimodal.vit_cuda_graph_runner",
    "sglang.srt.plugins",
    "sglang.srt.runtime_context",
    "sglang.srt.server_args",
    "sglang.srt.distributed.parallel_state",
    "sglang.srt.model_executor.model_runner",
    "sglang.srt.disaggregation.encoder.server",
    "rocm_vit.integrations.sglang",
)
# Never stubbed: a failure in these is the finding itself.
_OWN = ("sglang", "rocm_vit", "sgl_kernel", "torch", "triton")


def _simulate_cuda() -> None:
    properties = types.SimpleNamespace(
        name="NVIDIA H100 80GB HBM3", major=9, minor=0, total_memory=80 << 30, multi_processor_count=132
    )
    torch.cuda.is_available = lambda: True
    torch.version.cuda = "13.0"
    torch.cuda.device_count = lambda: 1
    torch.cuda.current_device = lambda: 0
    torch.cuda.get_device_name = lambda *args, **kwargs: properties.name
    torch.cuda.get_device_capability = lambda *args, **kwargs: (properties.major, properties.minor)
    torch.cuda.get_device_properties = lambda *args, **kwargs: properties


def _record_sgl_kernel_import_errors() -> list[dict[str, Any]]:
    errors: list[dict[str, Any]] = []
    original = builtins.__import__

    def recording(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        try:
            return original(name, globals, locals, fromlist, level)
        except ImportError:
            entry = {"module": name, "names": list(fromlist or ()), "by": (globals or {}).get("__name__")}
            if level == 0 and name.split(".")[0] == "sgl_kernel" and entry not in errors:
                errors.append(entry)
            raise

    builtins.__import__ = recording
    return errors


class _AnythingMeta(type):
    """Whatever is asked of a stubbed module's names answers with the name again."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return cls

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls

    def __getitem__(cls, item: Any) -> Any:
        return cls


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _AnythingMeta(name, (), {})


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves the missing top-level modules found so far (and anything under them) as stubs."""

    def __init__(self) -> None:
        self.missing: list[str] = []

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.split(".")[0] in self.missing:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _import_all(report: dict[str, Any]) -> None:
    """Import ``MODULES``; each missing third-party module is recorded and stubbed, then again."""
    stubs = _StubFinder()
    sys.meta_path.insert(0, stubs)  # serves only the names that failed to import
    report["missing_modules"] = stubs.missing
    for _ in range(40):
        try:
            for module in MODULES:
                importlib.import_module(module)
            import rocm_vit.integrations.sglang as plugin

            plugin.load()
            return
        except ModuleNotFoundError as error:
            top = (error.name or "").split(".")[0]
            if not top or top in _OWN or top in stubs.missing:
                report["import_error"] = f"{type(error).__name__}: {error}"
                return
            stubs.missing.append(top)
            # A failed package import leaves its imported submodules behind: start those over.
            for name in [name for name in sys.modules if name.split(".")[0] in _OWN[:3]]:
                del sys.modules[name]
        except Exception as error:  # what the GPU machine would see
            report["import_error"] = f"{type(error).__name__}: {error}"
            return


def _versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": sys.version.split()[0]}
    for name in ("torch", "triton", "transformers", "huggingface_hub", "sglang", "pydantic", "torchvision"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--simulate-cuda", action="store_true", help="take SGLang's CUDA branches on a CPU")
    args = parser.parse_args()
    if args.simulate_cuda:
        _simulate_cuda()
    report: dict[str, Any] = {"versions": _versions(), "cuda": bool(torch.version.cuda)}
    report["sgl_kernel"] = "installed" if importlib.util.find_spec("sgl_kernel") else "stand-in"
    if report["sgl_kernel"] == "stand-in":
        sys.path.insert(0, str(HERE / "sgl_kernel_standin"))
    errors = _record_sgl_kernel_import_errors()
    _import_all(report)
    report["sgl_kernel_import_errors"] = errors
    activation = sys.modules.get("sglang.srt.layers.activation")
    report["is_cuda"] = bool(getattr(activation, "_is_cuda", False))
    if report["sgl_kernel"] == "stand-in" and activation is not None and hasattr(activation, "_sgl_silu_and_mul"):
        try:
            activation._sgl_silu_and_mul(torch.zeros(2, 4))
        except RuntimeError as error:
            report["call"] = str(error)
    if report["missing_modules"]:
        summary = (
            f"MISSING MODULES: {' '.join(report['missing_modules'])} (add their wheels: ci/requirements-sglang-gpu.txt)"
        )
    else:
        summary = "no module missing"
    print(f"SGLang imports: {summary}; {report.get('import_error') or 'imported'}; sgl_kernel {report['sgl_kernel']}")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
