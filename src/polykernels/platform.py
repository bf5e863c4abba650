"""What polykernels is running on: backend, device arch, warp size and capabilities.

Decided lazily from torch and cached: the device is first queried when a guard first needs it
(before the first launch) or by `polykernels info`, never at import, so a process that imports
polykernels can still fork workers that use the GPU. Every capability is a function to call
(``has_inline_ptx()``), never a module constant, so a test can swap the platform with
``use(...)`` and nothing goes stale. ``Choice`` is what every op family's guard returns.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

Backend = Literal["cuda", "rocm", "cpu"]


@dataclass(frozen=True)
class Choice:
    """Which implementation an op takes here, and why: read by the launcher, `polykernels info`
    and the compile matrix alike."""

    path: str  # e.g. "ptx", "triton", "torch", "cpu-kernel", "gpu-kernel", "unavailable"
    reason: str

    @property
    def ok(self) -> bool:
        return self.path != "unavailable"


@dataclass(frozen=True, kw_only=True)
class Platform:
    backend: Backend
    arch: str | None  # "sm_90", "gfx942", None on CPU
    device_name: str | None
    warp_size: int
    runtime_version: str | None  # torch.version.cuda or torch.version.hip

    @property
    def is_gpu(self) -> bool:
        return self.backend != "cpu"


def detect(torch_module: Any, device_index: int = 0) -> Platform:
    """Read the platform off a torch module (the real one, or a fake in tests)."""
    hip = getattr(torch_module.version, "hip", None)
    cuda = getattr(torch_module.version, "cuda", None)
    if not torch_module.cuda.is_available():
        return Platform(backend="cpu", arch=None, device_name=None, warp_size=1, runtime_version=None)
    props = torch_module.cuda.get_device_properties(device_index)
    if hip:
        arch = str(getattr(props, "gcnArchName", "")).split(":")[0] or None
        warp = int(getattr(props, "warp_size", 64))
        return Platform(backend="rocm", arch=arch, device_name=props.name, warp_size=warp, runtime_version=hip)
    warp = int(getattr(props, "warp_size", 32))
    return Platform(
        backend="cuda",
        arch=f"sm_{props.major}{props.minor}",
        device_name=props.name,
        warp_size=warp,
        runtime_version=cuda,
    )


_override: Platform | None = None


@functools.cache
def _detected() -> Platform:
    import torch

    from polykernels import _manifest

    seen = detect(torch)
    _manifest.check_device(_manifest.load_build_info(), seen)  # the arch check, at first use of the device
    return seen


def compiled_for() -> Platform:
    """The platform torch was built for, from ``torch.version`` alone (no device query): what the
    import-time check compares the wheel with."""
    import torch

    hip, cuda = getattr(torch.version, "hip", None), getattr(torch.version, "cuda", None)
    backend: Backend = "rocm" if hip else "cuda" if cuda else "cpu"
    return Platform(backend=backend, arch=None, device_name=None, warp_size=64 if hip else 32 if cuda else 1,
                    runtime_version=hip or cuda)


# Shared memory one program may use (bytes, the opt-in maximum per block), per GPU architecture:
# what Triton checks a compiled kernel against at launch. The compile matrix reads it for the
# targets it builds for, without a GPU (the launcher learns it from the device).
SHARED_MEMORY_PER_BLOCK: dict[str, int] = {
    "sm_80": 166912, "sm_86": 101376, "sm_87": 166912, "sm_89": 101376, "sm_90": 232448, "sm_100": 232448,
    "sm_103": 232448, "sm_120": 101376, "sm_121": 101376,
    "gfx90a": 65536, "gfx942": 65536, "gfx950": 163840,
}


def for_triton_target(target: str) -> Platform:
    """The platform a Triton target ("cuda:90", "hip:gfx942") stands for: the compile matrix asks
    each family's guard about it."""
    backend, arch = target.split(":", maxsplit=1)
    if backend == "cuda":
        return Platform(backend="cuda", arch=f"sm_{arch}", device_name=None, warp_size=32, runtime_version=None)
    if backend == "hip":
        return Platform(backend="rocm", arch=arch, device_name=None, warp_size=64, runtime_version=None)
    raise ValueError(f"unknown Triton target {target!r}; expected cuda:NN or hip:gfxNNN")


def current() -> Platform:
    """The platform of the current process (device 0), detected once."""
    return _override if _override is not None else _detected()


@contextlib.contextmanager
def use(platform: Platform) -> Iterator[Platform]:
    """Run as if on ``platform``: the compile matrix asks guards about each target this way (and tests do)."""
    global _override
    previous, _override = _override, platform
    try:
        yield platform
    finally:
        _override = previous


def backend() -> Backend:
    return current().backend


def arch() -> str | None:
    return current().arch


def warp_size() -> int:
    return current().warp_size


def has_inline_ptx() -> bool:
    """NVIDIA inline PTX can be compiled: only the CUDA backend (AMD's LLVM has no `f` registers)."""
    return current().backend == "cuda"


def has_tf32_dots() -> bool:
    """Triton accepts input_precision="tf32" here: NVIDIA, and AMD CDNA3 (gfx942, as XF32) only.

    MI355X (gfx950) has no XF32: asking for tf32 there fails at the first compile.
    """
    seen = current()
    return seen.backend == "cuda" or (seen.backend == "rocm" and seen.arch == "gfx942")


def has_triton() -> bool:
    return _triton_installed()


@functools.cache
def _triton_installed() -> bool:
    # Looked up once: a package search costs about as much as a kernel launch.
    return importlib.util.find_spec("triton") is not None


def sm_count(device: Any) -> int:
    """Multiprocessors (CUs on AMD) a launch on ``device`` should fill; a CPU tensor's device (the
    Triton interpreter) counts one, so launch rules that fill the GPU stay exercised in the tests."""
    if device.type != "cuda":
        return 1
    import torch

    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _sm_count(device_index: int) -> int:
    import torch

    return torch.cuda.get_device_properties(device_index).multi_processor_count


def dram_gbps(device: Any) -> float | None:
    """The peak DRAM bandwidth of ``device`` in GB/s (memory clock x bus width, double data rate),
    from Triton's driver; None on a CPU, without Triton, or where the driver lacks either figure (the plan
    then takes its choice for unknown GPUs). ROCm devices are "cuda" devices to torch: HIP's figures count."""
    if device.type != "cuda" or not has_triton():
        return None
    import torch

    return _dram_gbps(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _dram_gbps(device_index: int) -> float | None:
    from triton.runtime import driver

    props = driver.active.utils.get_device_properties(device_index)
    clock_khz, bus_bits = props.get("mem_clock_rate", 0), props.get("mem_bus_width", 0)
    return 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9 if clock_khz > 0 and bus_bits > 0 else None


def has_triton_gpu() -> bool:
    """Triton kernels can be launched here: a GPU and the triton package."""
    return current().is_gpu and has_triton()


CAPABILITIES = {
    "inline_ptx": has_inline_ptx,
    "tf32_dots": has_tf32_dots,
    "triton": has_triton,
    "triton_gpu": has_triton_gpu,
}
