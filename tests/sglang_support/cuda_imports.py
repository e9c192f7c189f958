"""SGLang's modules imported as on a CUDA torch, on a CPU, with the ``sgl_kernel`` stand-in; prints JSON.

Run by tests/test_sgl_kernel_standin.py as ``python cuda_imports.py``. SGLang decides its branches at
import time from ``torch.cuda.is_available()`` and ``torch.version.cuda``, so both are simulated (and
the device queries its platform probe makes, as an H100 answers them) before SGLang loads; nothing
runs on a device. Every ``sgl_kernel`` name SGLang asks for that the stand-in lacks is recorded, also
where SGLang catches the ImportError, with the module that asked: the stand-in must leave out only
those SGLang imports inside ``try`` (``ALLOWED_ABSENT``).
"""

from __future__ import annotations

import builtins
import json
import sys
import types
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "sgl_kernel_standin"))
sys.path.append(str(HERE))  # the torchvision stand-in, after any real one

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
)


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
            if level == 0 and name.split(".")[0] == "sgl_kernel":
                errors.append({"module": name, "names": list(fromlist or ()), "by": (globals or {}).get("__name__")})
            raise

    builtins.__import__ = recording
    return errors


def main() -> None:
    _simulate_cuda()
    errors = _record_sgl_kernel_import_errors()
    report: dict[str, Any] = {}
    try:
        for module in MODULES:
            __import__(module)
        import rocm_vit.integrations.sglang as plugin

        plugin.load()
    except Exception as error:  # what the GPU machine would see
        report["import_error"] = f"{type(error).__name__}: {error}"
    import sgl_kernel
    import sglang.srt.layers.activation as activation

    report["is_cuda"] = bool(getattr(activation, "_is_cuda", False))
    report["standin"] = getattr(sgl_kernel, "STANDIN", False)
    report["import_errors"] = errors
    try:
        activation._sgl_silu_and_mul(torch.zeros(2, 4))
    except RuntimeError as error:
        report["call"] = str(error)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
