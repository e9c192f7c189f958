"""Triton launches bound once per argument signature: the compiled kernel's launcher, called directly.

Why: ``kernel[grid](...)`` runs ``JITFunction.run`` at every launch, tens of microseconds of binding,
specialising and driver queries, more than a small kernel runs for. ``launcher(kernel, **options)``
sends a signature's first launch through ``run``, keeps the compiled kernel it used, and launches that
signature again through the kernel's own launcher, pointers as ints.

Why it stays exact: the key holds what ``run`` specialises on (``signature_key``), and at a kernel's
first launch ``key_mismatch`` checks the key against that kernel's own Triton binder on probe values,
so a Triton that specialises otherwise is caught rather than trusted on its version number.
Why it can only fall back: an unparsable version, a Triton outside the versions whose launch this
mirrors, internals not as read, a mismatch or an error in the shortcut turn the kernel's fast path
off, logged once, and ``run`` launches as before. A launch hook (proton) or the interpreter takes
``run``; ``VERIFY`` makes each fast launch ask ``run`` for its kernel too (the GPU tests).
"""

from __future__ import annotations

import functools
import logging
import re
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
import triton

try:
    from triton import knobs
except ImportError:  # a Triton older than any this mirrors: the fast path is off (_process_off_reason)
    knobs = None

logger = logging.getLogger(__name__)

# Triton versions whose JITFunction.run, CompiledKernel and launchers this module's launch mirrors.
_PROTOCOL_VERSIONS = ((3, 6), (3, 9))
VERIFY = False

_CONSTEXPR, _SPECIALISED, _UNSPECIALISED = 0, 1, 2
_INT32 = (-(2**31), 2**31)
_INT64_MAX = 2**63
# Constexprs keyed as they are: no value of one equals a value of another type (1 == True == 1.0 does).
_PLAIN_CONSTEXPRS = frozenset((int, str))

# A PEP 440 version as packaging reads it; only the release segment decides, the pre, post, dev and
# local parts (3.6.0rc1, 3.6.0.post1, 3.6.0+rocm7, 3.9.0+git1a2b3c) do not.
_PEP440 = re.compile(
    r"v?(?:(?P<epoch>\d+)!)?(?P<release>\d+(?:\.\d+)*)"
    r"(?:[-_.]?(?:a|b|c|rc|alpha|beta|pre|preview)[-_.]?\d*)?"
    r"(?:-\d+|[-_.]?(?:post|rev|r)[-_.]?\d*)?"
    r"(?:[-_.]?dev[-_.]?\d*)?"
    r"(?:\+[a-z0-9]+(?:[-_.][a-z0-9]+)*)?",
    re.IGNORECASE,
)


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


def fast_path_state() -> tuple[bool, str]:
    """Whether Triton launches in this process may bypass ``run``, and why (``rocm-vit doctor``)."""
    reason = _process_off_reason()
    if reason is None and getattr(getattr(knobs, "runtime", None), "interpret", False):
        reason = "TRITON_INTERPRET=1: kernels are interpreted"
    if reason is not None:
        return False, reason
    low, high = (".".join(map(str, version)) for version in _PROTOCOL_VERSIONS)
    return True, (
        f"Triton {triton.__version__} is within {low}-{high}; each kernel's key is checked against "
        "Triton's own binder at its first launch"
    )


