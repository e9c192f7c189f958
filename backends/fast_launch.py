"""Triton launches bound once per argument signature: the compiled kernel's launcher, called directly.

``kernel[grid](...)`` runs ``JITFunction.run`` at every launch: it binds and specialises every
argument, formats the options into a cache key, checks the kernel's globals, builds launch metadata for
hooks, and its launcher asks the driver about every pointer. That is tens of microseconds a launch, more
than a small kernel runs for. ``launcher(kernel, **options)`` returns a ``FastLaunch``; its first launch
of a signature goes through ``run`` and keeps the compiled kernel ``run`` used, later launches of that
signature call the compiled kernel's launcher with data pointers as ints.

Exactness: the signature key holds everything ``run`` specialises a launch on (``signature_key``): the
current device, each constexpr's value, each tensor's dtype and the backend's own pointer
specialisation (16-byte alignment; on ROCm also a storage within 2 GiB), each specialised int's width,
``== 1`` and divisibility by 16, each unspecialised int's width, floats and ``None``; the options are
the launcher's. An argument of another kind, a launch hook (a profiler such as proton), the
interpreter and a Triton whose launch protocol this does not mirror (``_PROTOCOL_VERSIONS``) take
``run``. Triton's knobs (debug, instrumentation) are read once per key, at its first launch.
``VERIFY`` makes every fast launch ask ``run`` for its kernel and raise when it is another (the GPU tests).
Under Triton 3.6, a kept kernel that takes host ``TensorDescriptor``s also keeps each one's encoded tensor
map (``_DescriptorLaunch``), which its launcher would otherwise encode again at every launch.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
import triton
from triton import knobs

# Triton versions whose JITFunction.run, CompiledKernel and launchers this module's launch mirrors.
_PROTOCOL_VERSIONS = ((3, 6), (3, 9))
VERIFY = False

_CONSTEXPR, _SPECIALISED, _UNSPECIALISED = 0, 1, 2
_INT32 = (-(2**31), 2**31)
_INT64_MAX = 2**63


def launcher(kernel: Any, **options: Any) -> FastLaunch:
    """The ``FastLaunch`` of ``kernel`` with launch ``options`` (``num_warps``, ``num_stages``,
    ``enable_fp_fusion``, ...), one per process for each distinct pair."""
    # By identity: the FastLaunch holds the kernel, so its id stays its own (and a test's stand-in
    # kernel need not be hashable).
    key = (id(kernel), tuple(sorted(options.items())))
    found = _launchers.get(key)
    if found is None:
        with _launchers_lock:
            found = _launchers.setdefault(key, FastLaunch(kernel, options))
    return found


class FastLaunch:
    """``fast(grid, *args)`` launches ``kernel[grid](*args, **options)``: ``args`` are every parameter
    of the kernel in order, constexprs included, positionally."""

    def __init__(self, kernel: Any, options: dict[str, Any]) -> None:
        self._kernel = kernel
        self._options = options
        params = getattr(kernel, "params", ())
        self._kinds = tuple(
            _CONSTEXPR if p.is_constexpr else _UNSPECIALISED if p.do_not_specialize else _SPECIALISED for p in params
        )
        self._aligned = tuple(not p.do_not_specialize_on_alignment for p in params)
        # The slow path passes constexprs by name, as the wrappers did (tests/aot_rocm.py reads them so);
        # the interpreter's kernels declare no params and take every argument by position.
        self._positional = next((i for i, kind in enumerate(self._kinds) if kind == _CONSTEXPR), len(self._kinds))
        self._keyword_names = tuple(p.name for p in params[self._positional :])
        self.enabled = fast_launch_supported(kernel)
        # signature key -> (the compiled kernel's launcher, its function handle, packed metadata, the kernel)
        self._entries: dict[tuple, tuple] = {}
        self._tensor_spec: dict[int, Callable[..., str]] = {}  # device -> backend.get_tensor_specialization

    def __call__(self, grid: Sequence[int], *args: Any) -> None:
        key = None
        # Nothing is asked of the driver before a first launch through run returned a kernel (on a
        # CPU, tests/aot_rocm.py records launches with no driver there).
        if self._tensor_spec and not _hooks_set():
            device = _current_device()
            tensor_spec = self._tensor_spec.get(device)
            if tensor_spec is not None:
                key, values = _bind(self._kinds, self._aligned, tensor_spec, device, args)
                entry = self._entries.get(key) if key is not None else None
                if entry is not None:
                    if VERIFY:
                        self._verify(entry[3], grid, args)
                    _launch(entry, grid, _current_stream(device), values)
                    return
        positional, named = self._split(args)
        compiled = self._kernel[tuple(grid)](*positional, **named, **self._options)
        if self.enabled and compiled is not None:
            self._remember(key, compiled, args)

    def _split(self, args: Sequence[Any]) -> tuple[Sequence[Any], dict[str, Any]]:
        """``run``'s positional arguments and constexprs by name."""
        if not self._kinds:
            return args, {}
        return args[: self._positional], dict(zip(self._keyword_names, args[self._positional :], strict=True))

    def _remember(self, key: tuple | None, compiled: Any, args: Sequence[Any]) -> None:
        device = _current_device()
        if device not in self._tensor_spec:
            tensor_spec = self._kernel.device_caches[device][3].get_tensor_specialization
            # The base backend's rule (NVIDIA's) is applied inline: a call per pointer saved.
            self._tensor_spec[device] = _BASE_RULE if _is_base_rule(tensor_spec) else tensor_spec
            key = signature_key(self._kinds, self._aligned, self._tensor_spec[device], device, args)
        if key is not None:
            run = _descriptor_launch(compiled.run) or compiled.run
            self._entries[key] = (run, compiled.function, compiled.packed_metadata, compiled)

    def _verify(self, kept: Any, grid: Sequence[int], args: Sequence[Any]) -> None:
        positional, named = self._split(args)
        expected = self._kernel.run(*positional, grid=tuple(grid), warmup=True, **named, **self._options)
        if expected is not kept:
            raise AssertionError(f"fast launch of {self._kernel} kept another compiled kernel than run() picks")


