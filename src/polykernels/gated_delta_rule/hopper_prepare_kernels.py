"""The parallel pass of the gated delta rule for Hopper (sm_90), in Gluon.

The same pass as ``recurrence_kernels.gdn_prepare_kernel`` (same arguments, same results), for bf16
and fp16 inputs with K = BK on sm_90. A chunk's work is one chain of tensor-core products, and the
Triton kernel runs them one after another (Triton waits for each product as soon as it is issued):
the scores, k k^T, the ten products of (I + A)^-1, then w and u. Here products whose operands
are ready are issued before any is awaited:

1. the scores q k^T and A = (beta k) k^T (both read k^T);
2. (I + A)^-1 = (I + p0)(I + p1)...(I + p5) with p0 = -A, p(i+1) = p(i)^2: each step squares p
   and multiplies the running product by (I + p) from the same copy of p (six steps, where one
   after the other they were ten products); the left operands come from registers;
3. w = Ai (beta gamma k), then u = Ai (beta v) (one accumulator at a time).

q, k and v come in through cp.async (v while the inverse runs) and live in shared memory, not in
registers, between their uses; the outputs leave through a row-major layout in 16-byte stores.
The launch caps registers at 168 (launch.HOPPER_PREPARE): three programs per SM where the Triton
kernel's 255 registers allowed two. On the H200 at B1 T32768 32/32 the pass takes 645 us against
the Triton kernel's 784 (BENCHMARKS.md, "eleventh set", with the variants that were slower).

Offsets: int64 up to each chunk's first element, int32 inside a chunk (as in kernels.py).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy,
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from polykernels.gated_delta_rule.hopper_kernels import _copy_layout, _copy_tile, _mma_layout, _smem_layout

# Element-wise and scalar arithmetic only (no layouts made), so the Triton helpers serve Gluon kernels too.
from polykernels.gated_delta_rule.kernels import CHUNK_INVERSE_LEVELS, _bad, _bad_rows, _chunk_span

_NAN = gl.constexpr(float("nan"))
# (I + A)^-1 of a 64-row chunk: the factors (I + p0) ... (I + p5), one more than the squarings.
_FACTORS = gl.constexpr(CHUNK_INVERSE_LEVELS.value + 1)


@gluon.jit
def _row_rsqrt_norm(x, L2NORM: gl.constexpr):
    """1 / ||row|| as the l2norm in the kernel defines it, or 1 without l2norm (kernels.py's helper
    cannot serve here: Gluon's full needs the layout)."""
    if L2NORM:
        xf = x.to(gl.float32)
        return gl.rsqrt(gl.sum(xf * xf, axis=1) + 1e-6)
    return gl.full([x.shape[0]], 1.0, gl.float32, layout=gl.SliceLayout(1, x.type.layout))


@gluon.jit
def _load_rows(base, rows, cols, length, limit, ROW_STRIDE: gl.constexpr):
    """A chunk's tile of a (token, head, dim) tensor: rows past ``length`` and columns past ``limit`` read 0."""
    mask = (rows < length)[:, None] & (cols < limit)[None, :]
    return gl.load(base + rows[:, None] * ROW_STRIDE + cols[None, :], mask=mask, other=0.0)


@gluon.jit
def _store_rows(base, value, length, limit, ROW_STRIDE: gl.constexpr, ROWS: gl.constexpr, COLS: gl.constexpr):
    """A chunk's tile through a row-major layout: 16-byte stores (the products' layout stores 4 bytes at a time)."""
    layout: gl.constexpr = _copy_layout(COLS)
    rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, COLS, layout=gl.SliceLayout(0, layout))
    mask = (rows < length)[:, None] & (cols < limit)[None, :]
    gl.store(base + rows[:, None] * ROW_STRIDE + cols[None, :], gl.convert_layout(value, layout), mask=mask)


@gluon.jit
def gdn_prepare_hopper_kernel(
    Q_ptr, K_ptr, V_ptr, G_ptr, BETA_ptr, W_ptr, U_ptr, P_ptr, QS_ptr, KS_ptr, DECAY_ptr, CU, CHUNK_OFFSETS,
    T, N, CHUNKS_PER_SEQ, scale,
    H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr,
    BV: gl.constexpr, NV: gl.constexpr, L2NORM: gl.constexpr, VARLEN: gl.constexpr, LOG_N: gl.constexpr,
    DOT_PRECISION: gl.constexpr, INVERSE_PRECISION: gl.constexpr,
):
    gl.static_assert(K == BK, "the Hopper prepare pass takes whole K rows (K a power of two)")
    gl.static_assert(INVERSE_PRECISION == "bf16", "the Hopper prepare pass rounds the inverse's operands to bf16")
    i_c = gl.program_id(0).to(gl.int64)
    i_hv = gl.program_id(1).to(gl.int64)
    i_h = i_hv // (HV // H)
    chunk_start, length = _chunk_span(i_c, CU, CHUNK_OFFSETS, T, N, CHUNKS_PER_SEQ, BT, VARLEN, LOG_N)
    if length > 0:
        _prepare_chunk(Q_ptr, K_ptr, V_ptr, G_ptr, BETA_ptr, W_ptr, U_ptr, P_ptr, QS_ptr, KS_ptr, DECAY_ptr,
                       chunk_start, length.to(gl.int32), i_h, i_hv, scale, H, HV, K, V, BT, BK, BV, NV, L2NORM)