class FastLaunch:
    """``fast(grid, *args)`` launches ``kernel[grid](*args, **options)``: ``args`` are every parameter
    of the kernel in order, constexprs included, positionally. ``off_reason``: why every launch takes
    ``run``, or ``None``."""

    def __init__(self, kernel: Any, options: dict[str, Any]) -> None:
        self._kernel = kernel
        self._options = options
        self._name = getattr(kernel, "__name__", repr(kernel))
        self._kinds: tuple[int, ...] = ()
        self._aligned: tuple[bool, ...] = ()
        # signature key -> (the compiled kernel's launcher, its function handle, packed metadata, the kernel)
        self._entries: dict[tuple, tuple] = {}
        self._tensor_spec: dict[int, Callable[..., str]] = {}  # device -> backend.get_tensor_specialization
        self.off_reason = _kernel_off_reason(kernel)
        if self.off_reason is not None and isinstance(kernel, _JIT_FUNCTION):
            _warn_once(f"Triton fast launch is off ({self.off_reason}); JITFunction.run launches every kernel")
        params = getattr(kernel, "params", ())
        try:
            self._kinds = tuple(
                _CONSTEXPR if p.is_constexpr else _UNSPECIALISED if p.do_not_specialize else _SPECIALISED
                for p in params
            )
            self._aligned = tuple(not p.do_not_specialize_on_alignment for p in params)
            # The slow path passes constexprs by name, as the wrappers did (tests/aot_rocm.py reads them
            # so); the interpreter's kernels declare no params and take every argument by position.
            self._positional = next((i for i, kind in enumerate(self._kinds) if kind == _CONSTEXPR), len(params))
            self._keyword_names = tuple(p.name for p in params[self._positional :])
        except Exception as err:  # a Triton whose KernelParam is another: run binds every argument
            self._kinds = ()
            self._turn_off(f"its parameters do not read as Triton 3.6-3.9's ({type(err).__name__}: {err})")

    @property
    def enabled(self) -> bool:
        return self.off_reason is None

    def __call__(self, grid: Sequence[int], *args: Any) -> None:
        key = None
        # Nothing is asked of the driver before a first launch through run returned a kernel (on a
        # CPU, tests/aot_rocm.py records launches with no driver there).
        if self._tensor_spec:
            try:
                key, entry, values, device = self._kept(args)
                if entry is not None:
                    if VERIFY:
                        self._verify(entry[3], grid, args)
                    _launch(entry, grid, _current_stream(device), values)
                    return
            except Exception as err:  # the shortcut only ever falls back to run
                if VERIFY and isinstance(err, AssertionError):
                    raise
                self._turn_off(f"its fast launch raised {type(err).__name__}: {err}")
                key = None
        positional, named = self._split(args)
        compiled = self._kernel[tuple(grid)](*positional, **named, **self._options)
        if self.off_reason is None and compiled is not None:
            try:
                self._remember(key, compiled, args)
            except Exception as err:
                self._turn_off(f"reading Triton's internals raised {type(err).__name__}: {err}")

    def _kept(self, args: Sequence[Any]) -> tuple[tuple | None, tuple | None, list[Any] | None, int | None]:
        """``(key, kept entry, the launcher's arguments, device)``; no entry where run must launch."""
        if _hooks_set():
            return None, None, None, None
        device = _current_device()
        tensor_spec = self._tensor_spec.get(device)
        if tensor_spec is None:
            return None, None, None, device
        key, values = _bind(self._kinds, self._aligned, tensor_spec, device, args)
        return key, self._entries.get(key) if key is not None else None, values, device

    def _split(self, args: Sequence[Any]) -> tuple[Sequence[Any], dict[str, Any]]:
        """``run``'s positional arguments and constexprs by name."""
        if not self._kinds:
            return args, {}
        return args[: self._positional], dict(zip(self._keyword_names, args[self._positional :], strict=True))

    def _remember(self, key: tuple | None, compiled: Any, args: Sequence[Any]) -> None:
        """Keep ``compiled`` for ``args``' key; the device's first checks the key against Triton's binder
        about these ``args``. Triton's knobs (debug, instrumentation) are read once per key, at its first launch."""
        device = _current_device()
        if device not in self._tensor_spec:
            # JITFunction.device_caches[device] ends (..., backend, binder) in Triton 3.6-3.9.
            *_, backend, binder = self._kernel.device_caches[device]
            tensor_spec = backend.get_tensor_specialization
            # The base backend's rule (NVIDIA's) is applied inline: a call per pointer saved.
            tensor_spec = _BASE_RULE if _is_base_rule(tensor_spec) else tensor_spec
            key = signature_key(self._kinds, self._aligned, tensor_spec, device, args)
            if key is None:  # nothing to check the key on: a later launch tries again
                return
            mismatch = key_mismatch(binder, self._kinds, self._aligned, tensor_spec, device, args)
            if mismatch is not None:
                self._turn_off(mismatch)
                return
            self._tensor_spec[device] = tensor_spec
        if key is not None:
            run = _descriptor_launch(compiled.run) or compiled.run
            self._entries[key] = (run, compiled.function, compiled.packed_metadata, compiled)

    def _turn_off(self, reason: str) -> None:
        self.off_reason = reason
        self._entries.clear()
        self._tensor_spec.clear()
        _warn_once(f"Triton fast launch off for {self._name}: {reason}; JITFunction.run launches it")

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