def signature_key(
    kinds: Sequence[int],
    aligned: Sequence[bool],
    tensor_spec: Callable[..., str],
    device: int,
    args: Sequence[Any],
) -> tuple | None:
    """What ``JITFunction.run`` specialises a launch of ``args`` on, or ``None`` for an argument kind
    this module does not key (that launch takes ``run``). ``kinds``/``aligned`` per parameter:
    constexpr, specialised or ``do_not_specialize``; specialised on alignment. ``tensor_spec``: the
    backend's ``get_tensor_specialization``."""
    if _is_base_rule(tensor_spec):
        tensor_spec = _BASE_RULE
    return _bind(kinds, aligned, tensor_spec, device, args)[0]


def _bind(
    kinds: Sequence[int], aligned: Sequence[bool], tensor_spec: Any, device: int, args: Sequence[Any]
) -> tuple[tuple | None, list[Any]]:
    """``(signature_key, the launcher's arguments)``: data pointers as ints, the rest as given.
    ``tensor_spec`` ``_BASE_RULE`` applies the base backend's pointer rule inline."""
    key: list[Any] = [device]
    values = list(args)
    for index, arg in enumerate(args):
        kind = kinds[index]
        if kind == _CONSTEXPR:
            key.append(arg)
        elif isinstance(arg, torch.Tensor):
            pointer = values[index] = arg.data_ptr()
            if tensor_spec is _BASE_RULE:
                key.append((arg.dtype, aligned[index] and pointer % 16 == 0))
            else:
                key.append((arg.dtype, tensor_spec(arg, align=aligned[index])))
        elif isinstance(arg, bool):
            key.append(("u1", arg) if kind == _SPECIALISED else "u1")
        elif isinstance(arg, int):
            width = 32 if _INT32[0] <= arg < _INT32[1] else 64 if arg < _INT64_MAX else 65
            key.append((width, arg == 1, aligned[index] and arg % 16 == 0) if kind == _SPECIALISED else width)
        elif isinstance(arg, float):
            key.append(float)
        elif arg is None:
            key.append(None)
        elif hasattr(arg, "block_shape") and hasattr(arg, "base"):  # a host TensorDescriptor
            key.append((type(arg), arg.base.dtype, tuple(arg.block_shape), getattr(arg, "layout", None), arg.padding))
        else:
            return None, values
    return tuple(key), values


_BASE_RULE = object()  # stands for BaseBackend.get_tensor_specialization: 16-byte aligned pointers


def _is_base_rule(tensor_spec: Any) -> bool:
    from triton.backends.compiler import BaseBackend

    return tensor_spec is _BASE_RULE or tensor_spec == BaseBackend.get_tensor_specialization


def fast_launch_supported(kernel: Any) -> bool:
    """Whether launches of ``kernel`` may bypass ``run``: a compiled (not interpreted) Triton kernel
    under a Triton whose launch protocol this module mirrors."""
    in_range = _PROTOCOL_VERSIONS[0] <= _triton_version() <= _PROTOCOL_VERSIONS[1]
    return in_range and isinstance(kernel, triton.runtime.JITFunction) and hasattr(kernel, "device_caches")


