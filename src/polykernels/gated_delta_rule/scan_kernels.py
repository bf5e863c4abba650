"""Triton kernels of the gated delta rule forward with chunk states in HBM (the scan path).

For many sequences x heads: the sequential part does two products per chunk and nothing else,
and the output is computed by a fully parallel kernel from the stored states.

1. ``wu``      one program per (chunk, value head): Ai = (I + A)^-1 (kernels._half_chunk_inverse),
   w = Ai (beta gamma k), u = Ai (beta v), the gate cumsum and the chunk's first non-finite row.
2. ``scan``    one program per (V tile, sequence, value head): walks the chunks in order, storing
   each entering state h_c and v_new = u - w h_c, then the next state.
3. ``output``  one program per (chunk, V tile, value head): o = scale gamma q h_c + the causal
   intra-chunk term; rows from the chunk's first non-finite row on are NaN.

Offsets are int64 throughout (see kernels.py).
"""

from __future__ import annotations

import triton
import triton.language as tl

from polykernels.gated_delta_rule.kernels import (
    _bad_rows,
    _chunk_span,
    _half_chunk_inverse,
    _l2norm_rows,
    _nan,
)


@triton.jit
def gdn_wu_kernel(
    K_ptr, V_ptr, G_ptr, BETA_ptr, W_ptr, U_ptr, GC_ptr, BAD_ptr, CU, CHUNK_OFFSETS, T, N, CHUNKS_PER_SEQ,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, NV: tl.constexpr, L2NORM: tl.constexpr, VARLEN: tl.constexpr, LOG_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    i_c = tl.program_id(0).to(tl.int64)
    i_hv = tl.program_id(1).to(tl.int64)
    i_h = i_hv // (HV // H)
    chunk_start, length = _chunk_span(i_c, CU, CHUNK_OFFSETS, T, N, CHUNKS_PER_SEQ, BT, VARLEN, LOG_N)
    k1, k2, b1, b2, gc1, gc2, x11, x21, x22, first_bad = _half_chunk_inverse(
        K_ptr, G_ptr, BETA_ptr, chunk_start, length, i_h, i_hv, H, HV, K, BT, BK, L2NORM, DOT_PRECISION)
    HB: tl.constexpr = BT // 2
    r = tl.arange(0, HB)
    rows1, rows2 = r, r + HB
    tokens1, tokens2 = chunk_start + rows1, chunk_start + rows2
    mask1, mask2 = rows1 < length, rows2 < length
    tl.store(GC_ptr + tokens1 * HV + i_hv, gc1, mask=mask1)
    tl.store(GC_ptr + tokens2 * HV + i_hv, gc2, mask=mask2)

    dtype = k1.dtype
    x11_lp, x21_lp, x22_lp = x11.to(dtype), x21.to(dtype), x22.to(dtype)
    k_cols = tl.arange(0, BK)
    kbg1 = (k1.to(tl.float32) * (b1 * tl.exp(gc1))[:, None]).to(dtype)
    kbg2 = (k2.to(tl.float32) * (b2 * tl.exp(gc2))[:, None]).to(dtype)
    w1 = tl.dot(x11_lp, kbg1, input_precision=DOT_PRECISION)
    w2 = tl.dot(x21_lp, kbg1, input_precision=DOT_PRECISION) + tl.dot(x22_lp, kbg2, input_precision=DOT_PRECISION)
    k_mask = k_cols[None, :] < K
    tl.store(W_ptr + (tokens1 * HV + i_hv)[:, None] * K + k_cols[None, :], w1.to(W_ptr.dtype.element_ty),
             mask=mask1[:, None] & k_mask)
    tl.store(W_ptr + (tokens2 * HV + i_hv)[:, None] * K + k_cols[None, :], w2.to(W_ptr.dtype.element_ty),
             mask=mask2[:, None] & k_mask)

    for i_v in tl.static_range(0, NV):
        v_cols = i_v * BV + tl.arange(0, BV)
        v_mask = v_cols[None, :] < V
        v1 = tl.load(V_ptr + (tokens1 * HV + i_hv)[:, None] * V + v_cols[None, :], mask=mask1[:, None] & v_mask,
                     other=0.0)
        v2 = tl.load(V_ptr + (tokens2 * HV + i_hv)[:, None] * V + v_cols[None, :], mask=mask2[:, None] & v_mask,
                     other=0.0)
        # A non-finite v row ends the chunk's valid rows too (the output marks them NaN).
        first_bad = tl.minimum(first_bad, tl.min(tl.where(_bad_rows(v1), rows1, BT), axis=0))
        first_bad = tl.minimum(first_bad, tl.min(tl.where(_bad_rows(v2), rows2, BT), axis=0))
        vb1 = tl.where((rows1 < first_bad)[:, None], v1.to(tl.float32) * b1[:, None], 0.0).to(dtype)
        vb2 = tl.where((rows2 < first_bad)[:, None], v2.to(tl.float32) * b2[:, None], 0.0).to(dtype)
        u1 = tl.dot(x11_lp, vb1, input_precision=DOT_PRECISION)
        u2 = tl.dot(x21_lp, vb1, input_precision=DOT_PRECISION) + tl.dot(x22_lp, vb2, input_precision=DOT_PRECISION)
        tl.store(U_ptr + (tokens1 * HV + i_hv)[:, None] * V + v_cols[None, :], u1.to(U_ptr.dtype.element_ty),
                 mask=mask1[:, None] & v_mask)
        tl.store(U_ptr + (tokens2 * HV + i_hv)[:, None] * V + v_cols[None, :], u2.to(U_ptr.dtype.element_ty),
                 mask=mask2[:, None] & v_mask)
    tl.store(BAD_ptr + i_c * HV + i_hv, first_bad.to(tl.int32))


@triton.jit
def gdn_scan_kernel(
    K_ptr, W_ptr, U_ptr, GC_ptr, BAD_ptr, H0_ptr, HT_ptr, HS_ptr, VNEW_ptr, CU, CHUNK_OFFSETS, T, N,
    CHUNKS_PER_SEQ,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, L2NORM: tl.constexpr, VARLEN: tl.constexpr, HAS_INITIAL: tl.constexpr,
    STORE_FINAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    i_v = tl.program_id(0).to(tl.int64)
    i_n = tl.program_id(1).to(tl.int64)
    i_hv = tl.program_id(2).to(tl.int64)
    i_h = i_hv // (HV // H)
    if VARLEN:
        bos = tl.load(CU + i_n).to(tl.int64)
        eos = tl.load(CU + i_n + 1).to(tl.int64)
        first_chunk = tl.load(CHUNK_OFFSETS + i_n)
    else:
        bos = i_n * T
        eos = bos + T
        first_chunk = i_n * CHUNKS_PER_SEQ
    num_chunks = tl.cdiv(eos - bos, BT)

    rows = tl.arange(0, BT)
    k_cols = tl.arange(0, BK)
    v_cols = i_v * BV + tl.arange(0, BV)
    state_mask = (k_cols[:, None] < K) & (v_cols[None, :] < V)
    state_offsets = k_cols[:, None] * V + v_cols[None, :]
    state = tl.zeros([BK, BV], dtype=tl.float32)
    if HAS_INITIAL:
        state += tl.load(H0_ptr + (i_n * HV + i_hv) * K * V + state_offsets, mask=state_mask, other=0.0)

    for i_t in range(0, num_chunks):
        chunk_start = bos + i_t * BT
        tokens = chunk_start + rows.to(tl.int64)
        row_mask = tokens < eos
        chunk = first_chunk + i_t
        tl.store(HS_ptr + (chunk * HV + i_hv) * K * V + state_offsets, state.to(HS_ptr.dtype.element_ty),
                 mask=state_mask)
        k_mask = row_mask[:, None] & (k_cols[None, :] < K)
        w = tl.load(W_ptr + (tokens * HV + i_hv)[:, None] * K + k_cols[None, :], mask=k_mask, other=0.0)
        v_mask = row_mask[:, None] & (v_cols[None, :] < V)
        v_offsets = (tokens * HV + i_hv)[:, None] * V + v_cols[None, :]
        u = tl.load(U_ptr + v_offsets, mask=v_mask, other=0.0).to(tl.float32)
        v_new = u - tl.dot(w, state.to(w.dtype), input_precision=DOT_PRECISION)
        tl.store(VNEW_ptr + v_offsets, v_new.to(VNEW_ptr.dtype.element_ty), mask=v_mask)

        first_bad = tl.load(BAD_ptr + chunk * HV + i_hv)
        keep = rows < first_bad
        last = tl.minimum(chunk_start + BT, eos) - 1
        gate_last = tl.load(GC_ptr + last * HV + i_hv)
        gate_cumsum = tl.load(GC_ptr + tokens * HV + i_hv, mask=row_mask, other=0.0)
        decay = tl.where(row_mask & keep, tl.exp(gate_last - gate_cumsum), 0.0)
        k = tl.load(K_ptr + (tokens * H + i_h)[:, None] * K + k_cols[None, :], mask=k_mask & keep[:, None],
                    other=0.0)
        k = _l2norm_rows(k, L2NORM)
        v_decayed = (v_new * decay[:, None]).to(k.dtype)
        state = state * tl.exp(gate_last) + tl.dot(tl.trans(k), v_decayed, input_precision=DOT_PRECISION)
        state = tl.where(first_bad < BT, _nan(), state)

    if STORE_FINAL:
        tl.store(HT_ptr + (i_n * HV + i_hv) * K * V + state_offsets, state, mask=state_mask)


@triton.jit
def gdn_output_kernel(
    Q_ptr, K_ptr, GC_ptr, BAD_ptr, HS_ptr, VNEW_ptr, O_ptr, CU, CHUNK_OFFSETS, T, N, CHUNKS_PER_SEQ, scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, L2NORM: tl.constexpr, VARLEN: tl.constexpr, LOG_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    i_c = tl.program_id(0).to(tl.int64)
    i_v = tl.program_id(1).to(tl.int64)
    i_hv = tl.program_id(2).to(tl.int64)
    i_h = i_hv // (HV // H)
    chunk_start, length = _chunk_span(i_c, CU, CHUNK_OFFSETS, T, N, CHUNKS_PER_SEQ, BT, VARLEN, LOG_N)
    rows = tl.arange(0, BT)
    row_mask = rows < length
    tokens = chunk_start + rows.to(tl.int64)
    k_cols = tl.arange(0, BK)
    v_cols = i_v * BV + tl.arange(0, BV)

    k_mask = row_mask[:, None] & (k_cols[None, :] < K)
    qk_offsets = (tokens * H + i_h)[:, None] * K + k_cols[None, :]
    q = _l2norm_rows(tl.load(Q_ptr + qk_offsets, mask=k_mask, other=0.0), L2NORM)
    k = _l2norm_rows(tl.load(K_ptr + qk_offsets, mask=k_mask, other=0.0), L2NORM)
    gate_cumsum = tl.load(GC_ptr + tokens * HV + i_hv, mask=row_mask, other=0.0)
    first_bad = tl.load(BAD_ptr + i_c * HV + i_hv, mask=length > 0, other=BT)
    keep = rows < first_bad
    k = tl.where(keep[:, None], k, 0.0)

    state_mask = (k_cols[:, None] < K) & (v_cols[None, :] < V)
    state = tl.load(HS_ptr + (i_c * HV + i_hv) * K * V + k_cols[:, None] * V + v_cols[None, :],
                    mask=state_mask & (length > 0), other=0.0)
    inter = tl.dot(q, state.to(q.dtype), input_precision=DOT_PRECISION)
    inter = inter * (scale * tl.exp(gate_cumsum))[:, None]

    causal = rows[:, None] >= rows[None, :]
    scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    scores = tl.where(causal, scores * scale * tl.exp(gate_cumsum[:, None] - gate_cumsum[None, :]), 0.0)
    v_mask = row_mask[:, None] & (v_cols[None, :] < V)
    v_offsets = (tokens * HV + i_hv)[:, None] * V + v_cols[None, :]
    v_new = tl.load(VNEW_ptr + v_offsets, mask=v_mask & keep[:, None], other=0.0)
    out = inter + tl.dot(scores.to(v_new.dtype), v_new, input_precision=DOT_PRECISION)
    out = tl.where(keep[:, None], out, _nan())
    tl.store(O_ptr + v_offsets, out.to(O_ptr.dtype.element_ty), mask=v_mask)
