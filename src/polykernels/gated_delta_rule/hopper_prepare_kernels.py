"""The parallel pass of the gated delta rule for Hopper (sm_90), in Gluon.

The same pass as ``recurrence_kernels.gdn_prepare_kernel`` (same arguments, same results up to
rounding), for bf16 and fp16 inputs with K = BK on sm_90. A chunk's work is one chain of
tensor-core products, and the Triton kernel runs them one after another (Triton waits for each
product as soon as it is issued): the scores, k k^T, the ten products of (I + A)^-1, then w and u.
Here products whose operands are ready are issued before any is awaited:

1. k k^T and the scores q k^T, straight from the tiles cp.async brought in;
2. (I + A)^-1 by block doubling (``kernels._unit_lower_inverse``): each level's two products, the
   inverse so far and z = -rest times (I - N), are issued together from the same copy of -N; the left
   operands come from registers. With WARP_BLOCKS the levels that join blocks of 1 to 8 rows run
   inside each warp on its 16 x 16 diagonal block (``hopper_inverse_kernels``: warp-level products,
   no shared memory or barrier), then z = -rest at blocks of 16 rows is -A times their inverse: three
   steps through shared memory where there were six (B8 T4096 -3.2% on an H200, BENCHMARKS.md,
   "thirty-third set"). The launch asks for it where the pass runs alone
   (launch.HOPPER_WARP_BLOCK_INVERSE), and beside the sequential pass (CONCURRENT) only where the
   GPU's DRAM keeps up with a prepare pass that runs further ahead (launch.concurrent_warp_blocks:
   -8.5% at B1 T32768 32/32 on an H200, +13.1% on an H100);
3. w = (Ai diag(beta gamma / ||k||)) k, then u = (Ai diag(beta)) v (one accumulator at a time).

q, k and v never pass through registers on their way to the products (with the l2norm in the
kernel q's tile is also read for its norms, beside the products): the l2norm, beta and the gates
scale the products' rows and columns (A = diag(beta / ||k||) k k^T diag(1 / ||k||)) and the
inverse's columns instead of the tiles, in fp32 (the Triton kernel rounds the scaled tiles to
16 bits first: this pass is the more accurate). The gates and the row and column scales of each
product meet in one exponent per element (2^(a_r - b_c), the scales as base-2 logarithms): one
FADD, MUFU and FMUL where exp and three products took six or more (BENCHMARKS.md, "twenty-seventh
set": the op 0.1-1.9% faster on the H200). Non-finite rows, which end a chunk's valid rows,
show up in the products (||k||^2 on k k^T's diagonal, any element of u); only then are the tiles
read row by row. The outputs leave through a row-major layout in 16-byte stores. The launch caps
registers at 168 (launch.HOPPER_PREPARE): three programs per SM where the Triton kernel's 255
registers allowed two; at 128 where the pass stores T and the score exponents only
(launch.HOPPER_PREPARE_SCORES): four. Programs run the value heads of a chunk one after another
(``kernels._chunk_program``), and v's tile is copied at the top beside q's and k's: on the H200 at
B1 T32768 32/32 the pass takes 456 us, where it took 549-553 with programs in chunk order and v
copied after the first products (BENCHMARKS.md, "sixteenth set"; the Triton kernel: 748 us).

With STORE_T (launch.HOPPER_PAIRS_FROM_V) the pass stores T = Ai diag(beta) in w's place and k's
per-token factor in w in u's, and neither reads v nor forms w and u: the register-state pairs form
v_new from v and T themselves. With SCORE_FACTORS too (launch.HOPPER_PAIRS_SCORES, the pairs after this
pass) it forms no scores either: it stores each token's two exponents of P (its row's, q's norm, the
scale and the gates' cumsum; its column's, k's norm and the cumsum, +inf past the valid rows) in P's
place, and the pairs form P from them and the q and k tiles they copy anyway. q is then read for its
norms only, and not at all without the l2norm in the kernel.

With CONCURRENT the pass runs beside the register-state sequential pass, as that launch's
programmatic dependent: each program raises its (chunk, value head)'s ready flag after its stores,
and the last program to finish waits for the sequential pass to finish too (ready_flags).

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

from polykernels.gated_delta_rule.hopper_inverse_kernels import (
    BLOCK_LEVELS,
    block_diagonal,
    block_inverses,
    minus_a_blocks,
)
from polykernels.gated_delta_rule.hopper_kernels import _copy_layout, _copy_tile, _mma_layout, _smem_layout

# Element-wise and scalar arithmetic only (no layouts made), so the Triton helpers serve Gluon kernels too.
from polykernels.gated_delta_rule.kernels import (
    CHUNK_INVERSE_LEVELS,
    _bad,
    _bad_rows,
    _chunk_program,
    _chunk_span,
    _doubling_step,
    _flag_slots,
    _nan,
    _ready_slot,
)
from polykernels.gated_delta_rule.ready_flags import end_after_leader, raise_flag

_INF = gl.constexpr(float("inf"))
_LOG2E = gl.constexpr(1.4426950408889634)


@gluon.jit
def _exp2(x):
    """2^x, one MUFU.EX2 (results below fp32's normal range flush to zero, as scores and gates may)."""
    return gl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=gl.float32, is_pure=True,
                                     pack=1)


