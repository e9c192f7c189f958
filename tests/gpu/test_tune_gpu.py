"""``rocm-vit tune`` on the GPU: it measures everything the policy may choose, writes a profile this
device loads, and the tuned policy then drives a tower whose graph replay equals its eager run.

Runs in every GPU tier: natively, emulating ROCm (so the tune an MI355X user runs has run, aiter's
stand-in and the padded aiter included), and on an MI355X in ``make rocm-test``.
"""

from __future__ import annotations

import pytest
import torch

from rocm_vit.cli.main import main
from rocm_vit.models import preset, tower_class
from rocm_vit.platform import platform_info
from rocm_vit.policy import AUTO_CANDIDATES, backend_unavailable_reason, current_facts, current_policy, reset_policy
from rocm_vit.profile import profile_key, read_profile

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU (torch.cuda.is_available() is False)"
    ),
]


def test_tune_measures_every_choice_and_the_policy_loads_it(tmp_path, monkeypatch):
    out = tmp_path / "profile.yaml"
    args = ["tune", "--preset", "qwen3-vl-2b", "--out", str(out), "--rep-ms", "10", "--repeats", "3"]
    assert main(args) == 0
    profile = read_profile(out)
    facts = current_facts()
    assert profile.key == profile_key(platform_info())
    runnable = {name for name in AUTO_CANDIDATES[facts.platform] if backend_unavailable_reason(name, facts) is None}
    assert runnable >= {"sdpa", "triton_attn"}
    for timing in profile.attention:
        assert set(timing.ms) == runnable and all(ms > 0 for ms in timing.ms.values()), timing
    assert set(profile.rotary_ms) == {"triton", "compiled"}  # timed inside the tower
    assert all(ms > 0 for ms in profile.rotary_ms.values())
    assert set(profile.fused_ops_ms) == {"fused", "plain"}
    assert len(profile.graphs) == 9 and all(row.eager_ms > 0 and row.graph_ms > 0 for row in profile.graphs)

    monkeypatch.setenv("ROCM_VIT_PROFILE", str(out))
    reset_policy()
    policy = current_policy()
    assert policy.profile.value is not None and policy.attention.backend == "auto"
    assert policy.graph_cost.reason.startswith("tuned"), policy.graph_cost
    assert policy.rotary.reason.startswith("tuned"), policy.rotary

    config = preset("qwen3-vl-2b", depth=2, deepstack_visual_indexes=[0])
    torch.manual_seed(0)
    tower = tower_class(config)(config).to(device="cuda", dtype=torch.bfloat16).eval()
    tower.enable_graphs(min_hits=1, max_tokens=65536, by_benefit=False)
    width = config.in_channels * config.temporal_patch_size * config.patch_size**2
    for grid in ([(1, 16, 16)], [(1, 64, 64)], [(1, 16, 16), (1, 32, 48), (1, 8, 8)]):
        patches = sum(t * h * w for t, h, w in grid)
        pixels = torch.randn(patches, width, device="cuda", dtype=torch.bfloat16)
        with torch.inference_mode():
            eager = tower(pixels, grid, use_graphs=False)
            assert torch.equal(tower(pixels, grid), eager), grid