@gluon.jit
def _prepare_chunk(Q_ptr, K_ptr, V_ptr, G_ptr, BETA_ptr, W_ptr, U_ptr, P_ptr, QS_ptr, KS_ptr, DECAY_ptr,
                   chunk_start, length, i_h, i_hv, scale, H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr,
                   V: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr, BV: gl.constexpr, NV: gl.constexpr,
                   L2NORM: gl.constexpr):
    dtype: gl.constexpr = K_ptr.dtype.element_ty
    loads: gl.constexpr = _copy_layout(BK)  # 16-byte loads, a warp spanning whole rows
    square: gl.constexpr = _mma_layout(BT)  # BT x BT products
    wide: gl.constexpr = _mma_layout(BK)  # BT x K products (w)
    value: gl.constexpr = _mma_layout(BV)  # BT x BV products (u)
    row_of = chunk_start * HV + i_hv  # the chunk's first (token, value head) row
    qk_base = (chunk_start * H + i_h) * K

    # 64 KiB at K = V = 128 with the stores' layout changes (q's tile is reused for v): three
    # programs fit an SM's shared memory.
    k_s = gl.allocate_shared_memory(dtype, [BT, BK], _smem_layout(BT, BK))
    q_s = gl.allocate_shared_memory(dtype, [BT, BK], _smem_layout(BT, BK))
    kb_s = gl.allocate_shared_memory(dtype, [BT, BK], _smem_layout(BT, BK))  # beta k, then beta gamma k
    power_s = gl.allocate_shared_memory(gl.bfloat16, [BT, BT], _smem_layout(BT, BT))
    v_s = q_s if BV == BK else gl.allocate_shared_memory(dtype, [BT, BV], _smem_layout(BT, BV))  # v, then beta v

    # Keys, gates and betas; the first non-finite row of k, g or beta ends the chunk's valid rows.
    rows = gl.arange(0, BT, layout=gl.SliceLayout(1, loads))
    # k and q come in together through cp.async (no registers held while in flight), then each is
    # normalized in place.
    _copy_tile(k_s, K_ptr + qk_base, 0, length, 0, K, H * K, BT, BK, False, True)
    _copy_tile(q_s, Q_ptr + qk_base, 0, length, 0, K, H * K, BT, BK, False, True)
    async_copy.commit_group()
    in_chunk = rows < length
    g = gl.load(G_ptr + row_of + rows * HV, mask=in_chunk, other=0.0).to(gl.float32)
    b = gl.load(BETA_ptr + row_of + rows * HV, mask=in_chunk, other=0.0).to(gl.float32)
    async_copy.wait_group(0)
    gl.thread_barrier()  # every thread's part of the tiles is in
    k = k_s.load(loads)
    rk = _row_rsqrt_norm(k, L2NORM)
    first_bad = gl.min(gl.where(_bad_rows(k) | _bad(g) | _bad(b), rows, BT), axis=0)
    keep = rows < first_bad
    k = gl.where(keep[:, None], (k.to(gl.float32) * rk[:, None]).to(dtype), 0.0).to(dtype)
    g, b = gl.where(keep, g, 0.0), gl.where(keep, b, 0.0)
    q = q_s.load(loads)
    gl.thread_barrier()  # every thread has read k before it is overwritten
    k_s.store(k)
    kb_s.store((k.to(gl.float32) * b[:, None]).to(dtype))
    rq = _row_rsqrt_norm(q, L2NORM)
    gl.thread_barrier()
    q_s.store((q.to(gl.float32) * rq[:, None]).to(dtype))
    fence_async_shared()

    # Step 1: the scores and A, both against k^T.
    zero = gl.zeros([BT, BT], gl.float32, layout=square)
    scores = warpgroup_mma(q_s, k_s.permute((1, 0)), zero, use_acc=False, is_async=True)
    a = warpgroup_mma(kb_s, k_s.permute((1, 0)), zero, use_acc=False, is_async=True)
    # Meanwhile: the gate cumsum as a masked row sum in the products' layout, and gamma.
    r = gl.arange(0, BT, layout=gl.SliceLayout(1, square))
    c = gl.arange(0, BT, layout=gl.SliceLayout(0, square))
    g_cols = gl.convert_layout(g, gl.SliceLayout(0, square))
    gc = gl.sum(gl.where(r[:, None] >= c[None, :], g_cols[None, :], 0.0), axis=1)
    gamma = gl.exp(gc[:, None] - gl.convert_layout(gc, gl.SliceLayout(0, square))[None, :])
    scores, a = warpgroup_mma_wait(0, deps=(scores, a))
    # v's first tile comes into q's (now unread) tile while the inverse runs.
    _copy_tile(v_s, V_ptr + row_of * V, 0, length, 0, V, HV * V, BT, BV, False, False)
    async_copy.commit_group()
    scores = gl.where(r[:, None] >= c[None, :], scores * (scale * gamma), 0.0)
    _store_rows(P_ptr + row_of * BT, scores.to(P_ptr.dtype.element_ty), length, BT, HV * BT, BT, BT)

    # Step 2: (I + A)^-1, the squaring of p and the running product issued together. Left operands
    # come from registers; p, the right operand of both, goes through shared memory.
    left: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=square, k_width=2)
    power = gl.where(r[:, None] > c[None, :], -(a * gamma), 0.0)
    inverse = gl.where(r[:, None] == c[None, :], 1.0, 0.0) + power  # (I + p0)
    power_lp = power.to(gl.bfloat16)
    power_s.store(power_lp)
    fence_async_shared()
    power = warpgroup_mma(gl.convert_layout(power_lp, left), power_s, zero, use_acc=False, is_async=True)
    power = warpgroup_mma_wait(0, deps=(power,))  # p1
    for _ in gl.static_range(_FACTORS - 2):  # times (I + p1) ... (I + p4); p2 ... p5
        power_lp = power.to(gl.bfloat16)
        power_s.store(power_lp)
        fence_async_shared()
        power = warpgroup_mma(gl.convert_layout(power_lp, left), power_s, zero, use_acc=False, is_async=True)
        inverse = warpgroup_mma(gl.convert_layout(inverse.to(gl.bfloat16), left), power_s, inverse, is_async=True)
        power, inverse = warpgroup_mma_wait(0, deps=(power, inverse))
    power_s.store(power.to(gl.bfloat16))
    fence_async_shared()
    inverse = warpgroup_mma(gl.convert_layout(inverse.to(gl.bfloat16), left), power_s, inverse, is_async=True)
    inverse = warpgroup_mma_wait(0, deps=(inverse,))
    inverse_lp = gl.convert_layout(inverse.to(dtype), left)

    # Step 3: w = Ai (beta gamma k) and u = Ai (beta v), per V tile. A non-finite v row also ends
    # the chunk's valid rows (the scales below need the final row).
    gc = gl.convert_layout(gc, gl.SliceLayout(1, loads))
    kb_s.store((k_s.load(loads).to(gl.float32) * (b * gl.exp(gc))[:, None]).to(dtype))
    v_cols = gl.arange(0, BV, layout=gl.SliceLayout(0, _copy_layout(BV)))
    v_rows = gl.arange(0, BT, layout=gl.SliceLayout(1, _copy_layout(BV)))
    b_v = gl.convert_layout(b, gl.SliceLayout(1, _copy_layout(BV)))
    first_bad_v = first_bad
    for i_v in gl.static_range(NV):
        if i_v == 0:
            async_copy.wait_group(0)
            gl.thread_barrier()  # every thread's part of the tile is in
            v = v_s.load(_copy_layout(BV))
        else:
            v = _load_rows(V_ptr + row_of * V + i_v * BV, v_rows, v_cols, length, V - i_v * BV, HV * V)
        first_bad_v = gl.minimum(first_bad_v, gl.min(gl.where(_bad_rows(v), v_rows, BT), axis=0))
        gl.thread_barrier()  # every thread has read v before beta v overwrites it
        v_s.store(gl.where((v_rows < first_bad_v)[:, None], v.to(gl.float32) * b_v[:, None], 0.0).to(dtype))
        fence_async_shared()
        if i_v == 0:  # one accumulator at a time: with w's and u's both held the pass spilled
            w = warpgroup_mma(inverse_lp, kb_s, gl.zeros([BT, BK], gl.float32, layout=wide), use_acc=False,
                              is_async=True)
            w = warpgroup_mma_wait(0, deps=(w,))
            _store_rows(W_ptr + row_of * K, w.to(W_ptr.dtype.element_ty), length, K, HV * K, BT, BK)
        u = warpgroup_mma(inverse_lp, v_s, gl.zeros([BT, BV], gl.float32, layout=value), use_acc=False,
                          is_async=True)
        u = warpgroup_mma_wait(0, deps=(u,))
        _store_rows(U_ptr + row_of * V + i_v * BV, u.to(U_ptr.dtype.element_ty), length, V - i_v * BV, HV * V, BT,
                    BV)
    keep = rows < first_bad_v

    # The sequential pass reads raw q and k: their norms, the gates and the masks go in here.
    # Padding rows and rows past a bad one have g = 0: the last row's cumsum is the chunk's total.
    gate_last = gl.sum(gl.where(rows == BT - 1, gc, 0.0), axis=0)
    gl.store(QS_ptr + row_of + rows * HV, gl.where(keep, scale * rq * gl.exp(gc), _NAN), mask=in_chunk)
    gl.store(KS_ptr + row_of + rows * HV, gl.where(keep, rk * gl.exp(gate_last - gc), 0.0), mask=in_chunk)
    gl.store(DECAY_ptr + row_of, gl.where(first_bad_v < BT, _NAN, gl.exp(gate_last)))