@gluon.jit
def gated_scores(qk, s_r, b_c, r, c):
    """P from q k^T: qk_rc 2^(s_r - b_c) where r >= c, else 0 (s_r: a row's exponent, the scale, q's norm and
    the gates' cumsum as log2; b_c: a column's, k's norm and the cumsum, +inf past the valid rows). Both
    passes that form P take it from here (the pairs with launch.HOPPER_PAIRS_SCORES), so P's bits agree."""
    return gl.where(r[:, None] >= c[None, :], qk * _exp2(s_r[:, None] - b_c[None, :]), 0.0)


@gluon.jit
def chunk_scales(chunk_start, length, i_hv, HV: gl.constexpr):
    """Where a chunk's per-token scales start with SCORE_FACTORS (in P's place, launch.HOPPER_PAIRS_SCORES): for
    each value head eight parts of ``length`` floats, each part's tokens contiguous (q's scale, k's, w's factor of
    k, none, the scores' row exponent, their column exponent, none, none), the heads one after another from
    chunk_start x 8 HV. The pairs forming P copy each part a line per warp, where a token-major [tokens, heads]
    vector is a line per token (the copy's 32 lanes a wavefront each in the shared-memory queue, ncu:
    BENCHMARKS.md, "forty-sixth set"). The windowed segment states before those pairs read them here too
    (hopper_register_kernels, CHUNK_SCALES): no token-major copy is stored."""
    return chunk_start * (8 * HV) + i_hv * (8 * length)


@gluon.jit
def _bf16_pairs(x):
    """x in bf16, two elements per cvt.rn.bf16x2.f32, opaque to LLVM: a doubling step (a select of z)
    converted with ``.to`` became a conversion of z (shared with z's own) followed by a select and a
    repacking per element, 80 instructions of each level's chain where the select and this take 48."""
    return gl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,f,f", [x], dtype=gl.bfloat16,
                                     is_pure=True, pack=2)


@gluon.jit
def _diagonal(product, r, c):
    """The diagonal of a square product, one value per row (r, c: its row and column indices)."""
    return gl.sum(gl.where(r[:, None] == c[None, :], product, 0.0), axis=1)


