"""Triton kernels of the chunked gated delta rule forward (chunk size BT = 64): the fused path.

Two paths share the chunk arithmetic here; chunk.plan_segments picks one per call. With many
sequences x heads, the scan path (scan_kernels.py) keeps the sequential part to two products per
chunk and writes chunk states to HBM for a parallel output kernel. With few (one long sequence and
a few heads, Qwen3.5 split across GPUs), this fused path cuts each sequence into segments:

1. ``prepare``  one program per (chunk, value head), fully parallel: the in-chunk gated K.K^T (A)
   and its inverse Ai = (I + A)^-1 (two 32-row halves, then one merge), stored per token row.
   Nothing else is stored: w = Ai (beta gamma k) and u = Ai (beta v) are never formed, because
   v_new = u - w h = Ai (beta v - (beta gamma k) h) costs one BT x BT product more per chunk.
2. ``segment_state`` runs every segment but the last from a zero state and from the identity,
   giving its local final state and its state-transition operator M (K x K) in one pass over
   [V | K] columns; ``combine`` walks the segments of each sequence (h <- M h + h_local) to give
   every segment its true initial state.
3. ``fused``    one program per (V tile, segment, value head): carries the state of its V tile on
   chip across the chunks of its segment, emitting each chunk's output in the same pass; per-chunk
   states never reach HBM.

Non-finite input: a token whose k, v, g or beta holds NaN/Inf is found per chunk; it and the
tokens after it in its chunk are zeroed before any product (a mask multiplied into a matmul
would carry 0 x NaN = NaN to earlier tokens), their outputs are set to NaN and the state
becomes NaN, so exactly the tokens at and after the bad one come out NaN, as the recurrence
says. A bad q reaches only its own token's output (every product with q is row-wise).

Every offset that can pass 2^31 elements (token x heads x dim, segment x heads x K x V) is
formed from int64 operands before any multiply: Triton multiplies int32 by int32 in int32,
which is the MI350 crash this project exists to stop.
"""

from __future__ import annotations

import triton
import triton.language as tl

FLT_MAX = tl.constexpr(3.4028234663852886e38)
# (I + A)^-1 of a 32-row half chunk: a^32 = 0, so (I - a)(I + a^2)(I + a^4)(I + a^8)(I + a^16).
HALF_INVERSE_LEVELS = tl.constexpr(4)


@triton.jit
def _l2norm_rows(x, L2NORM: tl.constexpr):
    if L2NORM:
        xf = x.to(tl.float32)
        xf = xf * tl.math.rsqrt(tl.sum(xf * xf, axis=1) + 1e-6)[:, None]
        x = xf.to(x.dtype)
    return x


@triton.jit
def _bad_rows(x):
    """True for the rows of a 2-D tile that hold NaN or +-Inf (NaN fails every comparison)."""
    ok = tl.abs(x.to(tl.float32)) <= FLT_MAX
    return tl.min(ok.to(tl.int32), axis=1) == 0


@triton.jit
def _bad(x):
    return ~(tl.abs(x.to(tl.float32)) <= FLT_MAX)


@triton.jit
def _nan():
    return tl.full([], 0x7FC00000, tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _find(OFFSETS, i, N, LOG_N: tl.constexpr):
    """The largest n < N with OFFSETS[n] <= i, for non-decreasing OFFSETS (binary search)."""
    lo = i * 0
    hi = lo + N - 1
    for _ in tl.static_range(LOG_N):
        mid = (lo + hi + 1) // 2
        ok = tl.load(OFFSETS + mid) <= i
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid - 1)
    return lo


