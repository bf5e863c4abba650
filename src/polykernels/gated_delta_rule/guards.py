"""Which implementation of the gated delta rule runs: Triton on any GPU, torch on CPU."""

from __future__ import annotations

from polykernels import platform
from polykernels.platform import Choice


def choose(device_type: str) -> Choice:
    """``Choice.path``: "triton" or "torch"."""
    if device_type != "cuda":
        return Choice("torch", f"{device_type} tensors run the chunked torch implementation")
    if not platform.has_triton():
        return Choice("torch", "triton is not installed")
    seen = platform.current()
    return Choice("triton", f"{seen.backend} {seen.arch}: Triton chunked kernels (int64 chunk offsets): a "
                            "parallel prepare pass, then one sequential pass per (V tile, segment, head) with the "
                            "state on chip; sequences are cut into segments when N x HV x V tiles fill at most half "
                            "the SMs (chunk.plan_segments; num_segments= overrides)")


def dot_precision(fp32_inputs: bool) -> str:
    """Triton input_precision for the kernels' fp32-operand dots (the (I + A)^-1 products).

    fp32 inputs keep IEEE products (the spec's 1e-4 bound); 16-bit inputs use TF32 where the
    platform has it and three bf16 passes (about as accurate) where it does not (gfx950).
    """
    if fp32_inputs:
        return "ieee"
    if platform.backend() == "rocm" and not platform.has_tf32_dots():
        return "bf16x3"
    return "tf32"  # NVIDIA, gfx942, and the CPU interpreter (which ignores it)


def describe() -> dict[str, Choice]:
    return {"chunk_gated_delta_rule": choose("cuda" if platform.current().is_gpu else "cpu")}
