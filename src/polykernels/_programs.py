"""Launch programs: an op's Triton launches for one class of call, recorded once and replayed from C++.

An eager call through Python (argument checks, the plan, allocations, two to four launches through
Triton's launcher) costs tens of microseconds of host time, more than a short call's kernels take.
The first call of a class takes that path; its launches are then registered with the extension
(``csrc/launch/program.cu``) under the class: the call's tensors (dtype, device, sizes, strides,
16-byte alignment) and flags. Every later call of the class is one call into C++, which matches the
class, allocates the outputs through torch and launches the kernels on the current stream. Matching
a class that passed the Python checks is the check; anything the class does not capture (a value
inside a tensor, a scalar's range) the caller checks before it asks.

A program may also zero part of an output before its launches (``Zero``: flags a kernel counts on
starting at zero), and a launch may be its predecessor's programmatic dependent (the kernel was
compiled with ``launch_pdl``): it starts once every program of the launch before it has said so,
and runs beside it.

Only plain launches are recorded (``Launcher.described``): NVIDIA's launcher, no profile scratch,
no clusters; a kernel that takes global scratch (device-side tensor descriptors) only with a part of
an output for it (``Step.scratch``). A class that is never recorded (its call clones or converts an
input first) pays one lookup per call before the checked path: the op call, about 10 us on the H200's
host. ROCm builds compile the replay but do not record yet: no AMD GPU has run it.
``POLYKERNELS_LAUNCH_PROGRAMS=0`` turns replay off (every call takes the Python path).
"""

from __future__ import annotations

import functools
import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from polykernels import _extension
from polykernels._launch import INTEGER_TYPES, KernelLaunch, Launcher

_INPUT, _OUTPUT, _CONSTANT, _SCALAR_F32 = 0, 1, 2, 3
# A step's kind (program.cu's Op).
_LAUNCH, _DEPENDENT_LAUNCH, _ZERO = 0, 1, 2


@dataclass(frozen=True)
class OutputPart:
    """An address inside output ``slot`` (a workspace's part), in a recorded launch's arguments."""

    slot: int
    offset: int


@dataclass(frozen=True)
class Scalar:
    """The call's scalar ``slot`` (passed per call, as fp32), in a recorded launch's arguments."""

    slot: int


class Step(NamedTuple):
    """One launch of a call as the Python path issued it."""

    launcher: object  # a Launcher (anything else is not recorded)
    grid: tuple[int, ...]
    args: Sequence[object]  # tensors, ints, floats, OutputPart and Scalar markers
    spec_key: object
    scratch: OutputPart | None = None  # the kernel's global scratch, where it takes some (Launcher.scratch_bytes)


@dataclass(frozen=True)
class Zero:
    """Zeroes ``nbytes`` bytes of output ``slot`` from ``offset``, on the current stream."""

    slot: int
    offset: int
    nbytes: int


@functools.cache
def _ops() -> tuple[Callable[..., Any], Callable[..., Any]] | None:
    """(register, run) of the extension, or None where replay cannot run."""
    if os.environ.get("POLYKERNELS_LAUNCH_PROGRAMS", "1") == "0" or torch.version.cuda is None:
        return None
    if not _extension.has_kernel("program_run", "CUDA"):
        return None
    ops = torch.ops.polykernels
    return ops.program_register.default, ops.program_run.default


def enabled() -> bool:
    return _ops() is not None


def run(tensors: list[torch.Tensor | None], flags: list[int], scalars: list[float]) -> list[torch.Tensor] | None:
    """The outputs of the program registered for this class of call, or None when none is."""
    outputs = _ops()[1](tensors, flags, scalars)
    return outputs or None


def clear() -> None:
    if enabled():
        torch.ops.polykernels.program_clear.default()


def register(tensors: list[torch.Tensor | None], flags: list[int], outputs: Sequence[torch.Tensor], returned: int,
             steps: Sequence[Step | Zero], constants: Sequence[torch.Tensor] = ()) -> bool:
    """Records ``steps`` for the class of ``tensors`` and ``flags``; False (nothing recorded) when a
    step cannot be replayed: a launcher that is not a ``Launcher``, a kernel not compiled for this
    device yet or not a plain launch, or an argument that is none of the call's tensors, its
    outputs, ``constants`` (tensors that outlive the process), a marker or a number.

    The call must have just run these steps on ``tensors[0]``'s device, that device current."""
    ops = _ops()
    first = tensors[0]
    if ops is None or first is None or first.device.index != torch.cuda.current_device():
        return False
    code: list[int] = [len(steps)]
    for step in steps:
        encoded = _encode_step(step, tensors, outputs, constants)
        if encoded is None:
            return False
        code += encoded
    ops[0](tensors, flags, list(outputs), returned, code)
    return True


def _encode_step(step: Step | Zero, tensors: Sequence[torch.Tensor | None], outputs: Sequence[torch.Tensor],
                 constants: Sequence[torch.Tensor]) -> list[int] | None:
    if isinstance(step, Zero):
        return [_ZERO, step.slot, step.offset, step.nbytes]
    encoded = _encode(step, tensors, outputs, constants)
    if encoded is None:
        return None
    dependent = step.launcher.described(step.spec_key).dependent
    return [_DEPENDENT_LAUNCH if dependent else _LAUNCH, *encoded]


def _encode(step: Step, tensors: Sequence[torch.Tensor | None], outputs: Sequence[torch.Tensor],
            constants: Sequence[torch.Tensor]) -> list[int] | None:
    if not isinstance(step.launcher, Launcher):
        return None
    kernel: KernelLaunch | None = step.launcher.described(step.spec_key)
    if kernel is None or len(kernel.types) < len(step.args):
        return None
    parameters: list[int] = []
    for arg, kind in zip(step.args, kernel.types, strict=False):
        if kind == "constexpr":
            continue
        encoded = _parameter(arg, kind, tensors, outputs, constants)
        if encoded is None:
            return None
        parameters += encoded
    if kernel.scratch_bytes:  # its address after the kernel's own parameters: the driver's scratch slot
        if step.scratch is None:
            return None
        parameters += [_OUTPUT, step.scratch.slot, step.scratch.offset]
    grid = (*step.grid, 1, 1)[:3]
    return [kernel.function, *grid, kernel.threads, kernel.shared_bytes, len(parameters) // 3, *parameters]


def _parameter(arg: object, kind: str, tensors: Sequence[torch.Tensor | None], outputs: Sequence[torch.Tensor],
               constants: Sequence[torch.Tensor]) -> tuple[int, int, int] | None:
    """(source, a, b) of one launch parameter, or None when it cannot be replayed."""
    if kind.startswith("*"):
        if isinstance(arg, OutputPart):
            return _OUTPUT, arg.slot, arg.offset
        if isinstance(arg, torch.Tensor):
            for source, pool in ((_INPUT, tensors), (_OUTPUT, outputs)):
                slot = next((i for i, t in enumerate(pool) if t is arg), None)
                if slot is not None:
                    return source, slot, 0
            if any(arg is t for t in constants):
                return _CONSTANT, arg.data_ptr(), 0
        return None
    if kind in INTEGER_TYPES and type(arg) in (int, bool):
        return _CONSTANT, _as_int64(int(arg)), 0
    if kind == "fp32":
        if isinstance(arg, Scalar):
            return _SCALAR_F32, arg.slot, 0
        if type(arg) in (int, float):
            return _CONSTANT, struct.unpack("<I", struct.pack("<f", float(arg)))[0], 0
    return None


def _as_int64(value: int) -> int:
    """An integer argument's bits as the int64 the op's list holds (u64 values past 2^63 wrap)."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value
