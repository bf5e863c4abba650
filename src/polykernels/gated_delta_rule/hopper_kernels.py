"""The sequential pass of the gated delta rule for Hopper (sm_90), in Gluon.

The same pass as ``recurrence_kernels.gdn_recurrence_kernel`` (same arguments, same results), for
bf16 and fp16 inputs with K = BK on sm_90. Triton waits for every tensor-core product as soon as it is
issued (``wgmma`` then wait 0), so the portable kernel runs its four products per chunk one after
the other. Here the products are issued asynchronously and awaited only where their results are
needed: per chunk the two products on the state's path (v_new = u - w h, then h' = decay h +
k^T (k_scale . v_new)) each have the product beside them (q h, then P v_new) running in their
shadow (at 64-column tiles q h and P v_new both run beside the second: registers). The chunk
tiles come in through ``cp.async`` a few chunks ahead, as Triton's pipeliner would have issued them.

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

# Scalar arithmetic only (no layouts), so the Triton helper serves Gluon kernels too.
from polykernels.gated_delta_rule.kernels import _segment


@gluon.constexpr_function
def _mma_layout(block_v, warps=4):
    # One warpgroup per 64 rows; M = 64 (a chunk) or BK (the state) rows in 16-row steps, N = the V tile.
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps, 1], instr_shape=[16, block_v, 16])


@gluon.constexpr_function
def _copy_layout(cols, warps=4, per_thread=8):
    # 16-byte cp.async per thread (8 16-bit elements, or 4 fp32 ones), a warp spanning whole rows.
    per_row = cols // per_thread
    return gl.BlockedLayout(size_per_thread=[1, per_thread], threads_per_warp=[32 // per_row, per_row],
                            warps_per_cta=[warps, 1], order=[1, 0])


@gluon.constexpr_function
def _smem_layout(rows, cols):
    return gl.NVMMASharedLayout.get_default_for([rows, cols], gl.bfloat16)


@gluon.jit
def _chunk_stages(dtype: gl.constexpr, STAGES: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr, BV: gl.constexpr):
    """The sequential passes' pipeline stages of a chunk's w, k, q (BT x BK), P (BT x BT) and u (BT x BV)."""
    w_s = gl.allocate_shared_memory(dtype, [STAGES, BT, BK], _smem_layout(BT, BK))
    k_s = gl.allocate_shared_memory(dtype, [STAGES, BT, BK], _smem_layout(BT, BK))
    q_s = gl.allocate_shared_memory(dtype, [STAGES, BT, BK], _smem_layout(BT, BK))
    p_s = gl.allocate_shared_memory(dtype, [STAGES, BT, BT], _smem_layout(BT, BT))
    u_s = gl.allocate_shared_memory(dtype, [STAGES, BT, BV], _smem_layout(BT, BV))
    return w_s, k_s, q_s, p_s, u_s


@gluon.jit
def _copy_tile(smem, base, chunk_start, end, col0, col_limit, ROW_STRIDE: gl.constexpr, ROWS: gl.constexpr,
               COLS: gl.constexpr, ROWS_IN: gl.constexpr, COLS_IN: gl.constexpr):
    """cp.async of one chunk's ROWS x COLS tile (rows past ``end`` and columns past ``col_limit`` read 0).
    ROWS_IN / COLS_IN: every row / column is known to be inside, so no mask is formed for them."""
    layout: gl.constexpr = _copy_layout(COLS, gl.num_warps())
    rows = gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    cols = col0 + gl.arange(0, COLS, layout=gl.SliceLayout(0, layout))
    pointers = base + rows[:, None] * ROW_STRIDE + cols[None, :]
    if ROWS_IN and COLS_IN:
        async_copy.async_copy_global_to_shared(smem, pointers)
    elif ROWS_IN:  # the column mask, broadcast to the tile's shape
        async_copy.async_copy_global_to_shared(smem, pointers, (cols < col_limit)[None, :] & (rows >= 0)[:, None])
    else:
        mask = ((chunk_start + rows) < end)[:, None] & (cols < col_limit)[None, :]
        async_copy.async_copy_global_to_shared(smem, pointers, mask)


@gluon.jit
def _copy_chunk(chunk_start, end, stage, i_h, i_hv, col0, u_limit, Q_ptr, K_ptr, W_ptr, U_ptr, P_ptr,
                w_s, k_s, q_s, p_s, u_s, H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr,
                BT: gl.constexpr, BK: gl.constexpr, BV: gl.constexpr, OUTPUTS: gl.constexpr,
                U_COLS_IN: gl.constexpr):
    """The chunk's tiles into pipeline stage ``stage``, as one cp.async group. At the narrow V tile a
    whole chunk (all but a segment's last, as a rule) copies without row masks: fewer instructions
    beside the state's chain (on the H200 at B1 T32768 32/32 the pass went 650 -> 593 us; at the
    64-column tile of 1x32768 2/8 it went 224 -> 229 us, so that tile keeps the masks)."""
    if BV <= 32 and chunk_start + BT <= end:
        _copy_chunk_tiles(chunk_start, end, stage, i_h, i_hv, col0, u_limit, Q_ptr, K_ptr, W_ptr, U_ptr, P_ptr,
                          w_s, k_s, q_s, p_s, u_s, H, HV, K, V, BT, BK, BV, OUTPUTS, True, U_COLS_IN)
    else:
        _copy_chunk_tiles(chunk_start, end, stage, i_h, i_hv, col0, u_limit, Q_ptr, K_ptr, W_ptr, U_ptr, P_ptr,
                          w_s, k_s, q_s, p_s, u_s, H, HV, K, V, BT, BK, BV, OUTPUTS, False, U_COLS_IN)
    async_copy.commit_group()


@gluon.jit
def _copy_chunk_tiles(chunk_start, end, stage, i_h, i_hv, col0, u_limit, Q_ptr, K_ptr, W_ptr, U_ptr, P_ptr,
                      w_s, k_s, q_s, p_s, u_s, H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr,
                      BT: gl.constexpr, BK: gl.constexpr, BV: gl.constexpr, OUTPUTS: gl.constexpr,
                      ROWS_IN: gl.constexpr, U_COLS_IN: gl.constexpr):
    row_of = chunk_start * HV + i_hv
    qk_chunk = (chunk_start * H + i_h) * K
    _copy_tile(w_s.index(stage), W_ptr + row_of * K, chunk_start, end, 0, K, HV * K, BT, BK, ROWS_IN, True)
    _copy_tile(k_s.index(stage), K_ptr + qk_chunk, chunk_start, end, 0, K, H * K, BT, BK, ROWS_IN, True)
    _copy_tile(u_s.index(stage), U_ptr + row_of * V, chunk_start, end, col0, u_limit, HV * V, BT, BV, ROWS_IN,
               U_COLS_IN)
    if OUTPUTS:
        _copy_tile(q_s.index(stage), Q_ptr + qk_chunk, chunk_start, end, 0, K, H * K, BT, BK, ROWS_IN, True)
        _copy_tile(p_s.index(stage), P_ptr + row_of * BT, chunk_start, end, 0, BT, HV * BT, BT, BT, ROWS_IN, True)


@gluon.jit
def _row_scales(QS_ptr, KS_ptr, DECAY_ptr, chunk_start, end, i_hv, HV: gl.constexpr, BT: gl.constexpr,
                layout: gl.constexpr):
    """(q_scale, k_scale, decay) of the chunk at chunk_start; zeros past ``end``."""
    rows = gl.arange(0, BT, layout=layout)
    row_of = chunk_start * HV + i_hv
    in_chunk = chunk_start + rows < end
    q_scale = gl.load(QS_ptr + row_of + rows * HV, mask=in_chunk, other=0.0)
    k_scale = gl.load(KS_ptr + row_of + rows * HV, mask=in_chunk, other=0.0)
    return q_scale, k_scale, gl.load(DECAY_ptr + row_of, mask=chunk_start < end, other=0.0)


@gluon.jit
def _store_output(O_ptr, out, chunk_start, end, i_hv, col0, HV: gl.constexpr, V: gl.constexpr, BT: gl.constexpr,
                  BV: gl.constexpr):
    """The chunk's output tile, through a row-major layout: 16-byte stores (from the product's
    layout each thread would store 4 bytes at a time; the recurrence was 11% slower so)."""
    layout: gl.constexpr = _copy_layout(BV)
    rows = gl.arange(0, BT, layout=gl.SliceLayout(1, layout))
    cols = col0 + gl.arange(0, BV, layout=gl.SliceLayout(0, layout))
    tile = (chunk_start * HV + i_hv) * V + rows[:, None] * (HV * V) + cols[None, :]
    mask = (chunk_start + rows < end)[:, None] & (cols[None, :] < V)
    gl.store(O_ptr + tile, gl.convert_layout(out.to(O_ptr.dtype.element_ty), layout), mask=mask)


@gluon.jit
def _segment_state_columns(i_col, j, count, start, end, NV: gl.constexpr, BV: gl.constexpr, V: gl.constexpr,
                           layout: gl.constexpr):
    """A segment-state program's columns, [V | K]: value tiles (from a zero state), then the
    transition's (from the identity, u = 0). Returns (end, is_transition, col0, cols, u_limit); a
    sequence's last segment needs neither (its end moves to its start)."""
    end = gl.where(j < count - 1, end, start)
    is_transition = i_col >= NV
    col0 = gl.where(is_transition, i_col - NV, i_col) * BV
    cols = col0 + gl.arange(0, BV, layout=layout)
    return end, is_transition, col0, cols, gl.where(is_transition, 0, V)


