"""Triton kernels for the FLUX norm fusions.

One row kernel serves LayerNorm+modulate and RMSNorm+scale/shift (``IS_RMS``). ``EXACT_PTX``
selects the CUDA-only epilogue written in inline PTX: ``mul.rn``/``add.rn`` keep the compiler
from contracting the modulation into FMAs and ``sqrt.rn``/``div.rn`` give a correctly rounded
rstd, so for the kernel's own statistics the output is bit-identical to PyTorch eager's fp32
arithmetic. AMD's LLVM backend has no ``f`` register class: compiling that specialization for
a gfx target is a fatal LLVM error that ends the process, so ``guards.py`` must keep it off
ROCm before the first launch.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _mul_rn(a, b):
    return tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32,
                                     is_pure=True, pack=1)


@triton.jit
def _add_rn(a, b):
    return tl.inline_asm_elementwise("add.rn.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32,
                                     is_pure=True, pack=1)


@triton.jit
def _rsqrt_rn(a):
    return tl.inline_asm_elementwise(
        "{ .reg .f32 r; sqrt.rn.f32 r, $1; div.rn.f32 $0, 0f3F800000, r; }", "=f,f", [a],
        dtype=tl.float32, is_pure=True, pack=1,
    )


@triton.jit
def norm_modulate_kernel(
    X, Y, W, SHIFT, SCALE, MEAN, RSTD,
    rows, L, D,
    stride_shift_b, stride_shift_l, stride_scale_b, stride_scale_l,
    eps,
    BLOCK_D: tl.constexpr,
    ROWS: tl.constexpr,
    IS_RMS: tl.constexpr,
    EXACT_PTX: tl.constexpr,
    PER_SAMPLE: tl.constexpr,
    STORE_STATS: tl.constexpr,
    STAGES: tl.constexpr,
):
    # PER_SAMPLE (shift/scale per sample): grid (programs, samples); a program loads its sample's
    # 1 + scale, shift (and weight) once and steps through that sample's row blocks pid, pid +
    # programs, ..., with the next blocks' loads in flight (STAGES). Reloading the modulation for
    # every block cost 10% at FLUX's sizes. Else grid (programs, 1) over all rows, modulation per row.
    # x is read once and y written once: streaming cache hints keep them from evicting the rest.
    # Offsets in int64 (row is int64): rows x D passes 2^31 for long FLUX sequences at large batch.
    cols = tl.arange(0, BLOCK_D)
    col_mask = cols < D
    if IS_RMS:
        weight = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)[None, :]
    else:
        weight = tl.zeros([1, BLOCK_D], dtype=tl.float32)
    batch = tl.program_id(1).to(tl.int64)  # 0 unless PER_SAMPLE
    first_row = batch * L
    if PER_SAMPLE:
        span = L
        sample_scale = tl.load(SCALE + batch * stride_scale_b + cols, mask=col_mask, other=0.0)
        sample_shift = tl.load(SHIFT + batch * stride_shift_b + cols, mask=col_mask, other=0.0)
        sample_gain = _gain(sample_scale.to(tl.float32)[None, :], weight, IS_RMS, EXACT_PTX)
        sample_shift = sample_shift.to(tl.float32)[None, :]
    else:
        span = rows
    for block in tl.range(tl.program_id(0), tl.cdiv(span, ROWS), tl.num_programs(0), num_stages=STAGES):
        local = block * ROWS + tl.arange(0, ROWS)
        row = first_row + local.to(tl.int64)
        row_mask = local < span
        mask = row_mask[:, None] & col_mask[None, :]
        x = tl.load(X + row[:, None] * D + cols[None, :], mask=mask, other=0.0,
                    eviction_policy="evict_first").to(tl.float32)
        if PER_SAMPLE:
            gain = sample_gain
            shift = sample_shift
        else:
            scale_at = (row // L) * stride_scale_b + (row % L) * stride_scale_l
            shift_at = (row // L) * stride_shift_b + (row % L) * stride_shift_l
            scale = tl.load(SCALE + scale_at[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            shift = tl.load(SHIFT + shift_at[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            gain = _gain(scale, weight, IS_RMS, EXACT_PTX)
        y, mean, rstd = _norm_rows(x, mask, gain, shift, weight, D, eps, ROWS, IS_RMS, EXACT_PTX)
        tl.store(Y + row[:, None] * D + cols[None, :], y.to(Y.dtype.element_ty), mask=mask, cache_modifier=".cs")
        if STORE_STATS:
            tl.store(MEAN + row, mean, mask=row_mask)
            tl.store(RSTD + row, rstd, mask=row_mask)


@triton.jit
def _gain(scale, weight, IS_RMS: tl.constexpr, EXACT_PTX: tl.constexpr):
    """What the normalized row is multiplied by: 1 + scale; the portable RMSNorm folds its weight in.

    The exact epilogue multiplies by the weight apart, as eager does, so the gain is 1 + scale alone.
    """
    if EXACT_PTX:
        return _add_rn(scale, 1.0)
    if IS_RMS:
        return (1.0 + scale) * weight
    return 1.0 + scale


@triton.jit
def _norm_rows(x, mask, gain, shift, weight, D, eps, ROWS: tl.constexpr, IS_RMS: tl.constexpr,
               EXACT_PTX: tl.constexpr):
    """(y, mean, rstd) of ROWS rows of x; mean is 0 for RMSNorm."""
    if IS_RMS:
        mean = tl.zeros([ROWS], dtype=tl.float32)
        centered = x
    else:
        mean = tl.sum(x, axis=1) / D
        centered = tl.where(mask, x - mean[:, None], 0.0)
    var = tl.sum(centered * centered, axis=1) / D
    if EXACT_PTX:
        rstd = _rsqrt_rn(var + eps)
        normed = _mul_rn(centered, rstd[:, None])
        if IS_RMS:
            normed = _mul_rn(normed, weight)
        y = _add_rn(_mul_rn(normed, gain), shift)
    else:
        rstd = tl.math.rsqrt(var + eps)
        y = centered * rstd[:, None] * gain + shift
    return y, mean, rstd


@triton.jit
def _rmsnorm_rows(X, Y, W, first_row, num_rows, head_dim, eps, ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    rows = first_row + tl.arange(0, ROWS).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    mask = (rows[:, None] < num_rows) & (cols[None, :] < head_dim)
    offsets = rows[:, None] * head_dim + cols[None, :]
    x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(x * x, axis=1) / head_dim + eps)
    w = tl.load(W + cols, mask=cols < head_dim, other=0.0).to(tl.float32)
    y = x * rstd[:, None] * w[None, :]
    tl.store(Y + offsets, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def qk_rmsnorm_kernel(
    Q, K, WQ, WK, QO, KO, q_rows, k_rows, head_dim, eps, ROWS: tl.constexpr, BLOCK_D: tl.constexpr
):
    # Axis 1 picks the tensor: q and k are normalized in one launch.
    first_row = tl.program_id(0).to(tl.int64) * ROWS
    if tl.program_id(1) == 0:
        _rmsnorm_rows(Q, QO, WQ, first_row, q_rows, head_dim, eps, ROWS, BLOCK_D)
    else:
        _rmsnorm_rows(K, KO, WK, first_row, k_rows, head_dim, eps, ROWS, BLOCK_D)


# (ROWS, num_warps) per padded row width: several rows per program at small D, so a program
# moves enough bytes; more warps at large D, so each thread holds about 16 elements per row.
# Chosen on the H200 (BENCHMARKS.md, "norm launch table").
NORM_LAUNCH: dict[int, tuple[int, int]] = {
    16: (64, 4), 32: (64, 4), 64: (32, 4), 128: (16, 4), 256: (8, 4), 512: (4, 4), 1024: (4, 4),
    2048: (4, 8), 4096: (4, 8), 8192: (2, 16), 16384: (1, 16),
}
# The modulated norms on inputs of at least PERSISTENT_MIN_ROWS_PER_SM rows per SM: (ROWS,
# num_warps, programs per SM, STAGES): a grid of a few programs per SM, each stepping through row
# blocks with the next blocks' loads in flight. H200 sweep at D 3072 (BENCHMARKS.md, "FLUX norms:
# a persistent grid" and "per-sample programs"): 9-10% less GPU time than one program per block at
# B4 L4608 and B2 L4096, 9% at B1 L4608; slower at B1 L1024 (1024 rows), hence the threshold.
NORM_PERSISTENT: dict[int, tuple[int, int, int, int]] = {4096: (2, 8, 2, 3)}
PERSISTENT_MIN_ROWS_PER_SM = 16
# num_warps -> register cap per thread on CUDA (Triton's ``maxnreg``), so two programs share an SM.
# Uncapped, the exact RMSNorm's 4-row, 8-warp program took 157 registers: one program per SM, and
# B1 L1024's 256 programs ran in two waves on 132 SMs; capped, 0.0054 -> 0.0042 ms on the H200
# (BENCHMARKS.md, "eleventh set"). ROCm launches take no such option.
NORM_MAX_REGISTERS_CUDA: dict[int, int] = {8: 128}


def register_cap(num_warps: int, backend: str) -> dict[str, int]:
    """The launch option capping registers per thread (``{"maxnreg": n}``), or {} where none applies."""
    cap = NORM_MAX_REGISTERS_CUDA.get(num_warps) if backend == "cuda" else None
    return {"maxnreg": cap} if cap else {}


def launch_config(block_d: int) -> tuple[int, int]:
    """(rows per program, num_warps) for rows of ``block_d`` (a power of two) elements."""
    return NORM_LAUNCH[max(16, block_d)]


def modulated_launch_config(block_d: int, rows: int, sm_count: int) -> tuple[int, int, int, int]:
    """(rows per block, num_warps, programs in all or 0 for one per block, stages) of the modulated norms."""
    persistent = NORM_PERSISTENT.get(max(16, block_d))
    if persistent is not None and rows >= PERSISTENT_MIN_ROWS_PER_SM * sm_count:
        rows_per_block, num_warps, per_sm, stages = persistent
        return rows_per_block, num_warps, per_sm * sm_count, stages
    rows_per_block, num_warps = launch_config(block_d)
    return rows_per_block, num_warps, 0, 1
