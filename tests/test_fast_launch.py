"""backends/fast_launch.py on a CPU: its signature key against Triton's own binder, the checks that
can only turn its fast path off, and the cache's contract with a stand-in for the compiled kernel (no
GPU driver here to launch a real one). The GPU tiers run this file too, against their own Triton.

The stand-in models what ``FastLaunch`` relies on: ``kernel[grid](...)`` runs ``JITFunction.run``, which
binds with the kernel's binder (``device_caches[device]`` ends with the backend and the binder), keys
its cache on the text of the specialisation and returns the compiled kernel, whose ``run`` launcher
takes ``(grid x3, stream, function, packed metadata, launch metadata, enter hook, exit hook, *args)``.
tests/gpu/test_fast_launch_gpu.py checks the same against Triton on a GPU.
"""

from __future__ import annotations

import functools
import logging

import pytest
import torch
import triton
import triton.language as tl
from rocm_vit.backends import fast_launch
from rocm_vit.backends.fast_launch import FastLaunch, fast_launch_supported, key_mismatch, signature_key
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import make_backend
from triton.runtime.jit import create_function_from_signature


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


# The binder and backends this file checks the key against are Triton 3.6-3.9's; under another Triton
# (a GPU tier's image) the fast path is off and there is nothing to check.
_mirrored = pytest.mark.skipif(
    fast_launch._process_off_reason() is not None, reason=f"fast path off: {fast_launch._process_off_reason()}"
)


@functools.cache
def _backend(name: str):
    """NVIDIA's backend (the base class's pointer specialisation) or AMD's, which also specialises a
    pointer on a storage within 2 GiB (buffer ops), as ``run`` makes them for a device of each."""
    return make_backend(GPUTarget("cuda", 90, 32) if name == "cuda" else GPUTarget("hip", "gfx942", 64))


@triton.jit(do_not_specialize=["b", "d"], do_not_specialize_on_alignment=["c", "d"])
def _one_of_each(a, b, c, d, FLAG: tl.constexpr):
    pass  # a parameter of each kind run binds: specialised or not, on alignment or not