@gluon.jit
def _store_segment_state(HLOC_ptr, M_ptr, state, k, cols, base, valid, is_transition, K: gl.constexpr,
                         V: gl.constexpr):
    """A segment-state program's last state: its value tile (K x V, from HLOC_ptr) or its transition
    tile (K x K, from M_ptr) at row ``base``. ``k`` and ``cols``: the tile's K and column indices,
    broadcast to its shape (the state may be held either way round)."""
    inside = (k < K) & valid
    gl.store(HLOC_ptr + (base + k) * V + cols, state, mask=inside & (cols < V) & ~is_transition)
    gl.store(M_ptr + (base + k) * K + cols, state, mask=inside & (cols < K) & is_transition)


@gluon.jit
def gdn_recurrence_hopper_kernel(
    Q_ptr, K_ptr, W_ptr, U_ptr, P_ptr, QS_ptr, KS_ptr, DECAY_ptr, HINIT_ptr, HT_ptr, O_ptr, HLOC_ptr, M_ptr,
    CU, T, N, SEGS_PER_SEQ, SEG_TOKENS,
    H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr,
    BV: gl.constexpr, NV: gl.constexpr, VARLEN: gl.constexpr, LOG_N: gl.constexpr, HAS_INITIAL: gl.constexpr,
    SEGMENT_STATE: gl.constexpr, STORE_FINAL: gl.constexpr, DOT_PRECISION: gl.constexpr,
    STAGES: gl.constexpr,
):
    gl.static_assert(K == BK, "the Hopper pass takes whole K rows (K a power of two)")
    # One stage would copy the next chunk into the tiles the products are reading (wrong results).
    gl.static_assert(STAGES >= 2, "the Hopper pass copies a chunk ahead: STAGES must be at least 2")
    mma: gl.constexpr = _mma_layout(BV)
    rows_of: gl.constexpr = gl.SliceLayout(1, mma)
    cols_of: gl.constexpr = gl.SliceLayout(0, mma)
    dtype: gl.constexpr = W_ptr.dtype.element_ty
    OUTPUTS: gl.constexpr = not SEGMENT_STATE
    # u's columns all lie inside V: no column mask (the transition programs mask all of theirs: u = 0).
    U_COLS_IN: gl.constexpr = V % BV == 0 and OUTPUTS

    i_col = gl.program_id(0)
    i_s = gl.program_id(1).to(gl.int64)
    i_hv = gl.program_id(2).to(gl.int64)
    i_h = i_hv // (HV // H)
    n, j, count, start, end, valid, _ = _segment(i_s, CU, T, N, SEGS_PER_SEQ, SEG_TOKENS, VARLEN, LOG_N)
    k_rows = gl.arange(0, BK, layout=rows_of)
    if SEGMENT_STATE:
        end, is_transition, col0, cols, u_limit = _segment_state_columns(i_col, j, count, start, end, NV, BV, V,
                                                                         cols_of)
        state = gl.where(is_transition & (k_rows[:, None] == cols[None, :]), 1.0, 0.0)
    else:
        col0 = i_col * BV
        cols = col0 + gl.arange(0, BV, layout=cols_of)
        u_limit = V
        tile = k_rows[:, None] * V + cols[None, :]
        tile_mask = (k_rows[:, None] < K) & (cols[None, :] < V) & valid
        if HAS_INITIAL:
            state = gl.load(HINIT_ptr + (i_s * HV + i_hv) * K * V + tile, mask=tile_mask, other=0.0)
        else:
            state = gl.zeros([BK, BV], gl.float32, layout=mma)

    w_s, k_s, q_s, p_s, u_s = _chunk_stages(dtype, STAGES, BT, BK, BV)
    h_s = gl.allocate_shared_memory(dtype, [BK, BV], _smem_layout(BK, BV))
    update_s = gl.allocate_shared_memory(dtype, [BT, BV], _smem_layout(BT, BV))
    v_new_s = gl.allocate_shared_memory(dtype, [BT, BV], _smem_layout(BT, BV))

    for ahead in gl.static_range(STAGES - 1):
        _copy_chunk(start + ahead * BT, end, ahead, i_h, i_hv, col0, u_limit, Q_ptr, K_ptr, W_ptr, U_ptr, P_ptr,
                    w_s, k_s, q_s, p_s, u_s, H, HV, K, V, BT, BK, BV, OUTPUTS, U_COLS_IN)
    # The per-row scales and the decay are loaded a chunk ahead (plain loads: too small for cp.async).
    q_scale_next, k_scale_next, decay_next = _row_scales(QS_ptr, KS_ptr, DECAY_ptr, start, end, i_hv, HV, BT,
                                                         rows_of)
    zero = gl.zeros([BT, BV], gl.float32, layout=mma)
    chunks = ((end - start + BT - 1) // BT).to(gl.int32)
    # At the narrow V tile each chunk's output is stored in the next chunk, while that chunk's
    # products run (the layout change for 16-byte stores goes through shared memory; the first
    # step stores nothing: its rows start at end). At 64 columns the held tile made the kernel
    # spill 312 bytes and those rows 12-22% slower on the H200, so they store at once.
    DEFER: gl.constexpr = OUTPUTS and BV <= 32
    out_prev = gl.zeros([BT, BV], dtype, layout=mma)
    prev_start = end
    for c in range(0, chunks):
        chunk_start = start + c * BT
        stage = c % STAGES
        q_scale, k_scale, decay = q_scale_next, k_scale_next, decay_next
        q_scale_next, k_scale_next, decay_next = _row_scales(QS_ptr, KS_ptr, DECAY_ptr, chunk_start + BT, end, i_hv,
                                                             HV, BT, rows_of)
        async_copy.wait_group(STAGES - 2)  # this chunk's tiles are in
        gl.thread_barrier()  # every thread's copies, and the previous chunk's reads of the stage reused below
        h_s.store(state.to(dtype))
        fence_async_shared()
        w_h = warpgroup_mma(w_s.index(stage), h_s, zero, use_acc=False, is_async=True)
        # q h runs beside w h at the narrow tile. At 64 columns its accumulator held beside w h's made
        # the pass spill inside the loop (144 bytes, five local loads and stores per chunk), so there it
        # runs beside the state's product (8 bytes spilled, none in the loop; the cut sequences' pass
        # 1-8% faster on the H200, BENCHMARKS.md "fourteenth set").
        if DEFER:
            q_h = warpgroup_mma(q_s.index(stage), h_s, zero, use_acc=False, is_async=True)
        # While the products run: the chunk STAGES - 1 ahead into the stage the previous chunk used.
        _copy_chunk(chunk_start + (STAGES - 1) * BT, end, (c + STAGES - 1) % STAGES, i_h, i_hv, col0, u_limit,
                    Q_ptr, K_ptr, W_ptr, U_ptr, P_ptr, w_s, k_s, q_s, p_s, u_s, H, HV, K, V, BT, BK, BV, OUTPUTS,
                    U_COLS_IN)
        if DEFER:
            _store_output(O_ptr, out_prev, prev_start, end, i_hv, col0, HV, V, BT, BV)
        u = u_s.index(stage).load(mma).to(gl.float32)
        w_h = warpgroup_mma_wait(1 if DEFER else 0, deps=(w_h,))  # q h may run on
        v_new = u - w_h
        update_s.store((v_new * k_scale[:, None]).to(dtype))
        if OUTPUTS:
            v_new_s.store(v_new.to(dtype))
        fence_async_shared()
        if OUTPUTS and not DEFER:
            q_h = warpgroup_mma(q_s.index(stage), h_s, zero, use_acc=False, is_async=True)
        state = warpgroup_mma(k_s.index(stage).permute((1, 0)), update_s, state * decay, is_async=True)
        if OUTPUTS:
            q_h = warpgroup_mma_wait(1, deps=(q_h,))
            out = warpgroup_mma(p_s.index(stage), v_new_s, q_h * q_scale[:, None], is_async=True)
            state, out = warpgroup_mma_wait(0, deps=(state, out))
            if DEFER:
                out_prev = out.to(dtype)
                prev_start = chunk_start
            else:
                _store_output(O_ptr, out, chunk_start, end, i_hv, col0, HV, V, BT, BV)
        else:
            state = warpgroup_mma_wait(0, deps=(state,))
    async_copy.wait_group(0)
    if DEFER:
        _store_output(O_ptr, out_prev, prev_start, end, i_hv, col0, HV, V, BT, BV)

    if SEGMENT_STATE:
        _store_segment_state(HLOC_ptr, M_ptr, state, k_rows[:, None], cols[None, :], (i_s * HV + i_hv) * K, valid,
                             is_transition, K, V)
    elif STORE_FINAL:
        gl.store(HT_ptr + (n * HV + i_hv) * K * V + tile, state, mask=tile_mask & (j == count - 1))
