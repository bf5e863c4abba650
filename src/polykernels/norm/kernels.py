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
    L, D,
    stride_shift_b, stride_shift_l, stride_scale_b, stride_scale_l,
    eps,
    BLOCK_D: tl.constexpr,
    IS_RMS: tl.constexpr,
    EXACT_PTX: tl.constexpr,
):
    # Offsets in int64: rows x D passes 2^31 for long FLUX sequences at large batch.
    row = tl.program_id(0).to(tl.int64)
    batch = row // L
    token = row % L
    cols = tl.arange(0, BLOCK_D)
    mask = cols < D
    x = tl.load(X + row * D + cols, mask=mask, other=0.0).to(tl.float32)
    scale = tl.load(SCALE + batch * stride_scale_b + token * stride_scale_l + cols, mask=mask, other=0.0)
    shift = tl.load(SHIFT + batch * stride_shift_b + token * stride_shift_l + cols, mask=mask, other=0.0)
    scale = scale.to(tl.float32)
    shift = shift.to(tl.float32)
    if IS_RMS:
        mean = 0.0
        centered = x
    else:
        mean = tl.sum(x, axis=0) / D
        centered = tl.where(mask, x - mean, 0.0)
    var = tl.sum(centered * centered, axis=0) / D
    if EXACT_PTX:
        rstd = _rsqrt_rn(var + eps)
        normed = _mul_rn(centered, rstd)
        if IS_RMS:
            normed = _mul_rn(normed, tl.load(W + cols, mask=mask, other=0.0).to(tl.float32))
        y = _add_rn(_mul_rn(normed, _add_rn(scale, 1.0)), shift)
    else:
        rstd = tl.math.rsqrt(var + eps)
        normed = centered * rstd
        if IS_RMS:
            normed = normed * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        y = normed * (1.0 + scale) + shift
    tl.store(Y + row * D + cols, y.to(Y.dtype.element_ty), mask=mask)
    tl.store(MEAN + row, mean)
    tl.store(RSTD + row, rstd)


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


def launch_config(block_d: int) -> int:
    """num_warps for a row of ``block_d`` elements: enough threads to keep ~8-16 per thread."""
    if block_d <= 1024:
        return 4
    if block_d <= 4096:
        return 8
    return 16
