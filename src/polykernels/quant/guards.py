"""Which INT4 kernel serves a tensor, and why: data a user can read in `polykernels info`."""

from __future__ import annotations

from polykernels import _extension, platform
from polykernels.platform import Choice

GROUP_SIZES = (32, 64, 128, 256)


def choose(device_type: str) -> Choice:
    """``Choice.path``: "cpu-kernel", "gpu-kernel" or "unavailable"."""
    reason = _extension.unavailable_reason()
    if reason is not None:
        return Choice("unavailable", reason)
    if device_type == "cpu":
        return Choice("cpu-kernel", "compiled CPU kernel (csrc/int4_qat, stable ABI)")
    if device_type == "cuda":
        if _extension.has_kernel("fake_int4_quant", "CUDA"):
            return Choice("gpu-kernel", "compiled CUDA/HIP kernel (csrc/int4_qat, stable ABI)")
        return Choice("unavailable", "this wheel was built without GPU kernels (a CPU build); install a GPU wheel")
    return Choice("unavailable", f"no INT4 kernel for device type {device_type!r}; use a CPU or GPU tensor")


choose_path = choose  # the name the op module imports


def describe() -> dict[str, Choice]:
    return {"fake_int4_quant": choose("cuda" if platform.current().is_gpu else "cpu")}
