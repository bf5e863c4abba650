"""Triton building blocks of the chunked gated delta rule forward (chunk size BT = 64).

The chunk arithmetic both passes of ``recurrence_kernels.py`` share: where a chunk or a segment
lies in packed sequences (read off their boundaries: no host table, no kernel counting chunks
first), the non-finite row checks, and (I + A)^-1 of a chunk. Also the small kernel of the
launch: ``combine`` (the short scan of context parallelism: each segment's true initial state
from the segments before it).

Every offset that can pass 2^31 elements (token x heads x dim, segment x heads x K x V) is
formed from int64 operands before any multiply: Triton multiplies int32 by int32 in int32,
which is the MI350 crash this project exists to stop. Inside a chunk the offsets are int32
(``_tile``): a chunk spans at most BT x heads x dim elements from a base pointer formed in
int64 once per chunk, and per-element int64 offsets of 64 x 128 tiles cost the registers a
kernel spills.
"""

from __future__ import annotations

import triton
import triton.language as tl

FLT_MAX = tl.constexpr(3.4028234663852886e38)
# (I + A)^-1 of a 64-row chunk by block doubling: diagonal blocks of 2, 4, ..., 64 rows (log2 64 levels).
CHUNK_INVERSE_LEVELS = tl.constexpr(6)


@triton.jit
def _row_rsqrt_norm(x, L2NORM: tl.constexpr):
    """1 / ||row|| as the l2norm in the kernel defines it, or 1 without l2norm."""
    if L2NORM:
        xf = x.to(tl.float32)
        return tl.math.rsqrt(tl.sum(xf * xf, axis=1) + 1e-6)
    return tl.full([x.shape[0]], 1.0, tl.float32)


@triton.jit
def _tile(rows, cols, ROW_STRIDE: tl.constexpr):
    """int32 element offsets of a tile inside one chunk (rows < BT, so < 2^31 for any shape we accept)."""
    return rows[:, None] * ROW_STRIDE + cols[None, :]


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
    """A quiet NaN from its bits (a NaN constant differs from itself in Triton's check of a kernel's globals);
    a scalar cast, which makes no layout, so Gluon kernels take it too."""
    return tl.cast(0x7FC00000, tl.float32, bitcast=True)


@triton.jit
def _sequence_of(CU, i, N, SPAN, LOG_N: tl.constexpr, AFTER_FIRST: tl.constexpr = False):
    """The packed sequence whose slots hold slot i: the largest n < N with CU[n] // SPAN + n <= i.

    Packed sequences number their chunks (SPAN = BT) and segments (SPAN = the segment's tokens) by
    slots read straight off the boundaries: sequence n's first slot is CU[n] // SPAN + n, and it
    takes max(ceil(len_n / SPAN), 1) of them. Those never overlap (ceil((b - a) / S) <= b // S -
    a // S + 1), there are at most T // SPAN + N, and no kernel has to count the sequences' chunks
    before the passes start. Binary search over the non-decreasing boundaries.

    AFTER_FIRST: the segments after each sequence's first, numbered from CU[n] // SPAN (the largest n
    with CU[n] // SPAN <= i): by the same bound they never overlap either, and there are at most
    T // SPAN of them (``_segment``)."""
    lo = i * 0
    hi = lo + N - 1
    for _ in tl.static_range(LOG_N):
        mid = (lo + hi + 1) // 2
        bos = tl.load(CU + mid).to(tl.int64)
        ok = (bos // SPAN if AFTER_FIRST else _first_slot(bos, mid, SPAN)) <= i
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid - 1)
    return lo


@triton.jit
def _first_slot(bos, n, SPAN):
    """The first slot of packed sequence n, which starts at token bos (``_sequence_of``)."""
    return bos // SPAN + n


