"""Which INT4 kernel serves a tensor, and why: data a user can read in `polykernels info`."""

from __future__ import annotations

from dataclasses import dataclass

from polykernels import _extension

GROUP_SIZES = (32, 64, 128, 256)


@dataclass(frozen=True)
class PathChoice:
    path: str  # "cpu-kernel", "gpu-kernel" or "unavailable"
    reason: str

    @property
    def ok(self) -> bool:
        return self.path != "unavailable"


def choose_path(device_type: str) -> PathChoice:
    reason = _extension.unavailable_reason()
    if reason is not None:
        return PathChoice("unavailable", reason)
    if device_type == "cpu":
        return PathChoice("cpu-kernel", "compiled CPU kernel (csrc/int4_qat, stable ABI)")
    if device_type == "cuda":
        if _extension.has_kernel("fake_int4_quant", "CUDA"):
            return PathChoice("gpu-kernel", "compiled CUDA/HIP kernel (csrc/int4_qat, stable ABI)")
        return PathChoice("unavailable", "this wheel was built without GPU kernels (a CPU build); install a GPU wheel")
    return PathChoice("unavailable", f"no INT4 kernel for device type {device_type!r}; use a CPU or GPU tensor")
