"""Platform detection and the ROCm emulation switch (``ROCM_VIT_EMULATE``), with torch's device queries faked."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

import rocm_vit.platform as platform_module
from rocm_vit.platform import EMULATE_ENV, PlatformInfo, emulated_rocm_arch, platform_info


@pytest.fixture(autouse=True)
def fresh_platform():
    platform_info.cache_clear()
    yield
    platform_info.cache_clear()


@pytest.fixture
def without_aiter(monkeypatch: pytest.MonkeyPatch):
    """No aiter module before the test, none left behind."""
    monkeypatch.delitem(sys.modules, "aiter", raising=False)
    yield
    sys.modules.pop("aiter", None)


def _fake_gpu(monkeypatch: pytest.MonkeyPatch, hip: str | None) -> None:
    props = SimpleNamespace(name="Fake GPU", major=9, minor=0, gcnArchName="gfx942:sramecc+:xnack-")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.version, "hip", hip)


@pytest.mark.parametrize(
    ("value", "arch"),
    [("", None), ("0", None), ("off", None), ("rocm", "gfx950"), ("ROCm:gfx942", "gfx942"), ("rocm:gfx950", "gfx950")],
)
def test_emulation_values(value: str, arch: str | None) -> None:
    assert emulated_rocm_arch(value) == arch


@pytest.mark.parametrize("value", ["1", "cuda", "rocm:gfx90a", "gfx950"])
def test_unknown_emulation_value_names_the_variable(value: str) -> None:
    with pytest.raises(ValueError, match=f"ROCM_VIT_EMULATE = {value!r} is not one of rocm, rocm:gfx942"):
        emulated_rocm_arch(value)


def test_nvidia_gpu_emulating_rocm_takes_rocm_decisions_and_gets_the_aiter_stand_in(
    monkeypatch: pytest.MonkeyPatch, without_aiter: None
) -> None:
    _fake_gpu(monkeypatch, hip=None)
    monkeypatch.setenv(EMULATE_ENV, "rocm")
    info = platform_info()
    assert info == PlatformInfo("rocm", "Fake GPU", "gfx950", 1, emulated_on="sm_90")
    assert platform_module.current_platform() == "rocm"
    import aiter

    assert aiter.ROCM_VIT_STANDIN is True


def test_without_the_switch_an_nvidia_gpu_is_cuda(monkeypatch: pytest.MonkeyPatch, without_aiter: None) -> None:
    _fake_gpu(monkeypatch, hip=None)
    monkeypatch.delenv(EMULATE_ENV, raising=False)
    assert platform_info() == PlatformInfo("cuda", "Fake GPU", "sm_90", 1)
    assert "aiter" not in sys.modules


def test_a_rocm_build_ignores_the_switch(monkeypatch: pytest.MonkeyPatch, without_aiter: None) -> None:
    _fake_gpu(monkeypatch, hip="7.0")
    monkeypatch.setenv(EMULATE_ENV, "rocm:gfx950")
    assert platform_info() == PlatformInfo("rocm", "Fake GPU", "gfx942", 1)
    assert "aiter" not in sys.modules


def test_emulation_without_a_gpu_stays_cpu(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv(EMULATE_ENV, "rocm")
    assert platform_info().name == "cpu"
    assert "no NVIDIA GPU is visible" in caplog.text
