"""Triton kernels of the gated delta rule forward: one parallel pass, one sequential pass.

1. ``prepare``     one program per (chunk, value head), fully parallel. Everything that does not
   depend on the state: the gate cumsum, the causal gated scores P = scale (q k^T . Gamma),
   Ai = (I + A)^-1 (kernels._chunk_inverse), w = Ai (beta gamma k), u = Ai (beta v), and
   per-row scales that fold the l2 norms, the gates and the non-finite masks into two vectors
   (q_scale, k_scale) and one per-chunk decay. The sequential pass then reads q and k as the caller
   gave them and feeds them to the tensor cores without touching their elements.
2. ``recurrence``  one program per (V tile, segment, value head) walks its chunks in order with
   its state tile on chip. Per chunk, two products lie on the sequential path
   (v_new = u - w h; h' = decay h + k^T (k_scale . v_new)) and two beside it
   (o = q_scale . (q h) + P v_new); per-chunk states never reach HBM.
   With ``SEGMENT_STATE`` it instead runs every segment but a sequence's last from a zero state
   (value columns) and from the identity (K transition columns, u = 0), storing the segment's local
   state and its K x K transition; ``kernels.gdn_combine_kernel`` turns those into each segment's
   initial state (context parallelism for one long sequence with few heads).

Non-finite input: prepare finds each chunk's first row whose k, v, g or beta is NaN/Inf, zeroes that
row and the ones after it before any product, and encodes the verdict in the scales: q_scale is NaN
from that row on (those outputs become NaN), k_scale and the score columns are 0 there (nothing of
them enters the state or other rows) and the chunk's decay is NaN (the state after it is NaN). A bad
q reaches its own row only (every product with q is row-wise).

Offsets are int64 up to each chunk's first element and int32 inside the chunk (see kernels.py).
On sm_90 the passes of bf16 and fp16 inputs are ``hopper_prepare_kernels.gdn_prepare_hopper_kernel`` and
``hopper_kernels.gdn_recurrence_hopper_kernel`` (same arguments and results, their products awaited only
where their results are needed).
"""

from __future__ import annotations

import triton
import triton.language as tl

from polykernels.gated_delta_rule.kernels import (
    _bad_rows,
    _chunk_inverse,
    _chunk_keys,
    _chunk_program,
    _chunk_span,
    _nan,
    _row_rsqrt_norm,
    _segment,
    _tile,
    _window,
)