@triton.jit
def _segment(i_s, CU, T, N, SEGS_PER_SEQ, SEG_TOKENS, VARLEN: tl.constexpr, LOG_N: tl.constexpr,
             FIRST_TAKES_REST: tl.constexpr = False, BT: tl.constexpr = 64, AFTER_FIRST: tl.constexpr = False):
    """(sequence, index in it, its segment count, first token, end token, valid, slot) of segment i_s: the
    slot (h_local's and the transitions' row) is i_s itself but with AFTER_FIRST.

    FIRST_TAKES_REST (batch rows): every segment after the first has SEG_TOKENS, the last ending at the
    sequence's last chunk (of BT tokens), and the first takes the chunks they leave, more than SEG_TOKENS
    (launch.plan_segments' lead beside the prepare pass); otherwise the last is the one that differs.
    AFTER_FIRST (packed sequences): i_s numbers only the segments after each sequence's first
    (``_sequence_of``); that of sequence n is slot i_s + n + 1, the slot returned."""
    if VARLEN:
        n = _sequence_of(CU, i_s, N, SEG_TOKENS, LOG_N, AFTER_FIRST)
        bos = tl.load(CU + n).to(tl.int64)
        eos = tl.load(CU + n + 1).to(tl.int64)
        first, count = _segments_of(bos, eos, n, SEG_TOKENS)
        if AFTER_FIRST:  # its j-th segment (j >= 1) is number bos // SEG_TOKENS + j - 1 here, slot first + j
            i_s = i_s + n + 1
        valid = i_s - first < count
    else:
        tl.static_assert(not AFTER_FIRST, "batch rows number their segments after the first in the kernel")
        n = i_s // SEGS_PER_SEQ
        first = n * SEGS_PER_SEQ
        count = i_s * 0 + SEGS_PER_SEQ
        bos = n * T
        eos = bos + T
        valid = n < N
    j = i_s - first
    start = bos + j * SEG_TOKENS
    if FIRST_TAKES_REST:
        tl.static_assert(not VARLEN, "a first segment of its own length is numbered by batch row")
        longer = (T + BT - 1) // BT * BT - SEGS_PER_SEQ * SEG_TOKENS  # what the first has beyond SEG_TOKENS
        start = tl.where(j > 0, start + longer, start)
        end = tl.minimum(start + SEG_TOKENS + tl.where(j > 0, 0, longer), eos)
    else:
        end = tl.minimum(start + SEG_TOKENS, eos)
    end = tl.where(valid, end, start)
    return n, j, count, start, end, valid, i_s


# launch.SEGMENT_WINDOWS: the last chunks of a segment its window may take, and the bound (log2) on the norm of
# their transition under which the state where they start is dropped from the segment's end state.
WINDOW_CHUNKS = tl.constexpr(32)
WINDOW_LOG2_BOUND = tl.constexpr(-30.0)


