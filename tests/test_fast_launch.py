"""backends/fast_launch.py on a CPU: its signature key against Triton's own specialisation, and the
cache's contract with a stand-in for the compiled kernel (no GPU driver here to launch a real one).

The stand-in models what ``FastLaunch`` relies on: ``kernel[grid](...)`` runs ``JITFunction.run`` and
returns the compiled kernel, whose ``run`` launcher takes ``(grid x3, stream, function, packed
metadata, launch metadata, enter hook, exit hook, *args)``; ``device_caches[device][3]`` is the
backend. tests/gpu/test_fast_launch_gpu.py checks the same against Triton on a GPU.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import triton
import triton.language as tl
from rocm_vit.backends import fast_launch
from rocm_vit.backends.fast_launch import FastLaunch, fast_launch_supported, signature_key
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend

_KINDS = {"specialised": 1, "do_not_specialize": 2}


def _values() -> list:
    """Arguments of every kind a launch passes: ints around each specialisation edge, bools, floats,
    None, tensors of three dtypes at 16-byte aligned and unaligned addresses."""
    ints = [
        0,
        1,
        2,
        15,
        16,
        17,
        32,
        2**31 - 16,
        2**31 - 1,
        2**31,
        2**31 + 16,
        2**63 - 16,
        2**63,
        -1,
        -16,
        -(2**31) - 16,
    ]
    buffer = torch.empty(64, dtype=torch.float32)
    tensors = [buffer, buffer[1:], buffer[4:], buffer.to(torch.bfloat16), buffer.to(torch.bfloat16)[1:]]
    tensors += [buffer.to(torch.bfloat16)[8:], buffer.to(torch.int32)]
    return [*ints, True, False, 0.5, 1.0, None, *tensors]


def _backends() -> list:
    """NVIDIA's (the base class's pointer specialisation) and AMD's, which also specialises a pointer
    on a storage within 2 GiB (buffer ops)."""
    from triton.backends.amd.compiler import HIPBackend

    return [BaseBackend, HIPBackend]


@pytest.mark.parametrize("kind", list(_KINDS))
@pytest.mark.parametrize("aligned", [True, False])
@pytest.mark.parametrize("backend", _backends(), ids=["cuda", "hip"])
def test_equal_keys_mean_equal_triton_specialisations(kind: str, aligned: bool, backend) -> None:
    """Two arguments with one key get one specialisation from Triton's binder (native_specialize_impl):
    a hit never launches a kernel compiled for other arguments."""
    specialise = kind == "specialised"
    # A storage over 2 GiB (reserved, never touched: no memory is committed).
    values = [*_values(), torch.empty(2**29 + 16, dtype=torch.float32)]
    for first, second in itertools.combinations(values, 2):
        keys = [
            signature_key([_KINDS[kind]], [aligned], backend.get_tensor_specialization, 0, [value])
            for value in (first, second)
        ]
        if keys[0] == keys[1]:
            specs = [native_specialize_impl(backend, value, False, specialise, aligned) for value in (first, second)]
            assert specs[0] == specs[1], (first, second, keys[0])


def test_constexprs_and_devices_are_keyed_by_value() -> None:
    spec = BaseBackend.get_tensor_specialization
    assert signature_key([0], [True], spec, 0, [64]) != signature_key([0], [True], spec, 0, [128])
    assert signature_key([0], [True], spec, 0, ["ieee"]) != signature_key([0], [True], spec, 0, [None])
    assert signature_key([1], [True], spec, 0, [16]) != signature_key([1], [True], spec, 1, [16])


def test_an_argument_of_another_kind_has_no_key() -> None:
    assert signature_key([1], [True], BaseBackend.get_tensor_specialization, 0, [object()]) is None


@triton.jit(do_not_specialize=["width"])
def _copy_kernel(src_ptr, dst_ptr, n, width, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(dst_ptr + offsets, tl.load(src_ptr + offsets, mask=offsets < n), mask=offsets < n)


def test_compiled_kernels_under_a_known_triton_take_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    from triton.runtime.interpreter import InterpretedFunction

    assert fast_launch_supported(_copy_kernel)
    assert not fast_launch_supported(InterpretedFunction(_copy_kernel.fn))  # TRITON_INTERPRET=1's kernels
    for version in ("3.5.1", "3.10.0"):
        monkeypatch.setattr(triton, "__version__", version)
        assert not fast_launch_supported(_copy_kernel)


class _Compiled:
    """A compiled kernel: its launcher records each launch."""

    def __init__(self, launches: list) -> None:
        self.function, self.packed_metadata = 0xF00, (4, 1, 0)
        self.run = lambda *launch: launches.append(("direct", launch))


class _StandInKernel:
    """``_copy_kernel`` as ``FastLaunch`` sees it: its real params; ``[grid]`` goes through run."""

    def __init__(self) -> None:
        self.params = _copy_kernel.params
        self.launches: list = []
        self.compiled: dict = {}
        self.device_caches = {0: ({}, {}, None, BaseBackend, None)}

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.launches.append(("run", grid, args, kwargs))
            return self.run(*args, grid=grid, warmup=False, **kwargs)

        return run

    def run(self, *args, grid, warmup, **kwargs):
        key = signature_key(
            [1, 1, 1, 2, 0], [True] * 5, BaseBackend.get_tensor_specialization, 0, [*args, kwargs["BLOCK"]]
        )
        return self.compiled.setdefault(key, _Compiled(self.launches))


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> tuple[FastLaunch, _StandInKernel]:
    kernel = _StandInKernel()
    monkeypatch.setattr(fast_launch, "_driver_fns", lambda: (lambda: 0, lambda device: 77))  # device 0, stream 77
    fast = FastLaunch(kernel, {"num_warps": 4})
    fast.enabled = True  # the stand-in is no JITFunction
    return fast, kernel


def test_a_repeated_signature_launches_the_kept_kernel_with_pointers(stand_in) -> None:
    fast, kernel = stand_in
    src, dst = torch.empty(64), torch.empty(64)
    fast((2,), src, dst, 40, 3, 64)
    # The first launch goes through run, constexprs by name as the wrappers passed them.
    assert kernel.launches == [("run", (2,), (src, dst, 40, 3), {"BLOCK": 64, "num_warps": 4})]
    other_src, other_dst = torch.empty(128), torch.empty(128)
    fast((5, 2), other_src, other_dst, 8, 7, 64)  # other addresses, both 16-byte aligned; 8 % 16 != 0 as 40
    assert kernel.launches[1] == (
        "direct",
        (5, 2, 1, 77, 0xF00, (4, 1, 0), None, None, None, other_src.data_ptr(), other_dst.data_ptr(), 8, 7, 64),
    )


@pytest.mark.parametrize(
    "change",
    ["unaligned pointer", "int divisible by 16", "int equal to 1", "constexpr", "wider int", "a launch hook"],
)
def test_anything_that_specialises_misses(stand_in, change: str) -> None:
    fast, kernel = stand_in
    buffer = torch.empty(64)
    args = [buffer, buffer, 40, 3, 64]
    fast((1,), *args)
    hook = lambda metadata: None  # noqa: E731
    if change == "unaligned pointer":
        args[0] = buffer[1:]
    elif change == "int divisible by 16":
        args[2] = 48
    elif change == "int equal to 1":
        args[2] = 1
    elif change == "constexpr":
        args[4] = 128
    elif change == "wider int":
        args[3] = 2**40  # not specialised (do_not_specialize), but an i64
    else:
        triton.knobs.runtime.launch_enter_hook.add(hook)
    try:
        fast((1,), *args)
    finally:
        triton.knobs.runtime.launch_enter_hook.remove(hook)
    assert [launch[0] for launch in kernel.launches] == ["run", "run"]


def test_an_unspecialised_int_changing_value_hits(stand_in) -> None:
    fast, kernel = stand_in
    buffer = torch.empty(64)
    fast((1,), buffer, buffer, 40, 3, 64)
    fast((1,), buffer, buffer, 40, 16, 64)  # `width` is do_not_specialize: 16 or 3, one kernel
    assert [launch[0] for launch in kernel.launches] == ["run", "direct"]


def test_verify_raises_when_run_would_pick_another_kernel(stand_in, monkeypatch: pytest.MonkeyPatch) -> None:
    fast, kernel = stand_in
    buffer = torch.empty(64)
    fast((1,), buffer, buffer, 40, 3, 64)
    monkeypatch.setattr(fast_launch, "VERIFY", True)
    fast((1,), buffer, buffer, 40, 3, 64)  # run picks the kept kernel: fine
    kernel.compiled.clear()  # run now compiles another
    with pytest.raises(AssertionError, match="another compiled kernel"):
        fast((1,), buffer, buffer, 40, 3, 64)


def test_launcher_is_one_per_kernel_and_options() -> None:
    first = fast_launch.launcher(_copy_kernel, num_warps=4, enable_fp_fusion=False)
    assert fast_launch.launcher(_copy_kernel, enable_fp_fusion=False, num_warps=4) is first
    assert fast_launch.launcher(_copy_kernel, num_warps=8, enable_fp_fusion=False) is not first


@pytest.mark.skipif(not triton.__version__.startswith("3.6."), reason="the descriptor launch mirrors Triton 3.6's")
def test_descriptor_launch_passes_what_tritons_launcher_passes_and_encodes_each_descriptor_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Triton 3.6's own CudaLauncher.__call__ and wrap_handle_tensordesc against _DescriptorLaunch, on a
    C launch that records its arguments; the expansion (cuTensorMapEncodeTiled, which needs the driver)
    is a stand-in returning what make_tensordesc_arg returns: the map, then the shape and strides."""
    from rocm_vit.backends.gluon_attn import _descriptors
    from triton.backends.nvidia import driver

    encoded = []

    def expand(descriptor, metadata):
        encoded.append(descriptor)
        return [("map", descriptor.base.data_ptr(), metadata["swizzle"]), *descriptor.shape, *descriptor.strides]

    monkeypatch.setattr(driver, "make_tensordesc_arg", expand)
    launched = []
    signature = {0: "tensordesc<bf16[64, 1, 64],L>", 1: "*bf16", 2: "i32", 3: "tensordesc<bf16[64, 1, 16],L>"}
    launcher = driver.CudaLauncher.__new__(driver.CudaLauncher)
    launcher.launch = driver.wrap_handle_tensordesc(
        lambda *args: launched.append(args), signature, [{"swizzle": 128}, {"swizzle": 32}]
    )
    launcher.global_scratch_size = launcher.profile_scratch_size = 0
    launcher.global_scratch_align = launcher.profile_scratch_align = 1
    launcher.launch_cooperative_grid, launcher.launch_pdl, launcher.num_ctas = False, True, 1
    fast = fast_launch._descriptor_launch(launcher)
    assert fast is not None
    qkv = torch.empty(300, 3, 16, 80, dtype=torch.bfloat16)
    first, tail = _descriptors(qkv[:, 0], 64)
    args = (2, 3, 1, 77, 0xF00, (4, 1, 0), None, None, None, first, 1234, 7, tail)
    launcher(*args)
    fast(*args)
    fast(*args)
    assert launched[0] == launched[1] == launched[2]
    assert len(encoded) == 4  # Triton's launcher encodes both every launch; the kept expansion once
    other = (*args[:9], *_descriptors(qkv[:, 1], 64)[:1], 1234, 7, tail)  # k's address: another map
    launcher(*other)
    fast(*other)
    assert launched[3] == launched[4] != launched[0]