@triton.jit
def _segment(i_s, CU, SEG_OFFSETS, T, N, SEGS_PER_SEQ, SEG_TOKENS, VARLEN: tl.constexpr, LOG_N: tl.constexpr):
    """(sequence, index in it, its segment count, first token, end token, valid) of segment i_s."""
    if VARLEN:
        n = _find(SEG_OFFSETS, i_s, N, LOG_N)
        first = tl.load(SEG_OFFSETS + n)
        count = tl.load(SEG_OFFSETS + n + 1) - first
        bos = tl.load(CU + n).to(tl.int64)
        eos = tl.load(CU + n + 1).to(tl.int64)
        valid = i_s < tl.load(SEG_OFFSETS + N)
    else:
        n = i_s // SEGS_PER_SEQ
        first = n * SEGS_PER_SEQ
        count = i_s * 0 + SEGS_PER_SEQ
        bos = n * T
        eos = bos + T
        valid = n < N
    j = i_s - first
    start = bos + j * SEG_TOKENS
    end = tl.minimum(start + SEG_TOKENS, eos)
    end = tl.where(valid, end, start)
    return n, j, count, start, end, valid


@triton.jit
def _unit_lower_inverse(a, N: tl.constexpr, LEVELS: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """(I + a)^-1 for strictly lower N x N a (a^N = 0): (I - a)(I + a^2)(I + a^4)... as products."""
    r = tl.arange(0, N)
    power = -a
    inverse = (r[:, None] == r[None, :]).to(tl.float32) + power
    for _ in tl.static_range(LEVELS):
        power = tl.dot(power, power, input_precision=DOT_PRECISION)
        inverse = inverse + tl.dot(inverse, power, input_precision=DOT_PRECISION)
    return inverse


@triton.jit
def gdn_plan_kernel(CU, CHUNK_OFFSETS, SEG_OFFSETS, N, SEG_CHUNKS, BT: tl.constexpr, BLOCK: tl.constexpr):
    """Packed sequences: the running count of chunks and of segments before each sequence (one program)."""
    tl.store(CHUNK_OFFSETS, 0)
    tl.store(SEG_OFFSETS, 0)
    carry_chunks = tl.full([], 0, tl.int64)
    carry_segments = tl.full([], 0, tl.int64)
    for first in range(0, N, BLOCK):
        index = first + tl.arange(0, BLOCK)
        mask = index < N
        start = tl.load(CU + index, mask=mask, other=0).to(tl.int64)
        end = tl.load(CU + index + 1, mask=mask, other=0).to(tl.int64)
        chunks = (end - start + BT - 1) // BT
        segments = tl.where(mask, tl.maximum((chunks + SEG_CHUNKS - 1) // SEG_CHUNKS, 1), 0)
        tl.store(CHUNK_OFFSETS + index + 1, tl.cumsum(chunks, axis=0) + carry_chunks, mask=mask)
        tl.store(SEG_OFFSETS + index + 1, tl.cumsum(segments, axis=0) + carry_segments, mask=mask)
        carry_chunks += tl.sum(chunks, axis=0)
        carry_segments += tl.sum(segments, axis=0)


@triton.jit
def _chunk_span(i_c, CU, CHUNK_OFFSETS, T, N, CHUNKS_PER_SEQ, BT: tl.constexpr, VARLEN: tl.constexpr,
                LOG_N: tl.constexpr):
    """(first token, valid rows) of chunk i_c; 0 rows past the last chunk of packed sequences."""
    if VARLEN:
        n = _find(CHUNK_OFFSETS, i_c, N, LOG_N)
        chunk_start = tl.load(CU + n).to(tl.int64) + (i_c - tl.load(CHUNK_OFFSETS + n)) * BT
        length = tl.minimum(tl.load(CU + n + 1).to(tl.int64) - chunk_start, BT)
        length = tl.where(i_c < tl.load(CHUNK_OFFSETS + N), length, 0)
    else:
        n = i_c // CHUNKS_PER_SEQ
        chunk_start = n * T + (i_c % CHUNKS_PER_SEQ) * BT
        length = tl.minimum(n * T + T - chunk_start, BT)
    return chunk_start, length


@triton.jit
def _half_chunk_inverse(K_ptr, G_ptr, BETA_ptr, chunk_start, length, i_h, i_hv,
                        H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                        L2NORM: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """The chunk as two halves of BT/2 rows: (I + A)^-1 = [[X11, 0], [X21 = -X22 A21 X11, X22]].

    Rows from the first one whose k, g or beta is non-finite on are zeroed first (their outputs
    become NaN later). Returns the halves' k, beta and gate cumsums, X11, X21, X22 and that row.
    """
    tl.static_assert(BT == 64, "the half-chunk inverse is written for BT = 64")
    HB: tl.constexpr = BT // 2
    r = tl.arange(0, HB)
    rows1, rows2 = r, r + HB
    k_cols = tl.arange(0, BK)
    k1 = tl.load(K_ptr + ((chunk_start + rows1) * H + i_h)[:, None] * K + k_cols[None, :],
                 mask=(rows1 < length)[:, None] & (k_cols[None, :] < K), other=0.0)
    k2 = tl.load(K_ptr + ((chunk_start + rows2) * H + i_h)[:, None] * K + k_cols[None, :],
                 mask=(rows2 < length)[:, None] & (k_cols[None, :] < K), other=0.0)
    g1 = tl.load(G_ptr + (chunk_start + rows1) * HV + i_hv, mask=rows1 < length, other=0.0).to(tl.float32)
    g2 = tl.load(G_ptr + (chunk_start + rows2) * HV + i_hv, mask=rows2 < length, other=0.0).to(tl.float32)
    b1 = tl.load(BETA_ptr + (chunk_start + rows1) * HV + i_hv, mask=rows1 < length, other=0.0).to(tl.float32)
    b2 = tl.load(BETA_ptr + (chunk_start + rows2) * HV + i_hv, mask=rows2 < length, other=0.0).to(tl.float32)
    k1 = _l2norm_rows(k1, L2NORM)
    k2 = _l2norm_rows(k2, L2NORM)

    bad1 = _bad_rows(k1) | _bad(g1) | _bad(b1)
    bad2 = _bad_rows(k2) | _bad(g2) | _bad(b2)
    first_bad = tl.minimum(tl.min(tl.where(bad1, rows1, BT), axis=0), tl.min(tl.where(bad2, rows2, BT), axis=0))
    keep1, keep2 = rows1 < first_bad, rows2 < first_bad
    k1 = tl.where(keep1[:, None], k1, 0.0)
    k2 = tl.where(keep2[:, None], k2, 0.0)
    g1, g2 = tl.where(keep1, g1, 0.0), tl.where(keep2, g2, 0.0)
    b1, b2 = tl.where(keep1, b1, 0.0), tl.where(keep2, b2, 0.0)

    gc1 = tl.cumsum(g1, axis=0)
    gc2 = tl.cumsum(g2, axis=0) + tl.sum(g1, axis=0)
    kb1 = (k1.to(tl.float32) * b1[:, None]).to(k1.dtype)
    kb2 = (k2.to(tl.float32) * b2[:, None]).to(k2.dtype)
    lower = r[:, None] > r[None, :]
    a11 = tl.dot(kb1, tl.trans(k1), input_precision=DOT_PRECISION)
    a11 = tl.where(lower, a11 * tl.exp(gc1[:, None] - gc1[None, :]), 0.0)
    a22 = tl.dot(kb2, tl.trans(k2), input_precision=DOT_PRECISION)
    a22 = tl.where(lower, a22 * tl.exp(gc2[:, None] - gc2[None, :]), 0.0)
    a21 = tl.dot(kb2, tl.trans(k1), input_precision=DOT_PRECISION) * tl.exp(gc2[:, None] - gc1[None, :])
    x11 = _unit_lower_inverse(a11, HB, HALF_INVERSE_LEVELS, DOT_PRECISION)
    x22 = _unit_lower_inverse(a22, HB, HALF_INVERSE_LEVELS, DOT_PRECISION)
    x21 = -tl.dot(tl.dot(x22, a21, input_precision=DOT_PRECISION), x11, input_precision=DOT_PRECISION)
    return k1, k2, b1, b2, gc1, gc2, x11, x21, x22, first_bad


@triton.jit
def gdn_prepare_kernel(
    K_ptr, G_ptr, BETA_ptr, AI_ptr, CU, CHUNK_OFFSETS, T, N, CHUNKS_PER_SEQ,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    L2NORM: tl.constexpr, VARLEN: tl.constexpr, LOG_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    i_c = tl.program_id(0).to(tl.int64)
    i_hv = tl.program_id(1).to(tl.int64)
    i_h = i_hv // (HV // H)
    chunk_start, length = _chunk_span(i_c, CU, CHUNK_OFFSETS, T, N, CHUNKS_PER_SEQ, BT, VARLEN, LOG_N)
    _k1, _k2, _b1, _b2, _gc1, _gc2, x11, x21, x22, _first_bad = _half_chunk_inverse(
        K_ptr, G_ptr, BETA_ptr, chunk_start, length, i_h, i_hv, H, HV, K, BT, BK, L2NORM, DOT_PRECISION)

    HB: tl.constexpr = BT // 2
    r = tl.arange(0, HB)
    rows1, rows2 = r, r + HB
    dtype = AI_ptr.dtype.element_ty
    ai1 = AI_ptr + ((chunk_start + rows1) * HV + i_hv)[:, None] * BT + r[None, :]
    ai2 = AI_ptr + ((chunk_start + rows2) * HV + i_hv)[:, None] * BT + r[None, :]
    tl.store(ai1, x11.to(dtype), mask=(rows1 < length)[:, None])
    tl.store(ai1 + HB, tl.zeros([HB, HB], dtype=dtype), mask=(rows1 < length)[:, None])
    tl.store(ai2, x21.to(dtype), mask=(rows2 < length)[:, None])
    tl.store(ai2 + HB, x22.to(dtype), mask=(rows2 < length)[:, None])


@triton.jit
def _load_chunk(K_ptr, G_ptr, BETA_ptr, AI_ptr, tokens, row_mask, i_h, i_hv,
                H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                L2NORM: tl.constexpr):
    k_cols = tl.arange(0, BK)
    k = tl.load(K_ptr + (tokens * H + i_h)[:, None] * K + k_cols[None, :],
                mask=row_mask[:, None] & (k_cols[None, :] < K), other=0.0)
    k = _l2norm_rows(k, L2NORM)
    g = tl.load(G_ptr + tokens * HV + i_hv, mask=row_mask, other=0.0).to(tl.float32)
    beta = tl.load(BETA_ptr + tokens * HV + i_hv, mask=row_mask, other=0.0).to(tl.float32)
    ai = tl.load(AI_ptr + (tokens * HV + i_hv)[:, None] * BT + tl.arange(0, BT)[None, :],
                 mask=row_mask[:, None], other=0.0)
    return k, g, beta, ai


@triton.jit
def _advance(state, state_lp, k, g, beta, ai, v, keep, DOT_PRECISION: tl.constexpr):
    """One chunk of the recurrence for one state tile: (next state, v_new, gate cumsum).

    v_new = Ai (beta v - (beta gamma k) h); h' = h exp(g_last) + (k exp(g_last - G))^T v_new.
    """
    g = tl.where(keep, g, 0.0)
    beta = tl.where(keep, beta, 0.0)
    k = tl.where(keep[:, None], k, 0.0)
    gate_cumsum = tl.cumsum(g, axis=0)
    gate_last = tl.sum(g, axis=0)
    dtype = k.dtype
    k_beta_gamma = (k.to(tl.float32) * (beta * tl.exp(gate_cumsum))[:, None]).to(dtype)
    t = v.to(tl.float32) * beta[:, None] - tl.dot(k_beta_gamma, state_lp, input_precision=DOT_PRECISION)
    v_new = tl.dot(ai, t.to(dtype), input_precision=DOT_PRECISION).to(dtype)
    k_decayed = (k.to(tl.float32) * tl.exp(gate_last - gate_cumsum)[:, None]).to(dtype)
    state = state * tl.exp(gate_last) + tl.dot(tl.trans(k_decayed), v_new, input_precision=DOT_PRECISION)
    return state, v_new, gate_cumsum, k


@triton.jit
def gdn_segment_state_kernel(
    K_ptr, V_ptr, G_ptr, BETA_ptr, AI_ptr, HLOC_ptr, M_ptr, CU, SEG_OFFSETS, T, N, SEGS_PER_SEQ, SEG_TOKENS,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, NV: tl.constexpr, L2NORM: tl.constexpr, VARLEN: tl.constexpr, LOG_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    # Column tiles 0..NV-1 run the state from zero with the segment's values; the tiles after
    # them run the K x K transition from the identity with no values (columns [V | K]).
    i_col = tl.program_id(0)
    i_s = tl.program_id(1).to(tl.int64)
    i_hv = tl.program_id(2).to(tl.int64)
    i_h = i_hv // (HV // H)
    _seq, j, count, start, end, valid = _segment(i_s, CU, SEG_OFFSETS, T, N, SEGS_PER_SEQ, SEG_TOKENS, VARLEN,
                                                 LOG_N)
    end = tl.where(j < count - 1, end, start)  # the last segment's local state is never needed
    is_transition = i_col >= NV
    cols = tl.where(is_transition, i_col - NV, i_col) * BV + tl.arange(0, BV)
    rows = tl.arange(0, BT)
    k_rows = tl.arange(0, BK)
    state = tl.where(is_transition & (k_rows[:, None] == cols[None, :]), 1.0, 0.0)
    v_mask = (cols[None, :] < V) & ~is_transition

    for chunk_start in range(start, end, BT):
        tokens = chunk_start + rows.to(tl.int64)
        row_mask = tokens < end
        k, g, beta, ai = _load_chunk(K_ptr, G_ptr, BETA_ptr, AI_ptr, tokens, row_mask, i_h, i_hv,
                                     H, HV, K, BT, BK, L2NORM)
        v = tl.load(V_ptr + (tokens * HV + i_hv)[:, None] * V + cols[None, :], mask=row_mask[:, None] & v_mask,
                    other=0.0)
        bad = _bad_rows(k) | _bad(g) | _bad(beta) | _bad_rows(v)
        first_bad = tl.min(tl.where(bad, rows, BT), axis=0)
        keep = rows < first_bad
        v = tl.where(keep[:, None], v, 0.0)
        state, _v_new, _gates, _k = _advance(state, state.to(k.dtype), k, g, beta, ai, v, keep, DOT_PRECISION)
        state = tl.where(first_bad < BT, _nan(), state)

    base = (i_s * HV + i_hv) * K
    store_mask = (k_rows[:, None] < K) & valid
    tl.store(HLOC_ptr + (base + k_rows[:, None]) * V + cols[None, :], state,
             mask=store_mask & (cols[None, :] < V) & ~is_transition)
    tl.store(M_ptr + (base + k_rows[:, None]) * K + cols[None, :], state,
             mask=store_mask & (cols[None, :] < K) & is_transition)


@triton.jit
def gdn_combine_kernel(
    H0_ptr, HLOC_ptr, M_ptr, HINIT_ptr, CU, SEG_OFFSETS, N, SEGS_PER_SEQ,
    HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, KB: tl.constexpr,
    HAS_INITIAL: tl.constexpr, VARLEN: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Each segment's true initial state: h_{s+1} = M_s h_s + h_local_s along the sequence."""
    i_v = tl.program_id(0)
    i_n = tl.program_id(1).to(tl.int64)
    i_hv = tl.program_id(2).to(tl.int64)
    if VARLEN:
        first = tl.load(SEG_OFFSETS + i_n)
        count = tl.load(SEG_OFFSETS + i_n + 1) - first
    else:
        first = i_n * SEGS_PER_SEQ
        count = i_n * 0 + SEGS_PER_SEQ
    k_rows = tl.arange(0, BK)
    cols = i_v * BV + tl.arange(0, BV)
    tile_mask = (k_rows[:, None] < K) & (cols[None, :] < V)
    tile = k_rows[:, None] * V + cols[None, :]
    state = tl.zeros([BK, BV], dtype=tl.float32)
    if HAS_INITIAL:
        state += tl.load(H0_ptr + (i_n * HV + i_hv) * K * V + tile, mask=tile_mask, other=0.0)
    for j in range(0, count):
        segment = first + j
        base = (segment * HV + i_hv) * K
        tl.store(HINIT_ptr + base * V + tile, state, mask=tile_mask)
        if j < count - 1:
            tl.debug_barrier()
            # M h in K blocks, reading h back from where it was just stored: a K x K operator
            # does not fit in registers next to the state.
            state = tl.load(HLOC_ptr + base * V + tile, mask=tile_mask, other=0.0)
            for kb in tl.static_range(0, BK, KB):
                m_cols = kb + tl.arange(0, KB)
                m = tl.load(M_ptr + (base + k_rows[:, None]) * K + m_cols[None, :],
                            mask=(k_rows[:, None] < K) & (m_cols[None, :] < K), other=0.0)
                h = tl.load(HINIT_ptr + (base + m_cols[:, None]) * V + cols[None, :],
                            mask=(m_cols[:, None] < K) & (cols[None, :] < V), other=0.0)
                state += tl.dot(m, h, input_precision=DOT_PRECISION)


@triton.jit
def gdn_fused_kernel(
    Q_ptr, K_ptr, V_ptr, G_ptr, BETA_ptr, AI_ptr, HINIT_ptr, HT_ptr, O_ptr, CU, SEG_OFFSETS,
    T, N, SEGS_PER_SEQ, SEG_TOKENS, scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, L2NORM: tl.constexpr, VARLEN: tl.constexpr, LOG_N: tl.constexpr,
    STORE_FINAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_s = tl.program_id(1).to(tl.int64)
    i_hv = tl.program_id(2).to(tl.int64)
    i_h = i_hv // (HV // H)
    n, j, count, start, end, valid = _segment(i_s, CU, SEG_OFFSETS, T, N, SEGS_PER_SEQ, SEG_TOKENS, VARLEN, LOG_N)
    rows = tl.arange(0, BT)
    k_rows = tl.arange(0, BK)
    k_cols = tl.arange(0, BK)
    cols = i_v * BV + tl.arange(0, BV)
    tile_mask = (k_rows[:, None] < K) & (cols[None, :] < V) & valid
    tile = k_rows[:, None] * V + cols[None, :]
    # Every segment's initial state comes from `combine` (the first one's is the caller's h0 or 0).
    state = tl.load(HINIT_ptr + (i_s * HV + i_hv) * K * V + tile, mask=tile_mask, other=0.0)
    causal = rows[:, None] >= rows[None, :]

    for chunk_start in range(start, end, BT):
        tokens = chunk_start + rows.to(tl.int64)
        row_mask = tokens < end
        k, g, beta, ai = _load_chunk(K_ptr, G_ptr, BETA_ptr, AI_ptr, tokens, row_mask, i_h, i_hv,
                                     H, HV, K, BT, BK, L2NORM)
        q = tl.load(Q_ptr + (tokens * H + i_h)[:, None] * K + k_cols[None, :],
                    mask=row_mask[:, None] & (k_cols[None, :] < K), other=0.0)
        q = _l2norm_rows(q, L2NORM)
        v_offsets = (tokens * HV + i_hv)[:, None] * V + cols[None, :]
        v_mask = row_mask[:, None] & (cols[None, :] < V)
        v = tl.load(V_ptr + v_offsets, mask=v_mask, other=0.0)
        # q enters only its own token's output (row-wise products): a bad q row needs no care.
        bad = _bad_rows(k) | _bad(g) | _bad(beta) | _bad_rows(v)
        first_bad = tl.min(tl.where(bad, rows, BT), axis=0)
        keep = rows < first_bad
        v = tl.where(keep[:, None], v, 0.0)

        entering = state.to(q.dtype)
        state, v_new, gate_cumsum, k = _advance(state, entering, k, g, beta, ai, v, keep, DOT_PRECISION)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        scores = tl.where(causal, scores * (scale * tl.exp(gate_cumsum[:, None] - gate_cumsum[None, :])), 0.0)
        out = tl.dot(q, entering, input_precision=DOT_PRECISION) * (scale * tl.exp(gate_cumsum))[:, None]
        out += tl.dot(scores.to(v_new.dtype), v_new, input_precision=DOT_PRECISION)
        out = tl.where(keep[:, None], out, _nan())
        tl.store(O_ptr + v_offsets, out.to(O_ptr.dtype.element_ty), mask=v_mask)
        state = tl.where(first_bad < BT, _nan(), state)

    if STORE_FINAL:
        tl.store(HT_ptr + (n * HV + i_hv) * K * V + tile, state, mask=tile_mask & (j == count - 1))