@triton.jit(do_not_specialize=["width"])
def _copy_kernel(src_ptr, dst_ptr, n, width, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(dst_ptr + offsets, tl.load(src_ptr + offsets, mask=offsets < n), mask=offsets < n)


def _binder(kernel, backend):
    """The kernel's binder as ``JITFunction.create_binder`` builds it for ``backend``."""
    return create_function_from_signature(kernel.signature, kernel.params, backend)


def _mismatch(kernel, backend, args) -> str | None:
    fast = FastLaunch(kernel, {})
    spec = backend.get_tensor_specialization
    return key_mismatch(_binder(kernel, backend), fast._kinds, fast._aligned, spec, 0, args)


@_mirrored
@pytest.mark.parametrize("name", ["cuda", "hip"])
def test_equal_keys_mean_equal_triton_specialisations(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Launches with one key get one specialisation from this Triton's own binder, for each kind of
    parameter: a hit never launches a kernel compiled for other arguments. key_mismatch puts each value
    in each parameter's place (a CPU storage over 2 GiB is reserved, never touched), then its own probes
    about a first launch of each kind, meta tensors included."""
    backend = _backend(name)
    values = [*_values(), torch.empty(2**29 + 16, dtype=torch.float32)]
    with monkeypatch.context() as patched:
        patched.setattr(fast_launch, "_probes", lambda arg: values)
        assert _mismatch(_one_of_each, backend, [0, 0, 0, 0, True]) is None
    for first in (torch.empty(64, dtype=torch.bfloat16), 1, 0.5, True):
        assert _mismatch(_one_of_each, backend, [first, first, first, first, True]) is None


def _forked(binder, marks):
    """A fork's binder: Triton's, plus an attribute on each argument ``marks`` picks (a property this
    module does not key), as a Triton that reports a mirrored version but specialises on more."""

    def bind(*args, **options):
        bound, specialisation, options = binder(*args, **options)
        for index, arg in enumerate(args[: len(specialisation)]):
            kind, attribute = specialisation[index]
            if kind != "constexpr" and marks(arg):
                specialisation[index] = (kind, f"{attribute or ''}F")
        return bound, specialisation, options

    return bind


def _pointer(arg) -> bool:
    return isinstance(arg, torch.Tensor)


_FORKS = {
    "ints divisible by 8": lambda arg: type(arg) is int and arg % 8 == 0,
    "pointers aligned to 32 bytes": lambda arg: _pointer(arg) and arg.data_ptr() % 32 == 0,
    "storages over 2 GiB": lambda arg: _pointer(arg) and arg.untyped_storage().nbytes() >= 2**31,
    "negative ints": lambda arg: type(arg) is int and arg < 0,
}


@_mirrored
@pytest.mark.parametrize("fork", list(_FORKS))
@pytest.mark.parametrize("name", ["cuda", "hip"])
def test_a_triton_that_specialises_on_more_is_caught_by_the_probes(name: str, fork: str) -> None:
    backend = _backend(name)
    fast = FastLaunch(_copy_kernel, {})
    binder = _forked(_binder(_copy_kernel, backend), _FORKS[fork])
    args = [torch.empty(64), torch.empty(64), 40, 3, 64]
    spec = backend.get_tensor_specialization
    problem = key_mismatch(binder, fast._kinds, fast._aligned, spec, 0, args)
    if name == "hip" and fork == "storages over 2 GiB":
        assert problem is None  # AMD's own rule: the key holds it already
    else:
        assert problem is not None and "F')" in problem, problem


@_mirrored
def test_a_probe_the_binder_rejects_is_no_mismatch() -> None:
    """A value Triton's binder raises for never launches (run raises too): the check skips it rather
    than turning the fast path off."""
    backend = _backend("cuda")
    binder = _binder(_copy_kernel, backend)

    def rejecting(*args, **options):
        if any(type(arg) is int and arg < 0 for arg in args):
            raise ValueError("negative")
        return binder(*args, **options)

    fast = FastLaunch(_copy_kernel, {})
    args = [torch.empty(64), torch.empty(64), 40, 3, 64]
    assert key_mismatch(rejecting, fast._kinds, fast._aligned, backend.get_tensor_specialization, 0, args) is None


@_mirrored
def test_constexprs_are_keyed_by_type_and_value_as_triton_compiles_them() -> None:
    """True, 1 and 1.0 are equal in Python, but the text of Triton's specialisation, which names the
    kernel it compiles, differs: three kernels. So do -0.0 and 0.0, (1,) and (True,)."""
    spec = _backend("cuda").get_tensor_specialization
    binder = _binder(_one_of_each, _backend("cuda"))
    for alike in ([True, 1, 1.0], [0.0, -0.0], [(1,), (True,)]):
        keys = {signature_key([0], [True], spec, 0, [value]) for value in alike}
        texts = {str(binder(0, 0, 0, 0, value)[1]) for value in alike}
        assert len(keys) == len(texts) == len(alike), alike
    assert signature_key([0], [True], spec, 0, [64]) != signature_key([0], [True], spec, 0, [128])
    assert signature_key([0], [True], spec, 0, ["ieee"]) != signature_key([0], [True], spec, 0, [None])
    assert signature_key([1], [True], spec, 0, [16]) != signature_key([1], [True], spec, 1, [16])


def test_an_argument_of_another_kind_has_no_key() -> None:
    assert signature_key([1], [True], _backend("cuda").get_tensor_specialization, 0, [object()]) is None


@pytest.mark.parametrize(
    ("version", "release"),
    [
        ("3.6.0", (3, 6)),
        ("3.6+rocm7", (3, 6)),
        ("3.6.0+rocm7.0.0.git1a2b3c4d", (3, 6)),
        ("3.9.0+git1a2b3c", (3, 9)),
        ("3.6.0rc1", (3, 6)),
        ("3.7.0.post1", (3, 7)),
        ("3.8.0.dev20260101", (3, 8)),
        ("v3.6.0", (3, 6)),
        ("3", (3, 0)),
        ("unknown", None),
        ("3.x", None),
        ("", None),
        ("3.6.0+", None),
        ("1!3.6.0", None),  # another epoch: another numbering
    ],
)
def test_versions_parse_as_packaging_reads_them(version: str, release) -> None:
    assert fast_launch.triton_release(version) == release


@pytest.mark.parametrize(("version", "supported"), [("3.6+rocm7", True), ("3.9.0+git1a2b3c", True), ("3.10.0", False)])
def test_a_local_version_never_stops_a_launch(monkeypatch: pytest.MonkeyPatch, version: str, supported: bool) -> None:
    """``3.6+rocm7`` once raised ValueError in launcher(), so every kernel call failed."""
    monkeypatch.setattr(triton, "__version__", version)
    monkeypatch.setattr(fast_launch, "_launchers", {})
    assert fast_launch.launcher(_copy_kernel, num_warps=4).enabled is supported
    assert fast_launch_supported(_copy_kernel) is supported


def test_compiled_kernels_under_a_known_triton_take_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    from triton.runtime.interpreter import InterpretedFunction

    monkeypatch.setattr(triton, "__version__", "3.9.0")  # this file runs under the GPU tiers' Tritons too
    assert fast_launch_supported(_copy_kernel)
    assert not fast_launch_supported(InterpretedFunction(_copy_kernel.fn))  # TRITON_INTERPRET=1's kernels
    for version in ("3.5.1", "3.10.0", "garbage"):
        monkeypatch.setattr(triton, "__version__", version)
        assert not fast_launch_supported(_copy_kernel)


class _Compiled:
    """A compiled kernel: its launcher records each launch."""

    def __init__(self, launches: list) -> None:
        self.function, self.packed_metadata = 0xF00, (4, 1, 0)
        self.run = lambda *launch: launches.append(("direct", launch))


class _StandInKernel:
    """``_copy_kernel`` as ``FastLaunch`` sees it: its real params and binder (NVIDIA's); ``[grid]``
    goes through run, whose cache is keyed on the specialisation's text."""

    def __init__(self, binder=None) -> None:
        self.params = _copy_kernel.params
        self.launches: list = []
        self.compiled: dict = {}
        backend = _backend("cuda")
        self.binder = binder or _binder(_copy_kernel, backend)
        self.device_caches = {0: ({}, {}, None, backend, self.binder)}

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.launches.append(("run", grid, args, kwargs))
            return self.run(*args, grid=grid, warmup=False, **kwargs)

        return run

    def run(self, *args, grid, warmup, **kwargs):
        _, specialisation, options = self.binder(*args, **kwargs)
        return self.compiled.setdefault(str(specialisation) + str(options), _Compiled(self.launches))


def _stand_in(monkeypatch: pytest.MonkeyPatch, kernel: _StandInKernel) -> FastLaunch:
    monkeypatch.setattr(fast_launch, "_driver_fns", lambda: (lambda: 0, lambda device: 77))  # device 0, stream 77
    fast = FastLaunch(kernel, {"num_warps": 4})
    fast.off_reason = None  # the stand-in is no JITFunction
    return fast


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> tuple[FastLaunch, _StandInKernel]:
    kernel = _StandInKernel()
    return _stand_in(monkeypatch, kernel), kernel


@_mirrored
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


@_mirrored
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


@_mirrored
def test_an_unspecialised_int_changing_value_hits(stand_in) -> None:
    fast, kernel = stand_in
    buffer = torch.empty(64)
    fast((1,), buffer, buffer, 40, 3, 64)
    fast((1,), buffer, buffer, 40, 16, 64)  # `width` is do_not_specialize: 16 or 3, one kernel
    assert [launch[0] for launch in kernel.launches] == ["run", "direct"]


@_mirrored
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


class _NoMetadata(_Compiled):
    def __getattribute__(self, name: str):
        if name == "packed_metadata":
            raise AttributeError(name)
        return super().__getattribute__(name)


def _launcher_taking_other_arguments(kernel: _StandInKernel) -> None:
    def launch(*launch):
        raise TypeError(f"function takes exactly 12 arguments ({len(launch)} given)")

    original = kernel.run
    kernel.run = lambda *args, **kwargs: _with_launch(original(*args, **kwargs), launch)


def _with_launch(compiled: _Compiled, launch) -> _Compiled:
    compiled.run = launch
    return compiled


_FAULTS = {
    "no backend and binder where Triton 3.6-3.9 keep them": lambda kernel: setattr(kernel, "device_caches", {0: ({},)}),
    "a compiled kernel without packed metadata": lambda kernel: setattr(
        kernel, "run", lambda *args, **kwargs: _NoMetadata(kernel.launches)
    ),
    "a launcher taking other arguments": _launcher_taking_other_arguments,
    "a binder that specialises on more": lambda kernel: setattr(
        kernel, "device_caches", {0: (None, _backend("cuda"), _forked(kernel.binder, _FORKS["ints divisible by 8"]))}
    ),
}


@_mirrored
@pytest.mark.parametrize("fault", list(_FAULTS))
def test_internals_not_as_read_turn_the_kernel_off_once_and_run_launches(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, fault: str
) -> None:
    kernel = _StandInKernel()
    _FAULTS[fault](kernel)
    fast = _stand_in(monkeypatch, kernel)
    buffer = torch.empty(64)
    with caplog.at_level(logging.WARNING, logger=fast_launch.__name__):
        for _ in range(3):
            fast((1,), buffer, buffer, 40, 3, 64)
    assert [launch[0] for launch in kernel.launches] == ["run", "run", "run"]
    assert fast.off_reason is not None and not fast.enabled
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 1 and "JITFunction.run launches it" in warnings[0], warnings


def test_doctor_says_whether_the_fast_path_is_on_and_why(monkeypatch: pytest.MonkeyPatch) -> None:
    from rocm_vit.cli import doctor
    from rocm_vit.report import render

    monkeypatch.setattr(triton, "__version__", "3.6.0+rocm7.1")
    assert doctor._launches() == {"fast_path": "on", "why": fast_launch.fast_path_state()[1]}
    assert "3.6.0+rocm7.1 is within 3.6-3.9" in doctor._launches()["why"]
    for version, why in (("3.5.1", "outside 3.6-3.9"), ("garbage", "'garbage' is not a PEP 440 version")):
        monkeypatch.setattr(triton, "__version__", version)
        launches = doctor._launches()
        assert launches["fast_path"] == "off" and why in launches["why"], launches
    document = {"sections": {"doctor": {"data": {"policy": {}, "launches": launches}}}}
    assert any(line.startswith("| triton fast launch | off | ") for line in render._doctor(document))
