"""Which implementation of the gated delta rule runs: Triton on any GPU (fp32 inputs up to K = 128), torch on CPU."""

from __future__ import annotations

import os

from polykernels import platform
from polykernels.platform import Choice

# fp32 inputs with K above this run the chunked torch implementation on GPUs too. With K = 256 the Triton
# prepare pass's fp32 tiles need more shared memory than a program has on sm_80, sm_86, sm_89, sm_90, sm_120
# and gfx942 (128-256 KiB), the sequential pass's (152 KiB) too on the 99 KiB parts, and the sequential
# passes spill inside their chunk loops wherever they fit (build host: BENCHMARKS.md, "K = 256 with fp32
# inputs"). 16-bit inputs keep the Triton passes up to K = 256.
FP32_TRITON_MAX_KEY_DIM = 128


def choose(device_type: str, fp32_inputs: bool = False, key_dim: int = 0) -> Choice:
    """``Choice.path``: "triton" or "torch", for inputs of ``key_dim`` columns (fp32 or not)."""
    if device_type != "cuda":
        return Choice("torch", f"{device_type} tensors run the chunked torch implementation")
    if not platform.has_triton():
        return Choice("torch", "triton is not installed")
    if fp32_inputs and key_dim > FP32_TRITON_MAX_KEY_DIM:
        return Choice("torch", f"fp32 inputs with K = {key_dim} (above {FP32_TRITON_MAX_KEY_DIM}) run the chunked "
                               "torch implementation on the GPU: the Triton passes' fp32 tiles of that width do "
                               "not fit a program's shared memory, or spill inside their chunk loops where they do "
                               "(guards.FP32_TRITON_MAX_KEY_DIM; bf16 and fp16 inputs run the Triton passes)")
    seen = platform.current()
    return Choice("triton", f"{seen.backend} {seen.arch}: Triton chunked kernels (int64 chunk offsets; fp32 inputs "
                            f"with K above {FP32_TRITON_MAX_KEY_DIM}: the chunked torch implementation): a parallel "
                            "prepare pass, then one sequential pass per (V tile, segment, head) with the "
                            "state on chip; sequences are cut into segments when N x HV x V tiles fill at most half "
                            "the SMs (launch.plan_segments; num_segments= overrides); on sm_90 both passes "
                            "of bf16/fp16 inputs with K = 64 or 128 are Gluon kernels with asynchronous wgmma "
                            "under Triton 3.6 (launch.hopper_pass, hopper_kernels, hopper_prepare_kernels), the "
                            "sequential one with the state in registers at 64-column V tiles of uncut sequences "
                            "and of segments of at least launch.HOPPER_REGISTER_CUT chunks, both segment passes "
                            "there (hopper_register_kernels; two tiles per program of two warpgroups where "
                            "N x HV x V/128 programs still fill the SMs, at K = 128 forming v_new from v and the "
                            "prepare pass's (I + A)^-1 diag(beta): launch.HOPPER_PAIRS_FROM_V, and after the prepare "
                            "pass the scores P from q and k too: launch.HOPPER_PAIRS_SCORES; beside the "
                            "prepare pass, waiting for each "
                            "chunk's ready flag, where its N x HV x V/64 programs leave half the SMs to it, or "
                            "else its N x HV x V/128 pairs do: ready_flags, launch.HOPPER_CONCURRENT_PAIRS); "
                            "each segment state from the segment's last chunks where the gates have decayed "
                            "the rest below 2^-30, the output programs scanning back to the last such window "
                            "(launch.SEGMENT_WINDOWS, launch.HOPPER_SCAN_WINDOWS); without them, for cut "
                            "sequences (batch rows or packed), each sequence's first segment "
                            "through the output pass beside the other segments' segment-state pass, one segment more "
                            "per sequence (packed: as many as fit one wave whatever their lengths), "
                            "each output program scanning the segment states up to its own: "
                            "launch.HOPPER_LEAD_SEGMENT; where its rates estimate it shorter, that first "
                            "segment launched first beside the prepare pass, waiting for each chunk's ready flag, "
                            "and the longer one: launch.HOPPER_LEAD_BESIDE_PREPARE")


