"""Triton kernels of the gated delta rule forward: one parallel pass, one sequential pass.

1. ``prepare``     one program per (chunk, value head), fully parallel. Everything that does not
   depend on the state: the gate cumsum, Ai = (I + A)^-1 (kernels._half_chunk_inverse),
   w = Ai (beta gamma k), u = Ai (beta v), the causal gated scores P = scale (q k^T . Gamma), and
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

Offsets are int64 throughout (see kernels.py).
"""

from __future__ import annotations

import triton
import triton.language as tl

from polykernels.gated_delta_rule.kernels import (
    _bad_rows,
    _chunk_span,
    _half_chunk_inverse,
    _nan,
    _row_rsqrt_norm,
    _segment,
)


@triton.jit
def gdn_prepare_kernel(
    Q_ptr, K_ptr, V_ptr, G_ptr, BETA_ptr, W_ptr, U_ptr, P_ptr, QS_ptr, KS_ptr, DECAY_ptr, CU, CHUNK_OFFSETS,
    T, N, CHUNKS_PER_SEQ, scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, NV: tl.constexpr, L2NORM: tl.constexpr, VARLEN: tl.constexpr, LOG_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    i_c = tl.program_id(0).to(tl.int64)
    i_hv = tl.program_id(1).to(tl.int64)
    i_h = i_hv // (HV // H)
    chunk_start, length = _chunk_span(i_c, CU, CHUNK_OFFSETS, T, N, CHUNKS_PER_SEQ, BT, VARLEN, LOG_N)
    if length > 0:
        k1, k2, rk1, rk2, b1, b2, gc1, gc2, x11, x21, x22, first_bad = _half_chunk_inverse(
            K_ptr, G_ptr, BETA_ptr, chunk_start, length, i_h, i_hv, H, HV, K, BT, BK, L2NORM, DOT_PRECISION)
        HB: tl.constexpr = BT // 2
        r = tl.arange(0, HB)
        rows1, rows2 = r, r + HB
        tokens1, tokens2 = chunk_start + rows1, chunk_start + rows2
        mask1, mask2 = rows1 < length, rows2 < length
        dtype = k1.dtype
        x11_lp, x21_lp, x22_lp = x11.to(dtype), x21.to(dtype), x22.to(dtype)
        k_cols = tl.arange(0, BK)
        k_mask = k_cols[None, :] < K

        kbg1 = (k1.to(tl.float32) * (b1 * tl.exp(gc1))[:, None]).to(dtype)
        kbg2 = (k2.to(tl.float32) * (b2 * tl.exp(gc2))[:, None]).to(dtype)
        w1 = tl.dot(x11_lp, kbg1, input_precision=DOT_PRECISION)
        tl.store(W_ptr + (tokens1 * HV + i_hv)[:, None] * K + k_cols[None, :], w1.to(W_ptr.dtype.element_ty),
                 mask=mask1[:, None] & k_mask)
        w2 = (tl.dot(x21_lp, kbg1, input_precision=DOT_PRECISION)
              + tl.dot(x22_lp, kbg2, input_precision=DOT_PRECISION))
        tl.store(W_ptr + (tokens2 * HV + i_hv)[:, None] * K + k_cols[None, :], w2.to(W_ptr.dtype.element_ty),
                 mask=mask2[:, None] & k_mask)

        # A non-finite v row also ends the chunk's valid rows (the scores below need the final row).
        for i_v in tl.static_range(0, NV):
            v_cols = i_v * BV + tl.arange(0, BV)
            v_mask = v_cols[None, :] < V
            v1 = tl.load(V_ptr + (tokens1 * HV + i_hv)[:, None] * V + v_cols[None, :],
                         mask=mask1[:, None] & v_mask, other=0.0)
            v2 = tl.load(V_ptr + (tokens2 * HV + i_hv)[:, None] * V + v_cols[None, :],
                         mask=mask2[:, None] & v_mask, other=0.0)
            first_bad = tl.minimum(first_bad, tl.min(tl.where(_bad_rows(v1), rows1, BT), axis=0))
            first_bad = tl.minimum(first_bad, tl.min(tl.where(_bad_rows(v2), rows2, BT), axis=0))
            vb1 = tl.where((rows1 < first_bad)[:, None], v1.to(tl.float32) * b1[:, None], 0.0).to(dtype)
            vb2 = tl.where((rows2 < first_bad)[:, None], v2.to(tl.float32) * b2[:, None], 0.0).to(dtype)
            u1 = tl.dot(x11_lp, vb1, input_precision=DOT_PRECISION)
            u2 = (tl.dot(x21_lp, vb1, input_precision=DOT_PRECISION)
                  + tl.dot(x22_lp, vb2, input_precision=DOT_PRECISION))
            tl.store(U_ptr + (tokens1 * HV + i_hv)[:, None] * V + v_cols[None, :], u1.to(U_ptr.dtype.element_ty),
                     mask=mask1[:, None] & v_mask)
            tl.store(U_ptr + (tokens2 * HV + i_hv)[:, None] * V + v_cols[None, :], u2.to(U_ptr.dtype.element_ty),
                     mask=mask2[:, None] & v_mask)

        # Scores of l2-normalized q against l2-normalized k (k1, k2 come normalized).
        keep1, keep2 = rows1 < first_bad, rows2 < first_bad
        causal = r[:, None] >= r[None, :]
        p_rows1 = P_ptr + (tokens1 * HV + i_hv)[:, None] * BT + r[None, :]
        p_rows2 = P_ptr + (tokens2 * HV + i_hv)[:, None] * BT + r[None, :]
        p_type = P_ptr.dtype.element_ty
        q1 = tl.load(Q_ptr + (tokens1 * H + i_h)[:, None] * K + k_cols[None, :], mask=mask1[:, None] & k_mask,
                     other=0.0)
        rq1 = _row_rsqrt_norm(q1, L2NORM)
        qn1 = (q1.to(tl.float32) * rq1[:, None]).to(dtype)
        p11 = tl.dot(qn1, tl.trans(k1), input_precision=DOT_PRECISION)
        p11 = tl.where(causal & keep1[None, :], p11 * (scale * tl.exp(gc1[:, None] - gc1[None, :])), 0.0)
        tl.store(p_rows1, p11.to(p_type), mask=mask1[:, None])
        tl.store(p_rows1 + HB, tl.zeros([HB, HB], dtype=p_type), mask=mask1[:, None])
        q2 = tl.load(Q_ptr + (tokens2 * H + i_h)[:, None] * K + k_cols[None, :], mask=mask2[:, None] & k_mask,
                     other=0.0)
        rq2 = _row_rsqrt_norm(q2, L2NORM)
        qn2 = (q2.to(tl.float32) * rq2[:, None]).to(dtype)
        p21 = tl.dot(qn2, tl.trans(k1), input_precision=DOT_PRECISION)
        p21 = tl.where(keep1[None, :], p21 * (scale * tl.exp(gc2[:, None] - gc1[None, :])), 0.0)
        tl.store(p_rows2, p21.to(p_type), mask=mask2[:, None])
        p22 = tl.dot(qn2, tl.trans(k2), input_precision=DOT_PRECISION)
        p22 = tl.where(causal & keep2[None, :], p22 * (scale * tl.exp(gc2[:, None] - gc2[None, :])), 0.0)
        tl.store(p_rows2 + HB, p22.to(p_type), mask=mask2[:, None])

        # The sequential pass reads raw q and k: their norms, the gates and the masks go in here.
        # Padding rows and rows past a bad one have g = 0: the last row's cumsum is the chunk's total.
        gate_last = tl.sum(tl.where(rows2 == BT - 1, gc2, 0.0), axis=0)
        qs1 = tl.where(keep1, scale * rq1 * tl.exp(gc1), _nan())
        qs2 = tl.where(keep2, scale * rq2 * tl.exp(gc2), _nan())
        ks1 = tl.where(keep1, rk1 * tl.exp(gate_last - gc1), 0.0)
        ks2 = tl.where(keep2, rk2 * tl.exp(gate_last - gc2), 0.0)
        tl.store(QS_ptr + tokens1 * HV + i_hv, qs1, mask=mask1)
        tl.store(QS_ptr + tokens2 * HV + i_hv, qs2, mask=mask2)
        tl.store(KS_ptr + tokens1 * HV + i_hv, ks1, mask=mask1)
        tl.store(KS_ptr + tokens2 * HV + i_hv, ks2, mask=mask2)
        tl.store(DECAY_ptr + chunk_start * HV + i_hv, tl.where(first_bad < BT, _nan(), tl.exp(gate_last)))


@triton.jit
def gdn_recurrence_kernel(
    Q_ptr, K_ptr, W_ptr, U_ptr, P_ptr, QS_ptr, KS_ptr, DECAY_ptr, HINIT_ptr, HT_ptr, O_ptr, HLOC_ptr, M_ptr,
    CU, SEG_OFFSETS, T, N, SEGS_PER_SEQ, SEG_TOKENS,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, NV: tl.constexpr, VARLEN: tl.constexpr, LOG_N: tl.constexpr, HAS_INITIAL: tl.constexpr,
    SEGMENT_STATE: tl.constexpr, STORE_FINAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    i_col = tl.program_id(0)
    i_s = tl.program_id(1).to(tl.int64)
    i_hv = tl.program_id(2).to(tl.int64)
    i_h = i_hv // (HV // H)
    n, j, count, start, end, valid = _segment(i_s, CU, SEG_OFFSETS, T, N, SEGS_PER_SEQ, SEG_TOKENS, VARLEN, LOG_N)
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
    else:
        cols = i_col * BV + tl.arange(0, BV)
        u_mask = cols[None, :] < V
        tile = k_rows[:, None] * V + cols[None, :]
        tile_mask = (k_rows[:, None] < K) & (cols[None, :] < V) & valid
        if HAS_INITIAL:
            state = tl.load(HINIT_ptr + (i_s * HV + i_hv) * K * V + tile, mask=tile_mask, other=0.0)
        else:
            state = tl.zeros([BK, BV], dtype=tl.float32)

    for chunk_start in range(start, end, BT):
        tokens = chunk_start + rows.to(tl.int64)
        row_mask = tokens < end
        k_mask = row_mask[:, None] & (k_cols[None, :] < K)
        w = tl.load(W_ptr + (tokens * HV + i_hv)[:, None] * K + k_cols[None, :], mask=k_mask, other=0.0)
        k = tl.load(K_ptr + (tokens * H + i_h)[:, None] * K + k_cols[None, :], mask=k_mask, other=0.0)
        v_offsets = (tokens * HV + i_hv)[:, None] * V + cols[None, :]
        u = tl.load(U_ptr + v_offsets, mask=row_mask[:, None] & u_mask, other=0.0)
        k_scale = tl.load(KS_ptr + tokens * HV + i_hv, mask=row_mask, other=0.0)
        decay = tl.load(DECAY_ptr + chunk_start * HV + i_hv)

        entering = state.to(w.dtype)
        v_new = u.to(tl.float32) - tl.dot(w, entering, input_precision=DOT_PRECISION)
        update = (v_new * k_scale[:, None]).to(w.dtype)
        if not SEGMENT_STATE:
            q = tl.load(Q_ptr + (tokens * H + i_h)[:, None] * K + k_cols[None, :], mask=k_mask, other=0.0)
            scores = tl.load(P_ptr + (tokens * HV + i_hv)[:, None] * BT + rows[None, :], mask=row_mask[:, None],
                             other=0.0)
            q_scale = tl.load(QS_ptr + tokens * HV + i_hv, mask=row_mask, other=0.0)
            out = tl.dot(q, entering, input_precision=DOT_PRECISION) * q_scale[:, None]
            out += tl.dot(scores, v_new.to(w.dtype), input_precision=DOT_PRECISION)
            tl.store(O_ptr + v_offsets, out.to(O_ptr.dtype.element_ty), mask=row_mask[:, None] & u_mask)
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