def key_mismatch(
    binder: Callable[..., Any],
    kinds: Sequence[int],
    aligned: Sequence[bool],
    tensor_spec: Callable[..., str],
    device: int,
    args: Sequence[Any],
) -> str | None:
    """Where two launches this module keys alike get different specialisations from ``binder`` (the
    kernel's own, as ``run`` binds), or ``None``: each parameter of ``args`` in turn takes probe values
    of its kind (ints about each edge, bools, floats, pointers of each alignment in storages within and
    over 2 GiB) and each group of equal keys must share the text of Triton's specialisation (its cache
    key). Why: a fork reporting a mirrored version may specialise on more, and would launch a stale kernel."""
    if _is_base_rule(tensor_spec):
        tensor_spec = _BASE_RULE
    seen: dict[tuple, tuple[Any, str]] = {}
    for index, kind in enumerate(kinds):
        if kind == _CONSTEXPR:
            continue
        for probe in (args[index], *_probes(args[index])):
            trial = [*args[:index], probe, *args[index + 1 :]]
            key = _bind(kinds, aligned, tensor_spec, device, trial)[0]
            if key is None:
                continue
            try:
                specialisation = binder(*trial)[1]
            except Exception:  # run raises for this value too (an int over 64 bits): it never launches
                continue
            first_probe, first_text = seen.setdefault(key, (probe, str(specialisation)))
            if first_text != str(specialisation):
                return (
                    f"its key holds {_describe(first_probe)} and {_describe(probe)} alike as parameter {index} "
                    f"where Triton's binder specialises {first_text} and {specialisation}"
                )
    return None


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
            # By type and value, as the text of run's key: True, 1 and 1.0 compile apart, as do -0.0 and 0.0.
            key.append(arg if arg.__class__ in _PLAIN_CONSTEXPRS else (arg.__class__, repr(arg)))
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
    return _kernel_off_reason(kernel) is None


def _kernel_off_reason(kernel: Any) -> str | None:
    reason = _process_off_reason()
    if reason is None and not (isinstance(kernel, _JIT_FUNCTION) and hasattr(kernel, "device_caches")):
        reason = "not a compiled Triton kernel (an interpreted one, or another kind)"
    return reason


def _process_off_reason() -> str | None:
    """Why no launch in this process may bypass ``run``, or ``None``."""
    version = getattr(triton, "__version__", None)
    release = triton_release(version) if isinstance(version, str) else None
    if release is None:
        return f"Triton's version {version!r} is not a PEP 440 version"
    low, high = _PROTOCOL_VERSIONS
    if not low <= release <= high:
        return f"Triton {version} is outside {low[0]}.{low[1]}-{high[0]}.{high[1]}, whose launch this mirrors"
    if knobs is None or _JIT_FUNCTION is None:
        return f"Triton {version} lacks triton.knobs or triton.runtime.JITFunction"
    return None


def triton_release(version: str) -> tuple[int, int] | None:
    """``(major, minor)`` of a PEP 440 ``version`` string, or ``None`` where it is none (or has an epoch)."""
    match = _PEP440.fullmatch(version.strip())
    if match is None or int(match["epoch"] or 0):
        return None
    release = [int(part) for part in match["release"].split(".")]
    return release[0], release[1] if len(release) > 1 else 0


def _probes(arg: Any) -> Sequence[Any]:
    """Values ``key_mismatch`` puts in the place of ``arg``: of its kind, about each edge ``run``
    specialises on (and a few it does not, that a fork might)."""
    if isinstance(arg, torch.Tensor):
        return _tensor_probes(arg.dtype)
    if isinstance(arg, bool):
        return (True, False)
    if isinstance(arg, int):
        return _PROBE_INTS
    if isinstance(arg, float):
        return (0.5, 1.0, -0.0, 2.0**40)
    return ()


_PROBE_INTS = (0, 1, 2, 4, 8, 15, 16, 17, 24, 32, 2**31 - 16, 2**31 - 1, 2**31, 2**32, 2**63 - 16, 2**63)
_PROBE_INTS += (-1, -16, -(2**31), -(2**31) - 16)


@functools.cache
def _tensor_probes(dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """Meta tensors (no memory) of ``dtype`` at byte addresses 0, 1, 2, 4, 8 and 16 elements, in a
    storage of 64 elements and in one over 2 GiB (AMD's buffer ops specialise on that)."""
    itemsize = torch.empty((), dtype=dtype, device="meta").element_size()
    storages = [torch.empty(size, dtype=dtype, device="meta") for size in (64, 2**31 // itemsize + 64)]
    return tuple(storage[offset:] for storage in storages for offset in (0, 1, 2, 4, 8, 16))


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        size = value.untyped_storage().nbytes()
        return f"a {value.dtype} pointer at {value.data_ptr()} in a storage of {size} bytes"
    return repr(value)


_JIT_FUNCTION = getattr(getattr(triton, "runtime", None), "JITFunction", None)


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


def _triton_version() -> tuple[int, int] | None:
    return triton_release(getattr(triton, "__version__", ""))


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


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning(message)


_driver_fns_cache: list[tuple[Callable[[], int], Callable[[int], int]]] = []
_launchers: dict[tuple, FastLaunch] = {}
_launchers_lock = threading.Lock()
_warned: set[str] = set()
