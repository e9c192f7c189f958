"""``rocm-vit bench-sglang``'s own-tower configurations on a GPU: rocm-vit's tower on SGLang's weights,
with c's kernel (SGLang's Triton ``context_attention_fwd``) and with d's (the plugin's ``aiter_attn``
pick, ROCm emulated), served by real graphs equal to its eager forward bit for bit, and broken down
with the attention kernel in the attention class. The worker runs as ``bench-sglang`` runs it, in a
process of its own; skips where SGLang is not installed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

from rocm_vit.cli.bench_sglang import CONFIGS, worker_command, worker_environ

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("key", ["o", "r"])
def test_own_tower_graphs_equal_its_eager_forward_with_its_twins_attention_kernel(tmp_path: Path, key: str) -> None:
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("sglang is not installed in this environment (pip install 'rocm-vit[sglang]')")
    out = tmp_path / "report.json"
    args = argparse.Namespace(preset="tiny", layouts="1x64,2x96,1x224", seed=0, stream_max_pixels=None, breakdown=True)
    command = worker_command(key, CONFIGS[key], "cuda", args, 2, 0, out, 600)
    env = {**worker_environ(CONFIGS[key]), "ROCM_VIT_PROFILE": "off"}  # a tuned profile would move the padding
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    report = json.loads(out.read_text()) if out.exists() else {}
    assert done.returncode == 0 and "error" not in report, report.get("traceback", done.stderr[-4000:])
    twin_kernel = {"o": "sglang_triton_attn", "r": "aiter_attn"}[key]
    assert report["backend"] == twin_kernel
    layouts = report["layouts"]
    assert layouts["start"]["captured"] > 0 and layouts["replays"] > 0  # graphs served calls
    for row in layouts["rows"]:
        assert row["bitwise_equal"], row
        # The tiny tower's outputs reach ~1: other weights would differ by that much, bf16 rounding far less.
        assert row["max_difference_from_sglang_eager"] < 0.25, row
        assert row["breakdown"]["attention"] > 0 and row["breakdown"]["kernels"] > 0, row