@gluon.jit
def _inverse_row_norm(gram, r, c, L2NORM: gl.constexpr):
    """1 / ||row|| (the l2norm in the kernel) from the rows' Gram product, or 1 without l2norm."""
    if L2NORM:
        return gl.rsqrt(_diagonal(gram, r, c) + 1e-6)
    return gl.full([r.shape[0]], 1.0, gl.float32, layout=r.type.layout)


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
    Q_ptr, K_ptr, V_ptr, G_ptr, BETA_ptr, W_ptr, U_ptr, P_ptr, QS_ptr, KS_ptr, DECAY_ptr, CU,
    T, N, CHUNKS_PER_SEQ, scale, FLAGS, SEQUENTIAL_PROGRAMS,
    H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr,
    BV: gl.constexpr, NV: gl.constexpr, L2NORM: gl.constexpr, VARLEN: gl.constexpr, LOG_N: gl.constexpr,
    DOT_PRECISION: gl.constexpr, INVERSE_PRECISION: gl.constexpr, CONCURRENT: gl.constexpr,
    STORE_T: gl.constexpr = False, WARP_BLOCKS: gl.constexpr = False, GROWTH: gl.constexpr = False,
    SCORE_FACTORS: gl.constexpr = False,
):
    gl.static_assert(K == BK, "the Hopper prepare pass takes whole K rows (K a power of two)")
    gl.static_assert(INVERSE_PRECISION == "bf16", "the Hopper prepare pass rounds the inverse's operands to bf16")
    gl.static_assert(STORE_T or not SCORE_FACTORS, "SCORE_FACTORS: the pairs form P where they form v_new (STORE_T)")
    i_c, i_hv = _chunk_program(gl.program_id(0), gl.program_id(1), gl.num_programs(0), HV)
    if CONCURRENT:  # every sequence's chunk c before any sequence's chunk c + 1, as the chains beside need them
        # In int32 (slots are far fewer than 2^31): in int64 ptxas serialized the whole-level form's products
        # for want of registers (the compile matrix's check).
        i_c = _ready_slot(i_c.to(gl.int32), gl.num_programs(0), N).to(gl.int64)
    i_h = i_hv // (HV // H)
    chunk_start, length = _chunk_span(i_c, CU, T, N, CHUNKS_PER_SEQ, BT, VARLEN, LOG_N)
    if length > 0:
        _prepare_chunk(Q_ptr, K_ptr, V_ptr, G_ptr, BETA_ptr, W_ptr, U_ptr, P_ptr, QS_ptr, KS_ptr, DECAY_ptr,
                       chunk_start, length.to(gl.int32), i_h, i_hv, scale, H, HV, K, V, BT, BK, BV, NV, L2NORM,
                       STORE_T, WARP_BLOCKS, GROWTH, SCORE_FACTORS)
    if CONCURRENT:  # the sequential pass runs beside this one and waits for this chunk (ready_flags)
        slots = _flag_slots(T, N, CHUNKS_PER_SEQ, BT, VARLEN)
        if i_c < slots:  # packed sequences: the grid's last row may run past the slots
            raise_flag(FLAGS + i_c * HV + i_hv)
        counters = FLAGS + slots * HV
        end_after_leader(counters, counters + 1, gl.num_programs(0) * gl.num_programs(1), SEQUENTIAL_PROGRAMS)


