"""Launching Triton kernels for a few microseconds of host time per call.

``kernel[grid](...)`` re-derives the kernel's specialization from every argument on every call
(about 10-20 us in Python for the norm and gated-delta-rule kernels). Eager callers at FLUX's
sizes spend more than that waiting on the host, so each launcher here keeps the compiled kernel
per specialization key and calls it directly afterwards.

The key mirrors what Triton specializes on: each tensor's dtype and 16-byte alignment, each
integer's value class (== 1, divisible by 16, fits in int32), the constexpr values and the launch
options. A caller that already knows all of that passes its own ``spec_key`` (a tuple of what
it has at hand) and skips the per-argument key. Anything else (the interpreter, launch hooks set
by a profiler) takes Triton's own path.

The direct call goes to the extension's own launch (``polykernels._C.launch``,
csrc/launch/python_module.cpp) where the kernel is a plain CUDA launch; Triton's C launcher
otherwise, or with ``POLYKERNELS_NATIVE_LAUNCH=0``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
# Triton's names of the integer parameter types (a kernel's compiled signature).
INTEGER_TYPES = frozenset({"i1", "i8", "i16", "i32", "i64", "u1", "u8", "u16", "u32", "u64"})
_SPEC = object()  # marks a caller's spec_key in the cache key: no derived key can equal it


def _arg_key(arg: object) -> object:
    if isinstance(arg, torch.Tensor):
        return (arg.dtype, arg.data_ptr() % 16 == 0)
    if isinstance(arg, bool):
        return ("b", arg)
    if isinstance(arg, int):
        return ("i", arg == 1, arg % 16 == 0, _INT32_MIN <= arg <= _INT32_MAX)
    if isinstance(arg, float):
        return "f"
    return None if arg is None else type(arg)


def _args_key(args: Sequence[object]) -> tuple:
    """``_arg_key`` of every argument, with the two common kinds inline: this runs on every launch."""
    return tuple([
        (arg.dtype, not arg.data_ptr() & 15) if type(arg) is torch.Tensor
        else ("i", arg == 1, not arg % 16, _INT32_MIN <= arg <= _INT32_MAX) if type(arg) is int
        else _arg_key(arg)
        for arg in args
    ])


class Launcher:
    """One Triton kernel: ``launcher(grid, args, meta, spec_key=...)``.

    ``args`` are the kernel's runtime arguments in signature order; ``meta`` maps its constexprs
    plus ``num_warps``/``num_stages`` by name, always one fixed set (a mapping the caller keeps,
    not keyword arguments: unpacking twenty of them cost about 2.5 us per launch).
    """

    def __init__(self, kernel: Any) -> None:
        from triton.runtime.jit import JITFunction

        self.kernel = kernel
        self._compiled: dict[tuple, Callable[..., None]] = {}
        self._kernels: dict[tuple, Any] = {}  # the compiled kernel behind each direct launch
        # Under TRITON_INTERPRET=1 (the CPU tests) kernels are interpreted functions: no cache.
        self._interpreted = not isinstance(kernel, JITFunction)

    def __call__(self, grid: tuple[int, ...], args: Sequence[object], meta: Mapping[str, object], *,
                 spec_key: Hashable | None = None, tensors: Callable[[], Sequence[object]] | None = None,
                 device: int | None = None, scratch: tuple[int, int] | None = None) -> None:
        """``spec_key``: the caller's own key for everything Triton specializes on in ``args`` and
        ``meta`` (every dtype, integer class, 16-byte alignment and constexpr must be a function of
        it), built from what the caller has at hand; without it the key is derived from every
        argument, which costs microseconds per call.

        ``tensors``: for a caller that passes scratch memory as device addresses (ints) in
        ``args``, the same arguments with tensor views in their place. The cached direct launch
        takes addresses; Triton's own launch (a key's first call, the interpreter, launch hooks)
        needs the tensors. Such a caller must pass ``spec_key``.

        ``device``: the index of the GPU the arguments live on, when it may not be the current one
        (a model split over GPUs in one process, no ``torch.cuda.set_device``): the kernel is then
        compiled for and launched on that GPU, under its device guard, not on the current one.

        ``scratch``: (address, bytes a program) of the kernel's global scratch (Triton's, for the tensor
        descriptors a kernel makes on the device), for a kernel that needs it; such a kernel is compiled without
        a launch, checked to need no more than that (``scratch_bytes``), then always launched directly (Triton's
        own launch would allocate the scratch through an allocator the library does not set), launch hooks or
        not."""
        if self._interpreted:
            self.kernel[grid](*(tensors() if tensors is not None else args), **meta)
            return
        current = torch._C._cuda_getDevice()
        if device is not None and device != current:
            with torch.cuda.device(device):
                self(grid, args, meta, spec_key=spec_key, tensors=tensors, scratch=scratch)
            return
        device = current
        key = _spec_entry(device, spec_key) if spec_key is not None else (device, *meta.values(), _args_key(args))
        direct = self._compiled.get(key)
        if scratch is not None:
            if spec_key is None or tensors is None:
                raise ValueError("a launch with global scratch must pass spec_key and tensors")
            if direct is None:
                self.warm(grid, meta, spec_key=spec_key, tensors=tensors)
                direct = self._compiled[key]
            address, held = scratch
            needed = self.scratch_bytes(spec_key)
            if needed > held:
                raise RuntimeError(f"the kernel takes {needed} bytes of global scratch a program; the caller holds "
                                   f"{held}")
            grid3 = (*grid, 1, 1)
            direct(grid3[0], grid3[1], grid3[2], torch._C._cuda_getCurrentRawStream(device), (*args, address))
            return
        if direct is not None and no_launch_hooks():
            grid3 = (*grid, 1, 1)
            direct(grid3[0], grid3[1], grid3[2], torch._C._cuda_getCurrentRawStream(device), args)
            return
        if tensors is not None:
            if spec_key is None:
                raise ValueError("a launch whose arguments hold addresses (tensors=...) must pass spec_key")
            args = tensors()
        self._keep(key, self._launch_fitting(grid, args, meta), args, meta)

    def warm(self, grid: tuple[int, ...], meta: Mapping[str, object], *, spec_key: Hashable,
             tensors: Callable[[], Sequence[object]]) -> None:
        """Compiles and loads the kernel for ``spec_key`` on the current device without launching it
        (a later call launches it directly). For launches that must not wait on a compile or a module
        load: a kernel that another, already running, waits for (the gated delta rule's passes side
        by side; CUDA's lazy loading would make that load wait for the running kernel)."""
        if self._interpreted:
            return
        key = _spec_entry(torch._C._cuda_getDevice(), spec_key)
        if key in self._compiled:
            return
        args = tensors()
        self._keep(key, self.kernel.warmup(*args, grid=grid, **meta), args, meta)

    def _keep(self, key: tuple, compiled: Any, args: Sequence[object], meta: Mapping[str, object]) -> None:
        """The direct launch of a kernel Triton has just compiled (and loaded), for later calls of ``key``."""
        if _is_compiled(compiled):
            self._compiled[key] = _direct_launch(compiled, len(args), constexpr_values(self.kernel, len(args), meta))
            self._kernels[key] = compiled

    def cached(self, spec_key: Hashable) -> Callable[..., None] | None:
        """The direct launch kept for ``spec_key`` on the current device, None before its first call:
        ``call(grid_x, grid_y, grid_z, stream, args)`` (``benchmarks.host_path`` times it alone)."""
        return self._compiled.get(_spec_entry(torch._C._cuda_getDevice(), spec_key))

    def scratch_bytes(self, spec_key: Hashable) -> int:
        """The global scratch a program of the kernel kept for ``spec_key`` needs (0: none, or not compiled)."""
        compiled = self._kernels.get(_spec_entry(torch._C._cuda_getDevice(), spec_key))
        return int(getattr(getattr(compiled, "run", None), "global_scratch_size", 0) or 0)

    def described(self, spec_key: Hashable) -> KernelLaunch | None:
        """What the driver needs to launch the kernel kept for ``spec_key`` on the current device
        (``polykernels._programs`` records it), None before its first call or where that launch
        needs more than a plain driver launch: profile scratch, clusters, cooperative launches,
        tensor descriptors as arguments, or a launcher other than CUDA's. A programmatic-dependent launch
        is described, as ``dependent``; a kernel that takes global scratch, with its ``scratch_bytes``
        a program (its launch passes the scratch's address after the kernel's own arguments)."""
        compiled = self._kernels.get(_spec_entry(torch._C._cuda_getDevice(), spec_key))
        return None if compiled is None else _plain_launch(compiled, dependent_allowed=True)

    def _launch_fitting(self, grid: tuple[int, ...], args: Sequence[object], meta: Mapping[str, object]) -> Any:
        """``kernel[grid](...)``, one pipeline stage fewer while the device's shared memory cannot
        hold the stages asked for: the launch tables are tuned on the H200 (227 KiB per block), an
        MI300X or a consumer GPU has 64-99 KiB. Triton raises before anything runs."""
        from triton.runtime.errors import OutOfResources

        while True:
            try:
                return self.kernel[grid](*args, **meta)
            except OutOfResources as error:
                fewer = fewer_stages(meta)
                if error.name != "shared memory" or fewer is None:
                    raise
                meta = fewer


def constexpr_values(kernel: Any, num_args: int, meta: Mapping[str, object]) -> tuple:
    """``kernel``'s constexpr values in signature order, as the compiled launcher takes them: from ``meta``,
    or else the parameter's default, as the warm-up that compiled the kernel took it."""
    positions = sorted(kernel.constexprs)
    if positions and positions[0] < num_args:
        raise RuntimeError(f"{kernel.fn.__name__}: constexpr parameters must come after the runtime ones")
    values = []
    for position in positions:
        parameter = kernel.params[position]
        if parameter.name in meta:
            values.append(meta[parameter.name])
        elif parameter.has_default:
            values.append(parameter.default)
        else:
            raise TypeError(f"{kernel.fn.__name__}: constexpr {parameter.name!r} was not given and has no default")
    return tuple(values)


@dataclass(frozen=True)
class KernelLaunch:
    """One compiled kernel as the driver launches it: ``types`` holds Triton's type of every
    parameter in signature order (``"constexpr"`` for those the launch leaves out)."""

    function: int
    threads: int
    shared_bytes: int
    types: tuple[str, ...]
    dependent: bool = False  # launched as the previous launch's programmatic dependent (launch_pdl)
    # Triton's global scratch a program takes (device-side tensor descriptors): its address follows the
    # kernel's own parameters, where the driver reads the scratch slot (0: the slot gets null).
    scratch_bytes: int = 0


def _spec_entry(device: int, spec_key: Hashable) -> tuple:
    """A caller's spec_key in the cache; no key derived from the arguments can equal it."""
    return (device, _SPEC, spec_key)


def _plain_launch(compiled: Any, dependent_allowed: bool = False) -> KernelLaunch | None:
    """What the driver needs to launch ``compiled``, or None where that launch needs more than a plain
    driver launch (see ``Launcher.described``). ``dependent_allowed``: a programmatic-dependent launch
    (``launch_pdl``) is described too, as ``dependent`` (the launch programs make it; the extension's
    Python launch does not)."""
    run, metadata = compiled.run, compiled.metadata
    dependent = bool(getattr(run, "launch_pdl", True))
    scratch = getattr(run, "global_scratch_size", None)
    plain = (type(run).__name__ == "CudaLauncher" and isinstance(scratch, int)
             and getattr(run, "profile_scratch_size", 1) == 0 and getattr(metadata, "num_ctas", 1) == 1
             and not getattr(run, "launch_cooperative_grid", True) and (dependent_allowed or not dependent))
    types = tuple(compiled.src.signature.values())
    if not plain or not all(isinstance(t, str) for t in types):
        return None
    num_warps, _, shared = compiled.packed_metadata
    return KernelLaunch(function=compiled.function, threads=32 * num_warps, shared_bytes=shared, types=types,
                        dependent=dependent, scratch_bytes=scratch)


def parameter_kinds(types: Sequence[str], num_args: int) -> bytes | None:
    """``polykernels._C.kernel``'s kinds of a kernel's runtime arguments (its first ``num_args``
    parameters; Triton's type of each): b'p' an address, b'i' an integer, b'f' fp32, b'd' fp64,
    b'x' not passed (an integer Triton specialized into the code). None when one has another type
    (a tensor descriptor, a 16-bit float) or a later parameter is not a constexpr."""
    if any(kind != "constexpr" for kind in types[num_args:]) or len(types) < num_args:
        return None
    codes = []
    for kind in types[:num_args]:
        code = ("p" if kind.startswith("*") else "i" if kind in INTEGER_TYPES else "f" if kind == "fp32"
                else "d" if kind == "fp64" else "x" if kind == "constexpr" else None)
        if code is None:
            return None
        codes.append(code)
    return "".join(codes).encode()


@functools.cache
def native_launch() -> Any | None:
    """The extension's ``launch`` (``polykernels._C``), or None: turned off by
    ``POLYKERNELS_NATIVE_LAUNCH=0``, no GPU backend in the build, or an extension without it."""
    if os.environ.get("POLYKERNELS_NATIVE_LAUNCH", "1") == "0" or torch.version.cuda is None:
        return None
    from polykernels import _extension

    if _extension.unavailable_reason() is not None:
        return None
    try:
        from polykernels import _C
    except ImportError:
        return None
    return _C if _C.has_gpu_launch() else None


def _direct_launch(compiled: Any, num_args: int, constexpr_tail: tuple) -> Callable[..., None]:
    """``call(grid_x, grid_y, grid_z, stream, args)`` for one compiled kernel: the extension's launch
    where it can take the kernel (``native_direct_launch``), else Triton's (``triton_direct_launch``)."""
    direct = native_direct_launch(compiled, num_args)
    return direct if direct is not None else triton_direct_launch(compiled, constexpr_tail)


def native_direct_launch(compiled: Any, num_args: int) -> Callable[..., None] | None:
    """``polykernels._C.launch`` bound to ``compiled``, None where it cannot launch it: a launch that
    is not plain (``_plain_launch``), a parameter type it does not read, or no native launch. Tensors
    go as their ``data_ptr()``; the public ops have checked every tensor's device."""
    native = native_launch()
    plain = _plain_launch(compiled) if native is not None else None
    kinds = parameter_kinds(plain.types, num_args) if plain is not None else None
    if kinds is None:
        return None
    if plain.scratch_bytes:  # the scratch's address, the caller's last argument, in the driver's scratch slot
        kinds += b"p"
    return functools.partial(native.launch, native.kernel(plain.function, plain.threads, plain.shared_bytes, kinds))


def triton_direct_launch(compiled: Any, constexpr_tail: tuple) -> Callable[..., None]:
    """``call(grid_x, grid_y, grid_z, stream, args)`` through Triton's own launcher.

    On CUDA, when the kernel needs no scratch memory, the call goes straight to the launcher's C
    function (its Python wrapper allocates scratch per call) with tensors passed as their addresses:
    for a tensor the C function asks the driver whether the pointer is a device pointer
    (``cuPointerGetAttribute``), one driver call per tensor per launch, for an address it does not.
    The public ops have already checked every tensor's device. Any other launcher (HIP's, a Triton
    release with other fields) takes ``compiled.run``, which does all of that itself.
    """
    run, function, metadata = compiled.run, compiled.function, compiled.packed_metadata
    launch = getattr(run, "launch", None)
    direct = (type(run).__name__ == "CudaLauncher" and launch is not None
              and isinstance(getattr(run, "global_scratch_size", None), int)
              and getattr(run, "profile_scratch_size", 1) == 0)
    if direct and run.global_scratch_size:  # the caller's last argument: the scratch's address
        flags = (run.launch_cooperative_grid, run.launch_pdl)

        def call(grid_x: int, grid_y: int, grid_z: int, stream: int, args: Sequence[object]) -> None:
            launch(grid_x, grid_y, grid_z, stream, function, *flags, args[-1], None, metadata, None, None, None,
                   *[arg.data_ptr() if type(arg) is torch.Tensor else arg for arg in args[:-1]], *constexpr_tail)
    elif direct:
        flags = (run.launch_cooperative_grid, run.launch_pdl, None, None)

        def call(grid_x: int, grid_y: int, grid_z: int, stream: int, args: Sequence[object]) -> None:
            launch(grid_x, grid_y, grid_z, stream, function, *flags, metadata, None, None, None,
                   *[arg.data_ptr() if type(arg) is torch.Tensor else arg for arg in args], *constexpr_tail)
    elif getattr(run, "global_scratch_size", 0):
        raise RuntimeError(f"a kernel with global scratch needs Triton's CUDA launcher, got {type(run).__name__}")
    else:
        def call(grid_x: int, grid_y: int, grid_z: int, stream: int, args: Sequence[object]) -> None:
            run(grid_x, grid_y, grid_z, stream, function, metadata, None, None, None, *args, *constexpr_tail)

    return call


def fewer_stages(options: Mapping[str, Any]) -> dict[str, Any] | None:
    """The launch options with one pipeline stage fewer, or None at one stage: what a launch whose
    shared memory does not fit the device falls back to (here, and in the compile matrix)."""
    stages = int(options.get("num_stages", 1))
    return None if stages <= 1 else {**options, "num_stages": stages - 1}


def _is_compiled(compiled: object) -> bool:
    return all(hasattr(compiled, attr) for attr in ("run", "function", "packed_metadata"))


def no_launch_hooks() -> bool:
    """No launch hook is registered (a profiler such as proton adds some): the direct call skips them."""
    runtime = _runtime_knobs()
    return _empty(runtime.launch_enter_hook) and _empty(runtime.launch_exit_hook)


@functools.cache
def _runtime_knobs() -> Any:
    from triton import knobs

    return knobs.runtime


def _empty(hook: object) -> bool:
    # Triton 3.6 keeps hooks in a HookChain (a list of calls); older releases in a plain attribute.
    return hook is None or not getattr(hook, "calls", True)