@triton.jit
def gdn_prepare_kernel(
    Q_ptr, K_ptr, V_ptr, G_ptr, BETA_ptr, W_ptr, U_ptr, P_ptr, QS_ptr, KS_ptr, DECAY_ptr, CU,
    T, N, CHUNKS_PER_SEQ, scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, NV: tl.constexpr, L2NORM: tl.constexpr, VARLEN: tl.constexpr, LOG_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr, INVERSE_PRECISION: tl.constexpr, GROWTH: tl.constexpr = False,
):
    i_c, i_hv = _chunk_program(tl.program_id(0), tl.program_id(1), tl.num_programs(0), HV)
    i_h = i_hv // (HV // H)
    chunk_start, length = _chunk_span(i_c, CU, T, N, CHUNKS_PER_SEQ, BT, VARLEN, LOG_N)
    if length > 0:
        rows = tl.arange(0, BT)
        in_chunk = rows < length
        k_cols = tl.arange(0, BK)
        k_mask = in_chunk[:, None] & (k_cols[None, :] < K)
        # One int64 base per tensor and chunk; int32 offsets inside it (kernels._tile).
        row_of = chunk_start * HV + i_hv
        v_chunk, u_chunk = V_ptr + row_of * V, U_ptr + row_of * V
        # Loads early: two programs share an SM (255 registers each), too few to hide a load issued
        # just before its use (ncu: a third of the stalls waited on q and v). q comes with k and
        # the scores are made before the inverse; v is loaded as the inverse ends (with it live
        # through the inverse the kernel spilled twice as much).
        q = tl.load(Q_ptr + (chunk_start * H + i_h) * K + _tile(rows, k_cols, H * K), mask=k_mask, other=0.0)
        k, rk, b, gc, first_bad = _chunk_keys(K_ptr, G_ptr, BETA_ptr, chunk_start, length, i_h, i_hv, H, HV, K, BT,
                                              BK, L2NORM)
        dtype = k.dtype
        # Scores of l2-normalized q against l2-normalized k. Causal is the only mask they need:
        # k is zero from the first bad row on, and rows from there on come out NaN through q_scale.
        rq = _row_rsqrt_norm(q, L2NORM)
        qn = (q.to(tl.float32) * rq[:, None]).to(dtype)
        scores = tl.dot(qn, tl.trans(k), input_precision=DOT_PRECISION)
        scores = tl.where(rows[:, None] >= rows[None, :], scores * (scale * tl.exp(gc[:, None] - gc[None, :])), 0.0)
        tl.store(P_ptr + row_of * BT + _tile(rows, rows, HV * BT), scores.to(P_ptr.dtype.element_ty),
                 mask=in_chunk[:, None])

        # beta and the gates scale k's and v's elements, not Ai's columns: that fold (one bf16 rounding
        # fewer) made this pass 25% slower on the H200 with element-wise checks (BENCHMARKS.md, eighth set).
        inverse_lp = _chunk_inverse(k, b, gc, BT, DOT_PRECISION, INVERSE_PRECISION).to(dtype)
        v_first = tl.load(v_chunk + _tile(rows, tl.arange(0, BV), HV * V),
                          mask=in_chunk[:, None] & (tl.arange(0, BV)[None, :] < V), other=0.0)
        kbg = (k.to(tl.float32) * (b * tl.exp(gc))[:, None]).to(dtype)
        w = tl.dot(inverse_lp, kbg, input_precision=DOT_PRECISION)
        tl.store(W_ptr + row_of * K + _tile(rows, k_cols, HV * K), w.to(W_ptr.dtype.element_ty), mask=k_mask)

        # A non-finite v row also ends the chunk's valid rows (the scales below need the final row).
        for i_v in tl.static_range(0, NV):
            v_cols = i_v * BV + tl.arange(0, BV)
            v_mask = in_chunk[:, None] & (v_cols[None, :] < V)
            v = v_first if i_v == 0 else tl.load(v_chunk + _tile(rows, v_cols, HV * V), mask=v_mask, other=0.0)
            first_bad = tl.minimum(first_bad, tl.min(tl.where(_bad_rows(v), rows, BT), axis=0))
            vb = tl.where((rows < first_bad)[:, None], v.to(tl.float32) * b[:, None], 0.0).to(dtype)
            u = tl.dot(inverse_lp, vb, input_precision=DOT_PRECISION)
            tl.store(u_chunk + _tile(rows, v_cols, HV * V), u.to(U_ptr.dtype.element_ty), mask=v_mask)
        keep = rows < first_bad

        # The sequential pass reads raw q and k: their norms, the gates and the masks go in here.
        # Padding rows and rows past a bad one have g = 0: the last row's cumsum is the chunk's total.
        gate_last = tl.sum(tl.where(rows == BT - 1, gc, 0.0), axis=0)
        tl.store(QS_ptr + row_of + rows * HV, tl.where(keep, scale * rq * tl.exp(gc), _nan()), mask=in_chunk)
        tl.store(KS_ptr + row_of + rows * HV, tl.where(keep, rk * tl.exp(gate_last - gc), 0.0), mask=in_chunk)
        tl.store(DECAY_ptr + row_of, tl.where(first_bad < BT, _nan(), tl.exp(gate_last)))
        if GROWTH:  # launch.SEGMENT_WINDOWS: kernels._window's growth, in the chunk's second row (no decay there)
            squared = tl.sum(k.to(tl.float32) * k.to(tl.float32), axis=1)  # ||k_t||^2 as the products see k
            growth = tl.sum(tl.log2(tl.maximum(tl.abs(1.0 - b * squared), 1.0)), axis=0)
            tl.store(DECAY_ptr + row_of + HV, growth, mask=length > 1)


@triton.jit
def _row_scales(QS_ptr, DECAY_ptr, chunk_start, end, i_hv, HV: tl.constexpr, BT: tl.constexpr):
    """(q_scale, decay) of the chunk at chunk_start; zeros past ``end``."""
    rows = tl.arange(0, BT)
    row_of = chunk_start * HV + i_hv
    q_scale = tl.load(QS_ptr + row_of + rows * HV, mask=chunk_start + rows < end, other=0.0)
    return q_scale, tl.load(DECAY_ptr + row_of, mask=chunk_start < end, other=0.0)