@gluon.jit
def _prepare_chunk(Q_ptr, K_ptr, V_ptr, G_ptr, BETA_ptr, W_ptr, U_ptr, P_ptr, QS_ptr, KS_ptr, DECAY_ptr,
                   chunk_start, length, i_h, i_hv, scale, H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr,
                   V: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr, BV: gl.constexpr, NV: gl.constexpr,
                   L2NORM: gl.constexpr, STORE_T: gl.constexpr, WARP_BLOCKS: gl.constexpr, GROWTH: gl.constexpr,
                   SCORE_FACTORS: gl.constexpr):
    dtype: gl.constexpr = K_ptr.dtype.element_ty
    square: gl.constexpr = _mma_layout(BT)  # BT x BT products
    wide: gl.constexpr = _mma_layout(BK)  # BT x K products (w)
    value: gl.constexpr = _mma_layout(BV)  # BT x BV products (u)
    row_of = chunk_start * HV + i_hv  # the chunk's first (token, value head) row
    qk_base = (chunk_start * H + i_h) * K

    # 56 KiB at K = V = 128 with the stores' layout changes: three programs per SM, as the registers allow.
    k_s = gl.allocate_shared_memory(dtype, [BT, BK], _smem_layout(BT, BK))
    q_s = gl.allocate_shared_memory(dtype, [BT, BK], _smem_layout(BT, BK))
    v_s = gl.allocate_shared_memory(dtype, [BT, BV], _smem_layout(BT, BV))
    step_s = gl.allocate_shared_memory(gl.bfloat16, [BT, BT], _smem_layout(BT, BT))

    # q and k go from cp.async straight into the products: their norms, beta and the gates scale the
    # products' rows and columns (and (I + A)^-1's columns) instead of the tiles.
    _copy_tile(k_s, K_ptr + qk_base, 0, length, 0, K, H * K, BT, BK, False, True)
    if L2NORM or not SCORE_FACTORS:  # with SCORE_FACTORS q's tile is read for its norms only
        _copy_tile(q_s, Q_ptr + qk_base, 0, length, 0, K, H * K, BT, BK, False, True)
    async_copy.commit_group()
    # v's first tile is on its way behind them: issued after the first products (into q's tile), its
    # copies held up the inverse's first step.
    if not STORE_T:
        _copy_tile(v_s, V_ptr + row_of * V, 0, length, 0, V, HV * V, BT, BV, False, False)
    async_copy.commit_group()
    r = gl.arange(0, BT, layout=gl.SliceLayout(1, square))
    c = gl.arange(0, BT, layout=gl.SliceLayout(0, square))
    g_c = gl.load(G_ptr + row_of + c * HV, mask=c < length, other=0.0).to(gl.float32)
    g_r = gl.load(G_ptr + row_of + r * HV, mask=r < length, other=0.0).to(gl.float32)
    b_r = gl.load(BETA_ptr + row_of + r * HV, mask=r < length, other=0.0).to(gl.float32)
    async_copy.wait_group(1)  # q and k (v may still be on its way)
    fence_async_shared()
    gl.thread_barrier()  # every thread's part of the tiles is in

    # Step 1: k k^T and the scores q k^T, from the tiles as they came in.
    zero = gl.zeros([BT, BT], gl.float32, layout=square)
    kk = warpgroup_mma(k_s, k_s.permute((1, 0)), zero, use_acc=False, is_async=True)
    if not SCORE_FACTORS:
        scores = warpgroup_mma(q_s, k_s.permute((1, 0)), zero, use_acc=False, is_async=True)
    # Meanwhile: the gate cumsum as a masked row sum in the products' layout, and (l2norm) q's norms
    # (a third product for them held the pass's registers past its cap).
    gc = gl.sum(gl.where(r[:, None] >= c[None, :], g_c[None, :], 0.0), axis=1)
    # The chunk's gate total (padding rows have g = 0), summed within each warp where g_c's columns
    # lie: the last row's cumsum would take a reduction across warps.
    gate_last = gl.sum(g_c, axis=0)
    loads: gl.constexpr = _copy_layout(BK)
    if L2NORM:
        q = q_s.load(loads).to(gl.float32)
        rq = gl.convert_layout(gl.rsqrt(gl.sum(q * q, axis=1) + 1e-6), gl.SliceLayout(1, square))
    else:
        rq = gl.full([BT], 1.0, gl.float32, layout=gl.SliceLayout(1, square))
    if SCORE_FACTORS:
        kk = warpgroup_mma_wait(0, deps=(kk,))
    else:
        kk, scores = warpgroup_mma_wait(0, deps=(kk, scores))

    # The first non-finite row of k, g or beta ends the chunk's valid rows. A non-finite k row has a
    # non-finite ||k||^2 on k k^T's diagonal; only then (or when ||k||^2 overflows) are k's rows read
    # one by one, and k's rows from the first bad one zeroed (0 x NaN in a product is NaN).
    norms = _diagonal(kk, r, c)
    first_bad = gl.min(gl.where(_bad(norms) | _bad(g_r) | _bad(b_r), r, BT), axis=0)
    if first_bad < BT:
        rows = gl.arange(0, BT, layout=gl.SliceLayout(1, loads))
        k = k_s.load(loads)
        g_rows = gl.load(G_ptr + row_of + rows * HV, mask=rows < length, other=0.0)
        b_rows = gl.load(BETA_ptr + row_of + rows * HV, mask=rows < length, other=0.0)
        first_bad = gl.min(gl.where(_bad_rows(k) | _bad(g_rows) | _bad(b_rows), rows, BT), axis=0)
        k_s.store(gl.where((rows < first_bad)[:, None], k, 0.0).to(dtype))
        fence_async_shared()
        gl.thread_barrier()
        g_c = gl.load(G_ptr + row_of + c * HV, mask=c < gl.minimum(length, first_bad), other=0.0).to(gl.float32)
        gc = gl.sum(gl.where(r[:, None] >= c[None, :], g_c[None, :], 0.0), axis=1)
        gate_last = gl.sum(g_c, axis=0)  # rows past a bad one have g = 0
        # The products' entries of the rows from the bad one on (NaN where k's row is) leave the scaling
        # below as zeros: it multiplies by zero there, and 0 x NaN is NaN.
        kk = gl.where((r < first_bad)[:, None] & (c < first_bad)[None, :], kk, 0.0)
        if not SCORE_FACTORS:
            scores = gl.where((c < first_bad)[None, :], scores, 0.0)
    keep_r, keep_c = r < first_bad, c < first_bad
    rk = _inverse_row_norm(kk, r, c, L2NORM)
    if GROWTH:  # log2 of the chunk's bound on its transition's growth beyond its decay (launch.SEGMENT_WINDOWS)
        squared = 1.0 - 1e-6 * rk * rk if L2NORM else norms  # ||k_t||^2 as the products see k
        growth = gl.sum(gl.where(keep_r, gl.log2(gl.maximum(gl.abs(1.0 - b_r * squared), 1.0)), 0.0), axis=0)
    # gamma_rc = exp(gc_r - gc_c) and each product's row and column scales meet in one exponent per
    # element, the scales as base-2 logarithms: A_rc = kk_rc 2^(a_r - b_c), scores_rc = qk_rc 2^(s_r - b_c).
    # A row past the valid ones has a = -inf (beta 0), a column past them b = +inf: 2^-inf = 0. One FADD,
    # MUFU and FMUL per element where exp and three products took six or more.
    b_by_row = gl.where(keep_r, gc * _LOG2E - gl.log2(rk), _INF)
    b_c = gl.convert_layout(b_by_row, gl.SliceLayout(0, square))
    a_r = gl.where(keep_r, gc * _LOG2E + gl.log2(b_r * rk), -_INF)
    s_r = gc * _LOG2E + gl.log2(scale * rq)
    # z = -rest of the block doubling below, at its first level -A.
    z = gl.where(r[:, None] > c[None, :], kk * -_exp2(a_r[:, None] - b_c[None, :]), 0.0)
    if not SCORE_FACTORS:
        scores = gated_scores(scores, s_r, b_c, r, c)

    # Step 2: (I + A)^-1 by block doubling. -N goes through shared memory, the right operand of each
    # level's products; their left operands (the inverse so far, z = -rest) come from registers.
    left: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=square, k_width=2)
    first_shared_level: gl.constexpr = BLOCK_LEVELS if WARP_BLOCKS else 1
    if WARP_BLOCKS:
        # The levels joining blocks of 1 to 8 rows inside each warp's 16 x 16 diagonal block
        # (hopper_inverse_kernels); then z = -rest at blocks of 16 rows is -A times their inverse.
        z_blocks, z_t_blocks = minus_a_blocks(kk, a_r, b_by_row, _exp2)
        inverse = block_diagonal(block_inverses(z_blocks, z_t_blocks), square)
        right = inverse
    else:
        right = _doubling_step(z, r, c, 0)
        inverse = gl.where(r[:, None] == c[None, :], 1.0, right)  # blocks of 2 rows: I - N, no product
    step_s.store(_bf16_pairs(right))
    fence_async_shared()
    # z times the inverse so far (per-warp levels), or z (I - N) of the first level.
    z = warpgroup_mma(gl.convert_layout(z.to(gl.bfloat16), left), step_s, zero if WARP_BLOCKS else z,
                      use_acc=not WARP_BLOCKS, is_async=True)
    # In the first product's shadow: the scores leave, or (SCORE_FACTORS) their row and column exponents,
    # from which the pairs form them (hopper_register_kernels._scores).
    if SCORE_FACTORS:  # parts 4 and 5 of the chunk's scales
        scales = P_ptr + chunk_scales(chunk_start, length, i_hv, HV) + r
        gl.store(scales + 4 * length, s_r, mask=r < length)
        gl.store(scales + 5 * length, b_by_row, mask=r < length)
    else:
        _store_rows(P_ptr + row_of * BT, scores.to(P_ptr.dtype.element_ty), length, BT, HV * BT, BT, BT)
    z = warpgroup_mma_wait(0, deps=(z,))
    for level in gl.static_range(first_shared_level, CHUNK_INVERSE_LEVELS):
        step = _doubling_step(z, r, c, level)
        step_s.store(_bf16_pairs(step))
        fence_async_shared()
        inverse = warpgroup_mma(gl.convert_layout(inverse.to(gl.bfloat16), left), step_s, inverse, is_async=True)
        if level < CHUNK_INVERSE_LEVELS - 1:
            z = warpgroup_mma(gl.convert_layout(z.to(gl.bfloat16), left), step_s, z, is_async=True)
            inverse, z = warpgroup_mma_wait(0, deps=(inverse, z))
        else:
            inverse = warpgroup_mma_wait(0, deps=(inverse,))

    if STORE_T:
        # launch.HOPPER_PAIRS_FROM_V: T = Ai diag(beta) leaves in w's place (BT columns) and k's per-token
        # factor in w (gamma / ||k||) in u's place, in fp32; w and u are never formed, v never read.
        b_c = gl.convert_layout(gl.where(keep_r, b_r, 0.0), gl.SliceLayout(0, square))
        _store_rows(W_ptr + row_of * BT, (inverse * b_c[None, :]).to(W_ptr.dtype.element_ty), length, BT, HV * BT,
                    BT, BT)
        k_factor = gl.where(keep_r, rk * gl.exp(gc), 0.0)
        if SCORE_FACTORS:  # part 2 of the chunk's scales
            gl.store(P_ptr + chunk_scales(chunk_start, length, i_hv, HV) + 2 * length + r, k_factor, mask=r < length)
        else:
            gl.store(U_ptr + row_of + r * HV, k_factor, mask=r < length)
        first_bad_v = first_bad
    else:
        # Step 3: w = Ai diag(beta gamma / ||k||) k and u = Ai diag(beta) v, per V tile (one accumulator
        # at a time: with w's and u's both held the pass spilled).
        b_c = gl.convert_layout(gl.where(keep_r, b_r, 0.0), gl.SliceLayout(0, square))
        k_cols = gl.where(keep_c, b_c * gl.exp(gl.convert_layout(gc, gl.SliceLayout(0, square))) *
                          gl.convert_layout(rk, gl.SliceLayout(0, square)), 0.0)  # rk is NaN on bad rows
        inverse_k = gl.convert_layout((inverse * k_cols[None, :]).to(dtype), left)
        inverse_b = gl.convert_layout((inverse * b_c[None, :]).to(dtype), left)
        w = warpgroup_mma(inverse_k, k_s, gl.zeros([BT, BK], gl.float32, layout=wide), use_acc=False, is_async=True)
        w = warpgroup_mma_wait(0, deps=(w,))
        _store_rows(W_ptr + row_of * K, w.to(W_ptr.dtype.element_ty), length, K, HV * K, BT, BK)
        first_bad_v = first_bad
        v_layout: gl.constexpr = _copy_layout(BV)
        for i_v in gl.static_range(NV):
            if i_v > 0:
                _copy_tile(v_s, V_ptr + row_of * V, 0, length, i_v * BV, V, HV * V, BT, BV, False, False)
                async_copy.commit_group()
            async_copy.wait_group(0)
            fence_async_shared()
            gl.thread_barrier()  # every thread's part of the tile is in
            u = warpgroup_mma(inverse_b, v_s, gl.zeros([BT, BV], gl.float32, layout=value), use_acc=False,
                              is_async=True)
            u = warpgroup_mma_wait(0, deps=(u,))
            # A non-finite v row makes u non-finite (0 x Inf is NaN): only then are v's rows read one by
            # one, the first bad one ends the valid rows, and u is formed again with the rows from it zeroed.
            if gl.sum(gl.sum(u * 0.0, axis=1), axis=0) != 0.0:
                v_rows = gl.arange(0, BT, layout=gl.SliceLayout(1, v_layout))
                v = v_s.load(v_layout)
                first_bad_v = gl.minimum(first_bad_v, gl.min(gl.where(_bad_rows(v), v_rows, BT), axis=0))
                v_s.store(gl.where((v_rows < first_bad_v)[:, None], v, 0.0).to(dtype))
                fence_async_shared()
                gl.thread_barrier()
                u = warpgroup_mma(inverse_b, v_s, gl.zeros([BT, BV], gl.float32, layout=value), use_acc=False,
                                  is_async=True)
                u = warpgroup_mma_wait(0, deps=(u,))
            _store_rows(U_ptr + row_of * V + i_v * BV, u.to(U_ptr.dtype.element_ty), length, V - i_v * BV, HV * V, BT,
                        BV)
    keep = r < first_bad_v

    # The sequential pass reads raw q and k: their norms, the gates and the masks go in here.
    in_chunk = r < length
    q_scale = gl.where(keep, scale * rq * gl.exp(gc), _nan())
    k_scale = gl.where(keep, rk * gl.exp(gate_last - gc), 0.0)
    if SCORE_FACTORS:  # parts 0 and 1 of the chunk's scales
        scales = P_ptr + chunk_scales(chunk_start, length, i_hv, HV) + r
        gl.store(scales, q_scale, mask=in_chunk)
        gl.store(scales + length, k_scale, mask=in_chunk)
    else:
        gl.store(QS_ptr + row_of + r * HV, q_scale, mask=in_chunk)
        gl.store(KS_ptr + row_of + r * HV, k_scale, mask=in_chunk)
    gl.store(DECAY_ptr + row_of, gl.where(first_bad_v < BT, _nan(), gl.exp(gate_last)))
    if GROWTH:  # in the chunk's second row, which no pass reads a decay from
        gl.store(DECAY_ptr + row_of + HV, growth, mask=length > 1)
