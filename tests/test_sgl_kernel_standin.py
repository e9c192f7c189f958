"""The ``sgl_kernel`` stand-in covers what SGLang imports on a CUDA torch, and refuses every call.

tests/sglang_support/cuda_imports.py --simulate-cuda imports SGLang's tower, ViT graph runner, model
runner, encode server and rocm-vit's plugin with CUDA simulated on this CPU (SGLang's branches are taken at import),
in a process of its own: every ``sgl_kernel`` import must be served by the stand-in, except the one
SGLang itself guards with a fallback.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

# Never imported here: importing SGLang patches Triton and transformers for the rest of the process
# (triton.next_power_of_2(0) becomes 1), and the doctor test checks SGLang stays unimported.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="sglang is not installed"),
]

SCRIPT = Path(__file__).resolve().parent / "sglang_support" / "cuda_imports.py"
# SGLang imports these inside try/except with a fallback of its own (layers/quantization/utils.py).
ALLOWED_ABSENT = {("sgl_kernel.scalar_type", ("ScalarType", "scalar_types"))}


def test_standin_serves_every_sgl_kernel_import_on_a_cuda_torch() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--simulate-cuda"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert "import_error" not in report and report["missing_modules"] == [], report
    assert report["is_cuda"] and report["sgl_kernel"] == "stand-in", report
    absent = {(error["module"], tuple(error["names"])) for error in report["sgl_kernel_import_errors"]}
    assert absent == ALLOWED_ABSENT, report["sgl_kernel_import_errors"]
    assert report["call"].startswith("sgl_kernel.silu_and_mul called: not available here"), report


# Run up to SGLang's parallel state with CUDA simulated: by then SGLang's tower module must import.
_UP_TO_INIT_WORLD = """
import runpy, sys
sys.path.insert(0, sys.argv[1])
import cuda_imports
cuda_imports._simulate_cuda()
from rocm_vit.integrations.sglang import standalone

def reached(*args, **kwargs):
    import sglang.srt.models.qwen3_vl
    raise SystemExit("reached init_world")

standalone.init_world = reached
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize(
    "script, arguments",
    [("prepare_scenario.py", ["--device", "cuda"]), ("fused_kernels.py", ["--attention", "triton_attn"])],
)
def test_gpu_scripts_put_the_standin_on_the_path_before_sglang_loads(tmp_path: Path, script: str, arguments) -> None:
    """The scripts GPU tests run in processes of their own import SGLang's tower on a CUDA torch."""
    support = SCRIPT.parent
    command = [sys.executable, "-c", _UP_TO_INIT_WORLD, str(support), str(support / script), str(tmp_path / "out")]
    done = subprocess.run([*command, *arguments], capture_output=True, text=True, timeout=300)
    assert done.stderr.strip().endswith("reached init_world"), done.stderr[-4000:]