@triton.jit
def gdn_recurrence_kernel(
    Q_ptr, K_ptr, W_ptr, U_ptr, P_ptr, QS_ptr, KS_ptr, DECAY_ptr, HINIT_ptr, HT_ptr, O_ptr, HLOC_ptr, M_ptr,
    CU, T, N, SEGS_PER_SEQ, SEG_TOKENS,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, NV: tl.constexpr, VARLEN: tl.constexpr, LOG_N: tl.constexpr, HAS_INITIAL: tl.constexpr,
    SEGMENT_STATE: tl.constexpr, STORE_FINAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
    SEGMENT_WINDOW: tl.constexpr = False,
):
    tl.static_assert(not SEGMENT_WINDOW or SEGMENT_STATE, "SEGMENT_WINDOW: the segment-state pass")
    i_col = tl.program_id(0)
    i_s = tl.program_id(1).to(tl.int64)
    i_hv = tl.program_id(2).to(tl.int64)
    i_h = i_hv // (HV // H)
    n, j, count, start, end, valid, _ = _segment(i_s, CU, T, N, SEGS_PER_SEQ, SEG_TOKENS, VARLEN, LOG_N)
    rows = tl.arange(0, BT)
    k_rows = tl.arange(0, BK)
    k_cols = tl.arange(0, BK)
    if SEGMENT_STATE:
        # Columns [V | K]: value tiles from a zero state, then the transition from the identity.
        end = tl.where(j < count - 1, end, start)  # a sequence's last segment needs neither
        is_transition = i_col >= NV
        cols = tl.where(is_transition, i_col - NV, i_col) * BV + tl.arange(0, BV)
        state = tl.where(is_transition & (k_rows[:, None] == cols[None, :]), 1.0, 0.0)
        u_mask = (cols[None, :] < V) & ~is_transition
        if SEGMENT_WINDOW:  # the segment's last chunks alone, its transition dropped (kernels._window)
            start, truncated, poisoned = _window(DECAY_ptr, start, end, i_hv, HV, BT)
            dropped = truncated & is_transition
            end = tl.where(dropped, start, end)
            state = tl.where(dropped, tl.where(poisoned, _nan(), 0.0), state)
    else:
        cols = i_col * BV + tl.arange(0, BV)
        u_mask = cols[None, :] < V
        tile = k_rows[:, None] * V + cols[None, :]
        tile_mask = (k_rows[:, None] < K) & (cols[None, :] < V) & valid
        if HAS_INITIAL:
            state = tl.load(HINIT_ptr + (i_s * HV + i_hv) * K * V + tile, mask=tile_mask, other=0.0)
        else:
            state = tl.zeros([BK, BV], dtype=tl.float32)

    # The per-row q scales and the chunk's decay are loaded one chunk ahead: too small for the
    # pipeliner's copies, a load in the same chunk stood on the sequential path (ncu: a fifth of
    # the stalls waited for q_scale).
    q_scale_next, decay_next = _row_scales(QS_ptr, DECAY_ptr, start, end, i_hv, HV, BT)
    for chunk_start in range(start, end, BT):
        q_scale, decay = q_scale_next, decay_next
        q_scale_next, decay_next = _row_scales(QS_ptr, DECAY_ptr, chunk_start + BT, end, i_hv, HV, BT)
        row_mask = chunk_start + rows < end
        k_mask = row_mask[:, None] & (k_cols[None, :] < K)
        # One int64 base per tensor and chunk; int32 offsets inside it (kernels._tile).
        row_of = chunk_start * HV + i_hv
        qk_chunk = (chunk_start * H + i_h) * K
        v_tile = _tile(rows, cols, HV * V)
        w = tl.load(W_ptr + row_of * K + _tile(rows, k_cols, HV * K), mask=k_mask, other=0.0)
        k = tl.load(K_ptr + qk_chunk + _tile(rows, k_cols, H * K), mask=k_mask, other=0.0)
        u = tl.load(U_ptr + row_of * V + v_tile, mask=row_mask[:, None] & u_mask, other=0.0)
        k_scale = tl.load(KS_ptr + row_of + rows * HV, mask=row_mask, other=0.0)

        entering = state.to(w.dtype)
        v_new = u.to(tl.float32) - tl.dot(w, entering, input_precision=DOT_PRECISION)
        update = (v_new * k_scale[:, None]).to(w.dtype)
        if not SEGMENT_STATE:
            q = tl.load(Q_ptr + qk_chunk + _tile(rows, k_cols, H * K), mask=k_mask, other=0.0)
            scores = tl.load(P_ptr + row_of * BT + _tile(rows, rows, HV * BT), mask=row_mask[:, None], other=0.0)
            out = tl.dot(q, entering, input_precision=DOT_PRECISION) * q_scale[:, None]
            out += tl.dot(scores, v_new.to(w.dtype), input_precision=DOT_PRECISION)
            tl.store(O_ptr + row_of * V + v_tile, out.to(O_ptr.dtype.element_ty), mask=row_mask[:, None] & u_mask)
        state = state * decay + tl.dot(tl.trans(k), update, input_precision=DOT_PRECISION)

    if SEGMENT_STATE:
        base = (i_s * HV + i_hv) * K
        store_mask = (k_rows[:, None] < K) & valid
        tl.store(HLOC_ptr + (base + k_rows[:, None]) * V + cols[None, :], state,
                 mask=store_mask & (cols[None, :] < V) & ~is_transition)
        tl.store(M_ptr + (base + k_rows[:, None]) * K + cols[None, :], state,
                 mask=store_mask & (cols[None, :] < K) & is_transition)
    elif STORE_FINAL:
        tl.store(HT_ptr + (n * HV + i_hv) * K * V + tile, state, mask=tile_mask & (j == count - 1))