@triton.jit
def _window(DECAY_ptr, start, end, i_hv, HV: tl.constexpr, BT: tl.constexpr):
    """(first token, truncated, poisoned) of a segment-state program's chunks with SEGMENT_WINDOW.

    The segment's end state is M_w h_w + s_w: s_w what its last w chunks leave from a zero state, h_w the
    state where they start, M_w their transition, the product over their tokens of gamma_t (I - beta_t k_t
    k_t^T), whose norm is at most 2^b: b the sum over the w chunks of log2 of each chunk's decay (its first
    token's row) and of its growth, the sum over its tokens of log2(max(1, |1 - beta_t ||k_t||^2|)) (the row
    after: the prepare pass's GROWTH). The window is the fewest last chunks (at most WINDOW_CHUNKS) with
    b <= WINDOW_LOG2_BOUND: ``truncated``, the program runs only them and the segment's transition is
    dropped (stored as 0), so the segment hands on s_w, off by at most 2^-30 of the state where the window
    starts. Without one (gates too slow, beta ||k||^2 out of [0, 2], a non-finite chunk in them) the segment
    runs whole. ``poisoned``: a chunk before the window is non-finite (its decay NaN); the dropped transition
    is then stored as NaN, which carries it on to every later token as the whole segment's would have.
    (hopper_scan_kernels._window is the same in Gluon, but for where ``poisoned`` looks: the whole sequence
    before the window, for an output pass that scans from the last window.)"""
    chunks = ((end - start + BT - 1) // BT).to(tl.int32)
    back = tl.arange(0, WINDOW_CHUNKS)  # chunks from the segment's end
    inside = back < chunks
    row = (start + (chunks - 1 - back).to(tl.int64) * BT) * HV + i_hv
    bound = tl.log2(tl.load(DECAY_ptr + row, mask=inside, other=1.0)) + tl.load(DECAY_ptr + row + HV, mask=inside,
                                                                                other=0.0)
    # Row i: the bound of the last i + 1 chunks (a NaN among them stays NaN: never within the bound).
    window_bound = tl.sum(tl.where(back[None, :] <= back[:, None], bound[None, :], 0.0), axis=1)
    last = tl.min(tl.where(inside & (window_bound <= WINDOW_LOG2_BOUND), back, WINDOW_CHUNKS), axis=0)
    truncated = last < WINDOW_CHUNKS
    poisoned = chunks < 0  # False
    if truncated:
        for first in range(0, chunks, 128):
            c = first + tl.arange(0, 128)
            decay = tl.load(DECAY_ptr + (start + c.to(tl.int64) * BT) * HV + i_hv, mask=c < chunks, other=1.0)
            poisoned = poisoned | (tl.max(tl.where(decay * 0.0 == 0.0, 0, 1), axis=0) > 0)
    return tl.where(truncated, start + (chunks - 1 - last).to(tl.int64) * BT, start), truncated, poisoned


@triton.jit
def _segments_of(bos, eos, n, SEG_TOKENS):
    """(first segment slot, segment count) of packed sequence n over tokens [bos, eos): an empty
    sequence has one segment (its final state is its initial state)."""
    return _first_slot(bos, n, SEG_TOKENS), tl.maximum((eos - bos + SEG_TOKENS - 1) // SEG_TOKENS, 1)


@triton.jit
def _product(x, y, PRECISION: tl.constexpr):
    """x @ y of fp32 tiles: "bf16" rounds the operands to bf16 (fp32 accumulation), else a Triton precision."""
    if PRECISION == "bf16":
        product = tl.dot(x.to(tl.bfloat16), y.to(tl.bfloat16))
    else:
        product = tl.dot(x, y, input_precision=PRECISION)
    return product


@triton.jit
def _doubling_step(z, r, c, LEVEL: tl.constexpr):
    """-N of the level joining blocks of 2^LEVEL rows in pairs, from z = -rest (``_unit_lower_inverse``):
    z on the band inside the blocks of 2^(LEVEL + 1) rows and outside those of 2^LEVEL rows, zero
    elsewhere (r, c: the tile's row and column indices). One select, no negation (z is -rest already)
    and element-wise only, so the Gluon pass shares it."""
    band = (r[:, None] >> LEVEL) == ((c[None, :] >> LEVEL) ^ 1)
    return tl.where(band, z, 0.0)


@triton.jit
def _unit_lower_inverse(minus_a, N: tl.constexpr, LEVELS: tl.constexpr, PRECISION: tl.constexpr):
    """(I + a)^-1 for strictly lower N x N a (N = 2^LEVELS), by block doubling, from -a.

    With L_s the diagonal blocks of s rows of L = I + a and E_s the part of a that joins two of them
    into a block of 2s rows, L_2s = (I + N_s) L_s with N_s = E_s L_s^-1 and N_s^2 = 0, so
    L_2s^-1 = L_s^-1 (I - N_s). rest = (a outside the blocks of s rows) L_s^-1 holds every N to come:
    N_s is its part on the band of the blocks of 2s rows outside those of s rows, and
    (rest - N_s) (I - N_s) is the next level's. Every operand is a block of the inverse or of a
    times one, never a power of a, and each level's two products share their right operand and are
    independent.

    z carries -rest plus entries inside the blocks of s rows that are never zeroed: they stay inside
    the blocks of 2s rows through z (I - N_s) (N_s joins columns of one such block only) and the
    band of the next level lies outside those, so the products see exact zeros there and the inverse
    is what zeroing them would give, without the zeroing (BENCHMARKS.md, "Block doubling without
    the zeroing"). z is -rest so that each N is a select of it with no negation.

    Not the series (I - a)(I + a^2)(I + a^4)...: its partial products are (I - a^(2^m)) (I + a)^-1,
    and a^32 of a chunk whose keys point the same way (a repeated token, slowly decaying gates)
    reaches 1e4-1e17 before the last factor cancels it (BENCHMARKS.md, "(I + A)^-1 by block
    doubling"): bf16 operands then gave NaN outputs, fp32 ones errors of 41 to 3e10 times the output."""
    r = tl.arange(0, N)
    z = minus_a
    step = _doubling_step(z, r, r, 0)
    inverse = tl.where(r[:, None] == r[None, :], 1.0, step)  # blocks of 2 rows: I - N_1, no product
    z = z + _product(z, step, PRECISION)
    for level in tl.static_range(1, LEVELS):
        step = _doubling_step(z, r, r, level)
        inverse = inverse + _product(inverse, step, PRECISION)
        if level < LEVELS - 1:
            z = z + _product(z, step, PRECISION)
    return inverse


@triton.jit
def _chunk_program(x, y, X, HV: tl.constexpr):
    """(chunk, value head) of the prepare program at (x, y) of the grid (chunks, HV) (X: its chunks).
    Programs in launch order take the value heads of a chunk before the next chunk: those running
    side by side read neighbouring pieces of the same token rows (q, k, v, g and beta are token-major)."""
    program = x.to(tl.int64) + y.to(tl.int64) * X
    return program // HV, program % HV


@triton.jit
def _ready_slot(i_c, X, N):
    """The chunk slot of prepare program i_c of X (a multiple of N) beside the sequential pass (ready_flags):
    the slots taken as N rows of X // N, column by column. Every batch row's chunk c is then ready about when
    its chain reaches it, where slot order had the last row's chain wait for most of the pass. Packed
    sequences: the same where they are of one length; of mixed lengths, a sequence spanning rows gets its
    chunks out of order (each chunk still once, and at the latest by the pass's end, as in slot order)."""
    return (i_c % N) * (X // N) + i_c // N


@triton.jit
def _flag_slots(T, N, CHUNKS_PER_SEQ, BT: tl.constexpr, VARLEN: tl.constexpr):
    """The chunk slots that have a ready flag: every batch row's chunks, or the packed sequences' bound
    (``_sequence_of``); the done counters follow their flags."""
    if VARLEN:
        return (T + BT - 1) // BT + N
    return N * CHUNKS_PER_SEQ


@triton.jit
def _chunk_span(i_c, CU, T, N, CHUNKS_PER_SEQ, BT: tl.constexpr, VARLEN: tl.constexpr, LOG_N: tl.constexpr):
    """(first token, valid rows) of chunk slot i_c; 0 rows for the slots no packed sequence fills
    (``_sequence_of``)."""
    if VARLEN:
        n = _sequence_of(CU, i_c, N, BT, LOG_N)
        bos = tl.load(CU + n).to(tl.int64)
        chunk_start = bos + (i_c - _first_slot(bos, n, BT)) * BT
        length = tl.maximum(tl.minimum(tl.load(CU + n + 1).to(tl.int64) - chunk_start, BT), 0)
    else:
        n = i_c // CHUNKS_PER_SEQ
        chunk_start = n * T + (i_c % CHUNKS_PER_SEQ) * BT
        length = tl.minimum(n * T + T - chunk_start, BT)
    return chunk_start, length


@triton.jit
def _chunk_keys(K_ptr, G_ptr, BETA_ptr, chunk_start, length, i_h, i_hv,
                H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                L2NORM: tl.constexpr):
    """One chunk's keys, betas and gates: (l2-normalized k, 1 / ||k|| (rk), beta, the gate cumsum,
    the first row whose k, g or beta is non-finite). That row and the ones after it are zeroed
    (their outputs become NaN later)."""
    rows = tl.arange(0, BT)
    k_cols = tl.arange(0, BK)
    in_chunk = rows < length
    k = tl.load(K_ptr + (chunk_start * H + i_h) * K + _tile(rows, k_cols, H * K),
                mask=in_chunk[:, None] & (k_cols[None, :] < K), other=0.0)
    g = tl.load(G_ptr + chunk_start * HV + i_hv + rows * HV, mask=in_chunk, other=0.0).to(tl.float32)
    b = tl.load(BETA_ptr + chunk_start * HV + i_hv + rows * HV, mask=in_chunk, other=0.0).to(tl.float32)
    rk = _row_rsqrt_norm(k, L2NORM)
    if L2NORM:
        k = (k.to(tl.float32) * rk[:, None]).to(k.dtype)

    # Element-wise checks: reducing a product's result instead (the diagonal of k k^T, or a product
    # with a constant tile) crashed Triton 3.6's sm_100 compile (OptimizeTMemLayouts).
    first_bad = tl.min(tl.where(_bad_rows(k) | _bad(g) | _bad(b), rows, BT), axis=0)
    keep = rows < first_bad
    k = tl.where(keep[:, None], k, 0.0)
    g, b = tl.where(keep, g, 0.0), tl.where(keep, b, 0.0)
    return k, rk, b, tl.cumsum(g, axis=0), first_bad


@triton.jit
def _chunk_inverse(k, b, gc, BT: tl.constexpr, DOT_PRECISION: tl.constexpr, INVERSE_PRECISION: tl.constexpr):
    """Ai = (I + A)^-1 of one chunk, A = strictly lower (beta k k^T . Gamma), as whole BT-row tiles.

    Whole tiles, not two halves: BT = 64 rows give each of 4 warps its own 16 rows of every
    tensor-core product, where 32-row halves made two warps repeat the other two's work (and
    hold its registers).
    """
    rows = tl.arange(0, BT)
    kb = (k.to(tl.float32) * b[:, None]).to(k.dtype)
    a = tl.dot(kb, tl.trans(k), input_precision=DOT_PRECISION)
    minus_a = tl.where(rows[:, None] > rows[None, :], a * -tl.exp(gc[:, None] - gc[None, :]), 0.0)
    return _unit_lower_inverse(minus_a, BT, CHUNK_INVERSE_LEVELS, INVERSE_PRECISION)


@triton.jit
def gdn_combine_kernel(
    H0_ptr, HLOC_ptr, M_ptr, HINIT_ptr, CU, N, SEGS_PER_SEQ, SEG_TOKENS,
    HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, KB: tl.constexpr,
    HAS_INITIAL: tl.constexpr, VARLEN: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Each segment's true initial state: h_{s+1} = M_s h_s + h_local_s along the sequence.

    K <= KB: one product per segment with the whole K x K operator, whose loads (and h_local's) do
    not depend on the state, so the pipeliner issues them a segment ahead and only the product is on
    the chain. Wider K: the operator in KB-column blocks, the state read back from where it was just
    stored (a K x K operator does not fit in registers next to the state)."""
    i_v = tl.program_id(0)
    i_n = tl.program_id(1).to(tl.int64)
    i_hv = tl.program_id(2).to(tl.int64)
    if VARLEN:
        first, count = _segments_of(tl.load(CU + i_n).to(tl.int64), tl.load(CU + i_n + 1).to(tl.int64), i_n,
                                    SEG_TOKENS)
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
    if BK <= KB:
        k_cols = tl.arange(0, BK)
        operator_mask = (k_rows[:, None] < K) & (k_cols[None, :] < K)
        for j in range(0, count - 1):
            base = ((first + j) * HV + i_hv) * K
            tl.store(HINIT_ptr + base * V + tile, state, mask=tile_mask)
            m = tl.load(M_ptr + (base + k_rows[:, None]) * K + k_cols[None, :], mask=operator_mask, other=0.0)
            local = tl.load(HLOC_ptr + base * V + tile, mask=tile_mask, other=0.0)
            state = tl.dot(m, state, input_precision=DOT_PRECISION) + local
        last = ((first + count - 1) * HV + i_hv) * K
        tl.store(HINIT_ptr + last * V + tile, state, mask=tile_mask & (count > 0))
    else:
        for j in range(0, count):
            segment = first + j
            base = (segment * HV + i_hv) * K
            tl.store(HINIT_ptr + base * V + tile, state, mask=tile_mask)
            if j < count - 1:
                tl.debug_barrier()
                state = tl.load(HLOC_ptr + base * V + tile, mask=tile_mask, other=0.0)
                for kb in tl.static_range(0, BK, KB):
                    m_cols = kb + tl.arange(0, KB)
                    m = tl.load(M_ptr + (base + k_rows[:, None]) * K + m_cols[None, :],
                                mask=(k_rows[:, None] < K) & (m_cols[None, :] < K), other=0.0)
                    h = tl.load(HINIT_ptr + (base + m_cols[:, None]) * V + cols[None, :],
                                mask=(m_cols[:, None] < K) & (cols[None, :] < V), other=0.0)
                    state += tl.dot(m, h, input_precision=DOT_PRECISION)
