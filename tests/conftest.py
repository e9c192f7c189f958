"""Shared fixtures. GPU-marked tests skip, with the reason, where no GPU is visible."""

from __future__ import annotations

import os

import pytest
import torch
from gpu_deadline import deadline, gpu_test_timeout_s

# Without a GPU, one intra-op thread here and in the tests' subprocesses: the CPU suite's tensors are
# small, and on a machine of few cores shared with the suite's own subprocesses torch's threads spin
# against each other (a tiny tower's test took 44 s with two threads on a busy 2-core machine, 2 s
# with one). The GPU tiers keep torch's default for their CPU references.
if not torch.cuda.is_available():
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


# The files that take longest on a 2-core CPU (seconds in `make test`, measured there: the fused-blocks
# scenario 62-96, the TP layouts 95-130 in all, a Gluon compile for sm_90a 60-103, the ROCm compile 35-54, the two
# SGLang benchmarks 23, the all-reduce pairings 23, the compile-count scenario 20, the plugin's load
# 19, the tail split's merge 13). They are collected first and ci/cpu.sh hands files out in that
# order (each worker starts with two), so the pytest workers do not end with one of them alone.
LONGEST_FIRST = (
    "test_sglang_parallel.py",
    "test_sglang_fused_blocks.py",
    "test_gluon_attn.py",
    "test_aot_rocm.py",
    "test_bench_sglang.py",
    "test_all_reduce_pairing.py",
    "test_compiles_after_start.py",
    "test_sglang_plugin.py",
    "test_tail_split.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA or ROCm GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords or "rocm" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def gpu_deadline(request):
    """GPU tests end the run with tracebacks after ``gpu_test_timeout_s()`` (tests/gpu_deadline.py)."""
    if "gpu" in request.keywords or "rocm" in request.keywords:
        with deadline(gpu_test_timeout_s()):
            yield
    else:
        yield


@pytest.fixture
def generator() -> torch.Generator:
    """A seeded CPU generator: fresh random inputs, reproducible failures."""
    return torch.Generator().manual_seed(1234)


@pytest.fixture(autouse=True)
def fresh_policy(monkeypatch):
    """Each test resolves the policy from its own environment (monkeypatched variables and modules)
    and ignores any profile ``rocm-vit tune`` left in the user's cache, unless it names one."""
    from rocm_vit.policy import reset_policy

    if "ROCM_VIT_PROFILE" not in os.environ:
        monkeypatch.setenv("ROCM_VIT_PROFILE", "off")
    reset_policy()
    yield
    reset_policy()


@pytest.fixture
def fake_platform(monkeypatch):
    """``fake_platform(name, device_name, arch)``: the policy sees this platform when it is next
    resolved (no GPU is touched); returns the ``PlatformInfo`` it reports."""
    from rocm_vit import policy
    from rocm_vit.platform import PlatformInfo

    def pretend(name: str, device_name: str = "fake", arch: str = "") -> PlatformInfo:
        info = PlatformInfo(name, device_name, arch, int(name != "cpu"))
        monkeypatch.setattr(policy, "platform_info", lambda: info)
        return info

    return pretend