def dot_precision(fp32_inputs: bool) -> str:
    """Triton input_precision for the kernels' fp32-operand dots (the combine pass's transitions;
    every product of fp32 inputs in the sequential passes; the prepare pass's come from
    ``prepare_precision``).

    fp32 inputs keep IEEE products (the spec's 1e-4 bound); 16-bit inputs use TF32 where the
    platform has it and three bf16 passes (about as accurate) where it does not (gfx950).
    """
    if fp32_inputs:
        return "ieee"
    if platform.backend() == "rocm" and not platform.has_tf32_dots():
        return "bf16x3"
    return "tf32"  # NVIDIA, gfx942, and the CPU interpreter (which ignores it)


def inverse_precision(fp32_inputs: bool) -> str:
    """Operand precision of the (I + A)^-1 products in the prepare pass (kernels._product) when
    ``prepare_precision`` does not set it (it does for fp32 inputs on NVIDIA GPUs).

    fp32 inputs keep IEEE products. For 16-bit inputs the products round their operands to bf16
    (fp32 accumulation): on the H200 that made the prepare pass 1.19x faster than TF32 and moved
    w and u by 4-5e-4 relative, below the rounding of w and u to the inputs' dtype itself
    (BENCHMARKS.md, "chunk_gated_delta_rule: bf16 products for (I + A)^-1"). bf16 dots exist
    on every target (sm_80+, gfx942, gfx950). Their rounding stays that small because no operand of
    the block doubling (kernels._unit_lower_inverse) is larger than the inverse itself; bf16 keeps
    fp32's range where fp16 would not.
    Triton's CPU interpreter (the CPU tests) multiplies the bit patterns of the bf16 values it
    converts itself, so there the products stay fp32; the GPU tests and the compile matrix
    cover the bf16 products.
    """
    if fp32_inputs or os.environ.get("TRITON_INTERPRET") == "1":
        return "ieee"
    return "bf16"


# Shared memory per program that the prepare pass's three-pass TF32 products with K columns need
# (their split operands; sm_80 and sm_90 compile them at 128 KiB).
TF32X3_PREPARE_SHARED_BYTES = 131072


def prepare_precision(fp32_inputs: bool) -> tuple[str, str]:
    """(DOT_PRECISION, INVERSE_PRECISION) of the prepare pass.

    16-bit inputs: ``dot_precision`` and ``inverse_precision``. fp32 inputs on NVIDIA: three TF32
    passes ("tf32x3": each operand split into its TF32 value and TF32 remainder, the remainders'
    product dropped: about 2^-21 relative per product, far inside the spec's 1e-4), for every
    product where shared memory holds their operands (sm_80, sm_90, sm_100), for the (I + A)^-1
    products alone where it does not (99 KiB parts: sm_86, sm_89, sm_120). IEEE products there are
    unrolled FMA dots that ptxas takes minutes over, and a user's first fp32 call waited through
    that (build host, the prepare pass: sm_90 207 s and 28 KB of local memory per thread against
    16 s with tf32x3; sm_120 202 s against 75 s). AMD and the CPU interpreter keep IEEE products.
    """
    if not fp32_inputs:
        return dot_precision(fp32_inputs=False), inverse_precision(fp32_inputs=False)
    seen = platform.current()
    if seen.backend != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return "ieee", "ieee"
    if platform.SHARED_MEMORY_PER_BLOCK.get(seen.arch or "", 0) >= TF32X3_PREPARE_SHARED_BYTES:
        return "tf32x3", "tf32x3"
    return "ieee", "tf32x3"


def describe() -> dict[str, Choice]:
    return {"chunk_gated_delta_rule": choose("cuda" if platform.current().is_gpu else "cpu")}