def _launch(entry: tuple, grid: Sequence[int], stream: int, values: Sequence[Any]) -> None:
    run, function, packed_metadata, _ = entry
    size = len(grid)
    # Pointers as ints (_bind): the launcher skips its driver query of each tensor's pointer. No launch
    # metadata or hooks: a launch with hooks set goes through run (_hooks_set).
    run(
        grid[0],
        grid[1] if size > 1 else 1,
        grid[2] if size > 2 else 1,
        stream,
        function,
        packed_metadata,
        None,
        None,
        None,
        *values,
    )


def _descriptor_launch(launcher: Any) -> _DescriptorLaunch | None:
    """Triton 3.6's CUDA launcher of a kernel that takes host ``TensorDescriptor``s, with their
    expansions kept (``_DescriptorLaunch``), or ``None`` where the launcher is not that one exactly."""
    if _triton_version() != (3, 6) or type(launcher).__name__ != "CudaLauncher":
        return None
    if launcher.global_scratch_size or launcher.profile_scratch_size:
        return None
    wrapper = launcher.launch  # wrap_handle_tensordesc's inner, over the compiled C launch
    code = getattr(wrapper, "__code__", None)
    if code is None or code.co_freevars != ("launcher", "tensordesc_indices", "tensordesc_meta"):
        return None
    launch, indices, metadata = (cell.cell_contents for cell in wrapper.__closure__)
    module = sys.modules[type(launcher).__module__]
    if getattr(module, "_BASE_ARGS_FORMAT_LEN", None) != 13 or not metadata or None in metadata:
        return None
    flags = (launcher.launch_cooperative_grid, launcher.launch_pdl)
    return _DescriptorLaunch(launch, sorted(indices), list(metadata), module.make_tensordesc_arg, flags)


class _DescriptorLaunch:
    """What Triton 3.6's ``CudaLauncher.__call__`` and ``wrap_handle_tensordesc`` do for a kernel with
    no scratch memory, except that each descriptor's expansion (a ``cuTensorMapEncodeTiled``) is kept
    per base address, shape, strides and padding: the same values, encoded once. The map is copied
    into the kernel's parameters at each launch, so a kept one is never written while in flight."""

    def __init__(
        self, launch: Callable[..., Any], indices: list[int], metadata: list, expand: Callable, flags: tuple
    ) -> None:
        self._launch = launch
        self._indices = frozenset(indices)
        self._metadata = {index: entry for index, entry in zip(indices, metadata, strict=True)}
        self._expand = expand
        self._cooperative, self._pdl = flags
        self._expanded: dict[tuple, list] = {}

    def __call__(
        self, grid_x, grid_y, grid_z, stream, function, packed_metadata, launch_metadata, enter, leave, *args
    ) -> None:
        final = [grid_x, grid_y, grid_z, stream, function, self._cooperative, self._pdl, None, None]
        final += [packed_metadata, launch_metadata, enter, leave]
        for index, arg in enumerate(args):
            if index not in self._indices:
                final.append(arg)
                continue
            key = (index, arg.base.data_ptr(), tuple(arg.shape), tuple(arg.strides), arg.padding)
            expanded = self._expanded.get(key)
            if expanded is None:
                if len(self._expanded) >= _KEPT_EXPANSIONS:
                    self._expanded.clear()
                expanded = self._expanded[key] = self._expand(arg, self._metadata[index])
            final.extend(expanded)
        self._launch(*final)


# Descriptor expansions kept per kernel: a layout's layers reuse a few addresses; cleared when full.
_KEPT_EXPANSIONS = 512


def _triton_version() -> tuple[int, int]:
    return tuple(int(part) for part in triton.__version__.split(".")[:2])


def _hooks_set() -> bool:
    runtime = knobs.runtime
    enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
    return bool(getattr(enter, "calls", enter)) or bool(getattr(leave, "calls", leave))


def _current_device() -> int:
    return _driver_fns()[0]()


def _current_stream(device: int) -> int:
    return _driver_fns()[1](device)


def _driver_fns() -> tuple[Callable[[], int], Callable[[int], int]]:
    """The active driver's device and stream queries, looked up once (``driver.active`` is a lazy proxy)."""
    if not _driver_fns_cache:
        active = triton.runtime.driver.active
        _driver_fns_cache.append((active.get_current_device, active.get_current_stream))
    return _driver_fns_cache[0]


_driver_fns_cache: list[tuple[Callable[[], int], Callable[[int], int]]] = []
_launchers: dict[tuple, FastLaunch] = {}
_launchers_lock = threading.Lock()
