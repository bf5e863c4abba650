"""The sequential pass of the gated delta rule for Hopper (sm_90), state in registers, in Gluon.

The same pass as ``hopper_kernels.gdn_recurrence_hopper_kernel`` (same arguments, same results up
to the order of fp32 sums), computed transposed: the program holds h^T (its BV value columns as
rows, K columns) in registers, and every product on the state's path takes its left operand from
registers (as FlashAttention 3 keeps P):

    v_new^T = u^T - h^T w^T          (h^T: registers; w^T: the chunk's w tile in shared memory)
    h'^T    = decay h^T + (v_new^T diag(k_scale)) k
    o^T     = h^T q^T diag(q_scale) + v_new^T P^T

so neither the state nor v_new goes through shared memory (and no fence and barrier) between
one product and the next; the accumulator of one product becomes the next's left operand in
place. wgmma's 64-row products make BV = 64 per warpgroup: a program of one warpgroup holds one
64-column tile, one of two warpgroups (8 warps, BV = 128) two neighbouring tiles, each warpgroup
the state of its own 64 rows of h^T, and each chunk's q, k, w and P tiles are copied once for both
(launch.HOPPER_REGISTER_PAIRS, where the pairs still fill every SM: at B8 T4096 32/32 on the H200
the one-warpgroup pass had L2 at 96% of its peak, and the pairs took it from 408 to 373 us,
BENCHMARKS.md "seventeenth set"). It runs uncut sequences and, where each segment has enough chunks,
the output pass of cut ones (launch._recipe, launch.HOPPER_REGISTER_CUT): on the H200 a chunk of 64
columns takes it about 1.3x what the shared-state pass takes for 32, and as the output pass beside
the segment passes it took 101 us where the shared-state pass took 120 ("twenty-third set"). With
SEGMENT_STATE it is the segment-state pass of those cut sequences (columns [V | K] as in hopper_kernels:
each segment's state from zero, and its transition from the identity with u = 0; no outputs, so q's and
P's tiles are never copied: two stages fit 81 KiB, two programs per SM).

With FROM_V (launch.HOPPER_PAIRS_FROM_V, the two-warpgroup form of uncut sequences) the chain is
FlashInfer's: v_new^T = (v^T - (k h)^T diag(factor)) T^T from v's tile and the prepare pass's T, three
products on the state's path where the form above has two, and no w or u made or read (on the H200 at
B8 T4096 32/32 the op 10.8% faster, BENCHMARKS.md "twenty-sixth set"). With SCORES (launch.HOPPER_PAIRS_SCORES,
the pairs after the prepare pass) each chunk's P is formed here, from the q and k tiles and two exponents
per token (``_scores``), not copied in: on an H100 at B8 T4096 32/32 the op 4.5% faster, the same bits
(BENCHMARKS.md "thirty-seventh set"). The same pairs also run cut batch rows (launch.HOPPER_WINDOWED_PAIRS):
the segment-state pass in this order without outputs (FROM_V with SEGMENT_STATE and SEGMENT_WINDOW: no q, P or o;
a transition program's v reads 0), then the pairs with AFTER_WINDOWS, each scanning back to the last window
(``hopper_scan_kernels``, one buffer per step at their 128 columns). w's factor of k comes in through WS_ptr,
or, where the pairs form P, with the chunk's other scales in P's place (the segment states before them too:
CHUNK_SCALES), so the prepare pass stores the scales once.
Where those pairs form P their tiles of T, k, q and v come in by TMA (launch.HOPPER_PAIRS_TMA, TMA here): one copy
instruction a tile from one thread, where cp.async took 14 instructions a thread whose burst held up the loads on
the state's path in the shared-memory queue (BENCHMARKS.md, "forty-third set"); each program's descriptors live in
Triton's global scratch, a part of the op's workspace.
A v row that is not finite is seen by nothing before the pairs (the prepare pass does not read v in this form):
it reaches the rest of its segment, and a later segment only through a window it lies in (the spec's causality
holds either way).

With AWAIT the pass runs beside the prepare pass (launch.plan_segments' concurrent form: uncut
sequences, batch rows or packed, whose programs leave at least half the SMs): it is launched first,
lets the prepare pass start at once as its programmatic dependent, and waits for each chunk's ready
flag before copying the chunk in (ready_flags).

With LEAD and AFTER_LEAD the cut sequences' passes run launch.plan_segments' ``lead`` form. A
sequence's first segment starts from the sequence's initial state, so it needs no segment state of
its own: its output pass (LEAD, grid (NV, N, HV)) runs first, beside the segment-state pass of the
segments after it (AFTER_LEAD with SEGMENT_STATE), which it lets start at once as its programmatic
dependent; its end state goes to h_local's slot of that segment, which the segment-state pass leaves
unused. The output pass of the other segments (AFTER_LEAD) then runs, each program first scanning the
segment states from that end state up to its own segment (``hopper_scan_kernels._scan_from_lead``: the combine
pass's scan, without a launch of its own between the passes). The first segment takes no SMs in the second
wave, so the same SMs hold one segment more per sequence, each shorter.

Packed sequences (VARLEN) run the same form: the lead takes each sequence's first segment slot
(kernels._sequence_of), and the passes after it number only the segments after each sequence's first
(kernels._segment's AFTER_FIRST: at most T // SEG_TOKENS of them whatever the lengths, so no program is
left for a first segment's slot). A packed sequence of one segment is its lead alone, which stores its
final state.

Where launches may run side by side (launch.concurrent_passes_allowed) and the plan estimates it shorter,
the lead runs beside the prepare pass too (launch.HOPPER_LEAD_BESIDE_PREPARE): LEAD with AWAIT is launched
first and waits for each chunk's ready flag, the prepare pass is its programmatic dependent on the other
SMs, and the segment-state pass (AWAIT, its flags all raised by then) the prepare pass's. The first
segment is then the longer one (FIRST_TAKES_REST, in all three passes): its output pass runs through the
prepare pass and on beside the other segments' states, so those and the output pass after them are
shorter.

Offsets: int64 up to each chunk's first element, int32 inside a chunk (as in kernels.py).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy,
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from polykernels.gated_delta_rule.hopper_kernels import (
    _chunk_stages,
    _copy_chunk_tiles,
    _copy_layout,
    _copy_tile,
    _mma_layout,
    _segment_state_columns,
    _smem_layout,
    _store_segment_state,
)
from polykernels.gated_delta_rule.hopper_prepare_kernels import chunk_scales, gated_scores
from polykernels.gated_delta_rule.hopper_scan_kernels import _NAN_BITS, _scan_from_lead, _state_after_windows, _window

# Scalar arithmetic only (no layouts), so the Triton helper serves Gluon kernels too.
from polykernels.gated_delta_rule.kernels import (
    _bad_rows,
    _first_slot,
    _flag_slots,
    _segment,
)
from polykernels.gated_delta_rule.ready_flags import await_flag, count_done, end_after_leader, launch_dependents


@gluon.constexpr_function
def _transposed_store_layout(block_v, warps):
    # o^T tiles leave as o rows: each thread 8 consecutive value columns (16 bytes) of one token.
    per_col = block_v // 8
    return gl.BlockedLayout(size_per_thread=[8, 1], threads_per_warp=[per_col, 32 // per_col],
                            warps_per_cta=[1, warps], order=[0, 1])


@gluon.constexpr_function
def _vector_layout(warps):
    return gl.BlockedLayout(size_per_thread=[1], threads_per_warp=[32], warps_per_cta=[warps], order=[0])


@gluon.jit
def _copy_chunk_t(chunk_start, end, stage, i_h, i_hv, col0, u_limit, Q_ptr, K_ptr, W_ptr, U_ptr, P_ptr, QS_ptr,
                  KS_ptr, w_s, k_s, q_s, p_s, u_s, scales_s, H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr,
                  V: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr, BV: gl.constexpr, OUTPUTS: gl.constexpr,
                  U_COLS_IN: gl.constexpr):
    """The chunk's tiles (q's and P's only with OUTPUTS; u's columns past ``u_limit`` read 0) and its
    per-token scales (q's, then k's) into stage ``stage``, one cp.async group. Transposed, a scale
    vector costs 16 registers per thread: they wait in shared memory."""
    _copy_chunk_tiles(chunk_start, end, stage, i_h, i_hv, col0, u_limit, Q_ptr, K_ptr, W_ptr, U_ptr, P_ptr,
                      w_s, k_s, q_s, p_s, u_s, H, HV, K, V, BT, BK, BV, OUTPUTS, False, U_COLS_IN)
    layout: gl.constexpr = _vector_layout(gl.num_warps())
    i = gl.arange(0, 2 * BT, layout=layout)
    token = i % BT
    offsets = (chunk_start * HV + i_hv) + token * HV
    pointers = gl.where(i < BT, QS_ptr + offsets, KS_ptr + offsets)
    async_copy.async_copy_global_to_shared(scales_s.index(stage), pointers, chunk_start + token < end)
    async_copy.commit_group()


@gluon.jit
def _store_output_t(O_ptr, out_s, chunk_start, end, i_hv, col0, HV: gl.constexpr, V: gl.constexpr,
                    BT: gl.constexpr, BV: gl.constexpr):
    """The chunk's o^T tile, waiting in shared memory, stored as o's rows: 16 bytes per thread."""
    layout: gl.constexpr = _transposed_store_layout(BV, gl.num_warps())
    cols = col0 + gl.arange(0, BV, layout=gl.SliceLayout(1, layout))
    tokens = gl.arange(0, BT, layout=gl.SliceLayout(0, layout))
    tile = (chunk_start * HV + i_hv) * V + tokens[None, :] * (HV * V) + cols[:, None]
    mask = (chunk_start + tokens < end)[None, :] & (cols[:, None] < V)
    gl.store(O_ptr + tile, out_s.load(layout), mask=mask)


@gluon.jit
def _copy_chunk_from_v(chunk_start, end, stage, i_h, i_hv, col0, v_limit, Q_ptr, K_ptr, T_ptr, V_ptr, P_ptr, QS_ptr,
                       KS_ptr, WS_ptr, t_s, k_s, q_s, p_s, v_s, scales_s, H: gl.constexpr, HV: gl.constexpr,
                       K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr, BV: gl.constexpr,
                       SCORES: gl.constexpr, OUTPUTS: gl.constexpr, CHUNK_MAJOR: gl.constexpr):
    """The FROM_V form's chunk, one cp.async group: T (BT x BT), k, v's columns (those past ``v_limit``
    read 0), q, P, and the scales (q's, k's, then w's factor of k and k's again: two power-of-two vectors).
    SCORES: no P, but the exponents P is formed from (``_scores``), rows' then columns', after the scales.
    Without OUTPUTS (a segment-state program) neither q nor P. CHUNK_MAJOR: the scales where the prepare pass
    stores them with SCORE_FACTORS (``_copy_scales_from_v``)."""
    row_of = chunk_start * HV + i_hv
    qk_chunk = (chunk_start * H + i_h) * K
    _copy_tile(t_s.index(stage), T_ptr + row_of * BT, chunk_start, end, 0, BT, HV * BT, BT, BT, False, True)
    _copy_tile(k_s.index(stage), K_ptr + qk_chunk, chunk_start, end, 0, K, H * K, BT, BK, False, True)
    _copy_tile(v_s.index(stage), V_ptr + row_of * V, chunk_start, end, col0, v_limit, HV * V, BT, BV, False,
               V % BV == 0 and OUTPUTS)
    if OUTPUTS:
        _copy_tile(q_s.index(stage), Q_ptr + qk_chunk, chunk_start, end, 0, K, H * K, BT, BK, False, True)
    if OUTPUTS and not SCORES:
        _copy_tile(p_s.index(stage), P_ptr + row_of * BT, chunk_start, end, 0, BT, HV * BT, BT, BT, False, True)
    _copy_scales_from_v(chunk_start, end, stage, i_hv, P_ptr, QS_ptr, KS_ptr, WS_ptr, scales_s, HV, BT, SCORES,
                        CHUNK_MAJOR)


@gluon.jit
def _copy_scales_from_v(chunk_start, end, stage, i_hv, P_ptr, QS_ptr, KS_ptr, WS_ptr, scales_s, HV: gl.constexpr,
                        BT: gl.constexpr, SCORES: gl.constexpr, CHUNK_MAJOR: gl.constexpr,
                        ONE_COPY: gl.constexpr = False):
    """The FROM_V form's per-token scales of a chunk (``_copy_chunk_from_v``), then the chunk's cp.async group.
    Each BT-long part: q's, k's, w's factor, k's; with SCORES (k's only once) then each token's two exponents, rows'
    then columns'. CHUNK_MAJOR (wherever the pairs form P: SCORES, and the windowed segment states before them):
    from the chunk's scales as the prepare pass stores them there (``chunk_scales``: each part's tokens contiguous,
    so a warp's copy reads one line), k's only once; else from the token-major [tokens, heads] vectors.
    ONE_COPY (with SCORES): all in one copy (each copy into a slice of the stage costs a barrier: the compiler
    cannot tell the slices apart behind the stage's index). The TMA form takes it (on an H100, against its three
    copies, B8 T4096 -3.1%, B1 T32768 32/32 -0.8%); beside the cp.async tiles it cost the B1 rows 2%, so they keep
    three copies (BENCHMARKS.md, 43rd and 45th sets)."""
    gl.static_assert(SCORES or not ONE_COPY, "ONE_COPY: the chunk's scales where the pairs form P")
    gl.static_assert(CHUNK_MAJOR or not SCORES, "SCORES: the prepare pass stores the scales chunk-major")
    layout: gl.constexpr = _vector_layout(gl.num_warps())
    if CHUNK_MAJOR:  # the prepare pass's chunk_scales: each part's tokens contiguous, parts 3, 6 and 7 not copied
        length = gl.minimum(end - chunk_start, BT)
        scales = P_ptr + chunk_scales(chunk_start, length, i_hv, HV)
        if ONE_COPY:
            i = gl.arange(0, 8 * BT, layout=layout)
            part, token = i // BT, i % BT
            async_copy.async_copy_global_to_shared(scales_s.index(stage), scales + part * length + token,
                                                   (token < length) & (part != 3) & (part < 6))
        else:
            i = gl.arange(0, 2 * BT, layout=layout)
            part, token = i // BT, i % BT
            for first in gl.static_range(0, 6 if SCORES else 4, 2):
                async_copy.async_copy_global_to_shared(scales_s.index(stage).slice(first * BT, 2 * BT),
                                                       scales + (first + part) * length + token,
                                                       (token < length) & (first + part != 3))
    else:
        i = gl.arange(0, 2 * BT, layout=layout)
        token = i % BT
        offsets = (chunk_start * HV + i_hv) + token * HV
        inside = chunk_start + token < end
        async_copy.async_copy_global_to_shared(scales_s.index(stage).slice(0, 2 * BT),
                                               gl.where(i < BT, QS_ptr + offsets, KS_ptr + offsets), inside)
        async_copy.async_copy_global_to_shared(scales_s.index(stage).slice(2 * BT, 2 * BT),
                                               gl.where(i < BT, WS_ptr + offsets, KS_ptr + offsets), inside)
    async_copy.commit_group()


@gluon.jit
def _tile_descriptors(start, end, i_h, i_hv, col0, Q_ptr, K_ptr, T_ptr, V_ptr, H: gl.constexpr, HV: gl.constexpr,
                      K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr, BV: gl.constexpr):
    """TMA descriptors of the program's T, k, q and v rows from ``start``: rows from ``end`` on read 0, as the
    masked cp.async copies read them (at least one row: a program that runs no chunk copies nothing)."""
    rows = gl.maximum((end - start).to(gl.int32), 1)
    t_desc = tma.make_tensor_descriptor(T_ptr + (start * HV + i_hv) * BT, [rows, BT], [HV * BT, 1], [BT, BT],
                                        _smem_layout(BT, BT))
    k_desc = tma.make_tensor_descriptor(K_ptr + (start * H + i_h) * K, [rows, K], [H * K, 1], [BT, BK],
                                        _smem_layout(BT, BK))
    q_desc = tma.make_tensor_descriptor(Q_ptr + (start * H + i_h) * K, [rows, K], [H * K, 1], [BT, BK],
                                        _smem_layout(BT, BK))
    v_desc = tma.make_tensor_descriptor(V_ptr + (start * HV + i_hv) * V + col0, [rows, BV], [HV * V, 1], [BT, BV],
                                        _smem_layout(BT, BV))
    return t_desc, k_desc, q_desc, v_desc


@gluon.jit
def _copy_chunk_tma(j, stage, ready, descriptors, t_s, k_s, q_s, v_s, BT: gl.constexpr, pred):
    """The program's chunk ``j`` (from its first) of T, k, q and v into stage ``stage`` by TMA, each tile counted on
    its own barrier (``ready``: one allocation per tile, so the compiler puts one thread barrier between the four
    expects and the four copies, not one before each): a few copies issued by one thread each where cp.async took
    14 instructions per thread."""
    t_desc, k_desc, q_desc, v_desc = descriptors
    t_ready, k_ready, q_ready, v_ready = ready
    mbarrier.expect(t_ready.index(stage), t_desc.block_type.nbytes, pred=pred)
    mbarrier.expect(k_ready.index(stage), k_desc.block_type.nbytes, pred=pred)
    mbarrier.expect(q_ready.index(stage), q_desc.block_type.nbytes, pred=pred)
    mbarrier.expect(v_ready.index(stage), v_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(t_desc, [j * BT, 0], t_ready.index(stage), t_s.index(stage), pred=pred)
    tma.async_copy_global_to_shared(k_desc, [j * BT, 0], k_ready.index(stage), k_s.index(stage), pred=pred)
    tma.async_copy_global_to_shared(q_desc, [j * BT, 0], q_ready.index(stage), q_s.index(stage), pred=pred)
    tma.async_copy_global_to_shared(v_desc, [j * BT, 0], v_ready.index(stage), v_s.index(stage), pred=pred)


@gluon.jit
def _tile_barriers(STAGES: gl.constexpr):
    """One mbarrier per stage for each of the four tiles TMA copies, initialized."""
    t_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(t_ready.index(s), count=1)
        mbarrier.init(k_ready.index(s), count=1)
        mbarrier.init(q_ready.index(s), count=1)
        mbarrier.init(v_ready.index(s), count=1)
    fence_async_shared()
    return t_ready, k_ready, q_ready, v_ready


@gluon.jit
def _await_tiles(ready, stage, phase):
    """Waits until stage ``stage``'s four tiles are in (``phase``: how many times the stage has filled, mod 2)."""
    t_ready, k_ready, q_ready, v_ready = ready
    mbarrier.wait(t_ready.index(stage), phase)
    mbarrier.wait(k_ready.index(stage), phase)
    mbarrier.wait(q_ready.index(stage), phase)
    mbarrier.wait(v_ready.index(stage), phase)


@gluon.jit
def _forget_tile_barriers(ready, STAGES: gl.constexpr):
    """Invalidates the tile barriers (no copy is in flight: none was issued past the last chunk)."""
    for s in gl.static_range(STAGES):
        for b in gl.static_range(4):
            mbarrier.invalidate(ready[b].index(s))


@gluon.jit
def _first_bad_row(tile, BT: gl.constexpr, COLS: gl.constexpr):
    """A chunk's tile in shared memory (its rows' layout) and the index of its first row holding NaN or Inf."""
    layout: gl.constexpr = _copy_layout(COLS, gl.num_warps())
    rows = gl.arange(0, BT, layout=gl.SliceLayout(1, layout))
    values = tile.load(layout)
    return values, rows, gl.min(gl.where(_bad_rows(values), rows, BT), axis=0)


@gluon.jit
def _clean_rows(v_tile, k_tile, BT: gl.constexpr, BV: gl.constexpr, BK: gl.constexpr):
    """The checked run's look at a chunk's v and k tiles, which this form's products take raw: the
    first row of either holding NaN or Inf (BT: none), and both tiles' rows from it zeroed in place
    (0 x Inf in k h's or T's product would reach the earlier rows; the prepare pass has already cut
    T, the scales and the decay at a bad k row)."""
    v, v_rows, first_bad_v = _first_bad_row(v_tile, BT, BV)
    k, k_rows, first_bad_k = _first_bad_row(k_tile, BT, BK)
    first_bad = gl.minimum(first_bad_v, first_bad_k)
    if first_bad < BT:
        gl.thread_barrier()  # every thread's reads of both tiles are done
        v_tile.store(gl.where((v_rows < first_bad)[:, None], v, 0.0).to(v_tile.dtype))
        k_tile.store(gl.where((k_rows < first_bad)[:, None], k, 0.0).to(k_tile.dtype))
        fence_async_shared()
        gl.thread_barrier()
    return first_bad


@gluon.jit
def _chunk_in(c, start, DECAY_ptr, i_hv, HV: gl.constexpr, BT: gl.constexpr, STAGES: gl.constexpr):
    """The loop's chunk ``c``: its first token, its stage and its decay, once its tiles are in."""
    chunk_start = start + c * BT
    stage = c % STAGES
    decay = gl.load(DECAY_ptr + chunk_start * HV + i_hv)
    async_copy.wait_group(STAGES - 2)  # this chunk's tiles are in
    fence_async_shared()
    gl.thread_barrier()  # every thread's copies, and the previous chunk's reads of the stage reused below
    return chunk_start, stage, decay


@gluon.constexpr_function
def _scores_layout(chunk, warps):
    # P (chunk x chunk) over every warpgroup of the program: each takes its own columns.
    groups = warps // 4
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, groups], instr_shape=[16, chunk // groups, 16])


@gluon.jit
def _scores(qk, factors, BT: gl.constexpr):
    """P from the chunk's q k^T and the two exponents per token the prepare pass stores (SCORE_FACTORS),
    by the prepare pass's own formula (``hopper_prepare_kernels.gated_scores``): the bits it would have stored."""
    layout: gl.constexpr = qk.type.layout
    r = gl.arange(0, BT, layout=gl.SliceLayout(1, layout))
    c = gl.arange(0, BT, layout=gl.SliceLayout(0, layout))
    s_r = factors.slice(0, BT).load(gl.SliceLayout(1, layout))
    b_c = factors.slice(BT, BT).load(gl.SliceLayout(0, layout))
    return gated_scores(qk, s_r, b_c, r, c)


@gluon.jit
def _state_update(state, v_new, decay, k_s, scales_s, stage, dtype: gl.constexpr, BT: gl.constexpr,
                  OUTPUTS: gl.constexpr, update_a: gl.constexpr, tokens_of: gl.constexpr):
    """The chunk's update on the state's path, in either order of the chain: h^T decay + (v_new diag(k's
    scale))^T k, issued, not waited on. Returns it and v_new, waited on (q h, with OUTPUTS, may run on)."""
    k_scale = scales_s.index(stage).slice(BT, BT).load(tokens_of)
    v_new = warpgroup_mma_wait(1 if OUTPUTS else 0, deps=(v_new,))
    update = gl.convert_layout((v_new * k_scale[None, :]).to(dtype), update_a)
    return warpgroup_mma(update, k_s.index(stage), state * decay, is_async=True), v_new


@gluon.jit
def _chunk_output(state, v_new, minus_qh, minus_q_scale, p_s, out_s, stage, c, dtype: gl.constexpr,
                  state_a: gl.constexpr):
    """o^T = v_new^T P^T - (q h)^T diag(q's scale) behind the update, into o's buffer of chunk c (the next
    chunk stores it, ``_store_output_t``). Returns the update, waited on."""
    minus_qh = warpgroup_mma_wait(1, deps=(minus_qh,))
    out = warpgroup_mma(gl.convert_layout(v_new.to(dtype), state_a), p_s.index(stage).permute((1, 0)),
                        minus_qh * minus_q_scale[None, :], is_async=True)
    state, out = warpgroup_mma_wait(0, deps=(state, out))
    out_s.index(c % 2).store(out.to(dtype))
    return state


@gluon.jit
def _store_last_output(O_ptr, out_s, chunks, start, end, i_hv, col0, HV: gl.constexpr, V: gl.constexpr,
                       BT: gl.constexpr, BV: gl.constexpr):
    """The last chunk's output, which no later chunk stores."""
    if chunks > 0:
        gl.thread_barrier()  # every thread's part of the last output tile is in
        _store_output_t(O_ptr, out_s.index((chunks + 1) % 2), start + (chunks - 1) * BT, end, i_hv, col0, HV, V, BT,
                        BV)


@gluon.jit
def _from_v_stages(dtype: gl.constexpr, STAGES: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr, BV: gl.constexpr,
                   SCORES: gl.constexpr):
    """The FROM_V form's shared memory: the chunk stages (T, k, q, P, v, the scales) and o's two buffers."""
    t_s = gl.allocate_shared_memory(dtype, [STAGES, BT, BT], _smem_layout(BT, BT))
    k_s = gl.allocate_shared_memory(dtype, [STAGES, BT, BK], _smem_layout(BT, BK))
    q_s = gl.allocate_shared_memory(dtype, [STAGES, BT, BK], _smem_layout(BT, BK))
    p_s = gl.allocate_shared_memory(dtype, [STAGES, BT, BT], _smem_layout(BT, BT))
    v_s = gl.allocate_shared_memory(dtype, [STAGES, BT, BV], _smem_layout(BT, BV))
    scales_s = gl.allocate_shared_memory(gl.float32, [STAGES, (8 if SCORES else 4) * BT],
                                         gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0]))
    out_s = gl.allocate_shared_memory(dtype, [2, BV, BT], gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8,
                                                                                  order=[0, 1]))
    return t_s, k_s, q_s, p_s, v_s, scales_s, out_s


@gluon.jit
def _chunks_from_v(state, start, end, i_h, i_hv, col0, v_limit, Q_ptr, K_ptr, T_ptr, V_ptr, P_ptr, QS_ptr, KS_ptr,
                   WS_ptr, DECAY_ptr, O_ptr, t_s, k_s, q_s, p_s, v_s, scales_s, out_s, H: gl.constexpr,
                   HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr,
                   BV: gl.constexpr, STAGES: gl.constexpr, CHECKED: gl.constexpr, state_l: gl.constexpr,
                   chunk_l: gl.constexpr, flags, AWAIT: gl.constexpr, SCORES: gl.constexpr, OUTPUTS: gl.constexpr,
                   TMA: gl.constexpr = False, CHUNK_MAJOR: gl.constexpr = False):
    """FlashInfer's order of the chain: v_new^T = (v^T - (k h)^T diag(ws)) T^T, three products on
    the state's path (k h, T, the update), with q h and P behind them (launch.HOPPER_PAIRS_FROM_V).
    CHECKED: each chunk's v and k rows from the first non-finite one are zeroed, and that row's outputs
    and the state poisoned, as the prepare pass does where it forms u. AWAIT: beside the prepare pass,
    each chunk's copies wait for its ready flag, as in the kernel's other chain. SCORES: the chunk's P is
    formed here from its q and k tiles (``_scores``, both warpgroups a half each), not copied in: q k^T
    issued first, scaled in the shadow of T's product and q h, and through shared memory to the output
    product (the prepare pass then neither forms nor stores it: BENCHMARKS.md, "thirty-seventh set").
    Without OUTPUTS (a windowed segment-state program) the state's path alone: no q, P, q h or o; v's
    columns past ``v_limit`` read 0 (a transition program's). TMA (the output pass forming P,
    launch.HOPPER_PAIRS_TMA): T, k, q and v come in by TMA (``_copy_chunk_tma``), the scales by cp.async in one
    copy. CHUNK_MAJOR: the scales as the prepare pass stores them where the pairs form P (``_copy_scales_from_v``;
    SCORES takes them so: ``_copy_scales_from_v`` checks it)."""
    dtype: gl.constexpr = T_ptr.dtype.element_ty
    state_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=chunk_l, k_width=2)
    update_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=state_l, k_width=2)
    tokens_of: gl.constexpr = gl.SliceLayout(0, chunk_l)
    scores_l: gl.constexpr = _scores_layout(BT, gl.num_warps())
    chunks = ((end - start + BT - 1) // BT).to(gl.int32)
    last = gl.maximum(chunks - 1, 0)
    if TMA:  # the tiles by TMA (one mbarrier per tile and stage), the scales by cp.async
        gl.static_assert(OUTPUTS and not AWAIT, "TMA: the output pass after the prepare pass")
        ready = _tile_barriers(STAGES)
        descriptors = _tile_descriptors(start, end, i_h, i_hv, col0, Q_ptr, K_ptr, T_ptr, V_ptr, H, HV, K, V, BT, BK,
                                        BV)
    for ahead in gl.static_range(STAGES - 1):
        if AWAIT:
            await_flag(flags + gl.minimum(ahead, last) * HV)
        if TMA:
            _copy_chunk_tma(ahead, ahead, ready, descriptors, t_s, k_s, q_s, v_s, BT, ahead < chunks)
            _copy_scales_from_v(start + ahead * BT, end, ahead, i_hv, P_ptr, QS_ptr, KS_ptr, WS_ptr, scales_s, HV, BT,
                                SCORES, CHUNK_MAJOR, True)
        else:
            _copy_chunk_from_v(start + ahead * BT, end, ahead, i_h, i_hv, col0, v_limit, Q_ptr, K_ptr, T_ptr, V_ptr,
                               P_ptr, QS_ptr, KS_ptr, WS_ptr, t_s, k_s, q_s, p_s, v_s, scales_s, H, HV, K, V, BT, BK,
                               BV, SCORES, OUTPUTS, CHUNK_MAJOR)
    zero = gl.zeros([BV, BT], gl.float32, layout=chunk_l)
    for c in range(0, chunks):
        chunk_start, stage, decay = _chunk_in(c, start, DECAY_ptr, i_hv, HV, BT, STAGES)
        if TMA:
            _await_tiles(ready, stage, (c // STAGES) & 1)
        if CHECKED:  # NaN from the first non-finite v or k row on: the outputs (through q's scale), and the state
            first_bad = _clean_rows(v_s.index(stage), k_s.index(stage), BT, BV, BK)
            nan = gl.full([BT], _NAN_BITS, gl.int32, layout=tokens_of).to(gl.float32, bitcast=True)
            poison = gl.where(gl.arange(0, BT, layout=tokens_of) < first_bad, 0.0, nan)
            decay = decay + gl.sum(poison, axis=0)
        if SCORES:  # first: it needs only the chunk's tiles
            qk = warpgroup_mma(q_s.index(stage), k_s.index(stage).permute((1, 0)),
                               gl.zeros([BT, BT], gl.float32, layout=scores_l), use_acc=False, is_async=True)
        minus_h = gl.convert_layout((-state).to(dtype), state_a)
        minus_kh = warpgroup_mma(minus_h, k_s.index(stage).permute((1, 0)), zero, use_acc=False, is_async=True)
        # While k h runs: the chunk STAGES - 1 ahead into the stage the previous chunk used.
        if AWAIT:
            await_flag(flags + gl.minimum(c + STAGES - 1, last) * HV)
        if TMA:
            _copy_chunk_tma(c + STAGES - 1, (c + STAGES - 1) % STAGES, ready, descriptors, t_s, k_s, q_s, v_s, BT,
                            c + STAGES - 1 < chunks)
            _copy_scales_from_v(chunk_start + (STAGES - 1) * BT, end, (c + STAGES - 1) % STAGES, i_hv, P_ptr, QS_ptr,
                                KS_ptr, WS_ptr, scales_s, HV, BT, SCORES, CHUNK_MAJOR, True)
        else:
            _copy_chunk_from_v(chunk_start + (STAGES - 1) * BT, end, (c + STAGES - 1) % STAGES, i_h, i_hv, col0,
                               v_limit, Q_ptr, K_ptr, T_ptr, V_ptr, P_ptr, QS_ptr, KS_ptr, WS_ptr, t_s, k_s, q_s, p_s,
                               v_s, scales_s, H, HV, K, V, BT, BK, BV, SCORES, OUTPUTS, CHUNK_MAJOR)
        w_scale = scales_s.index(stage).slice(2 * BT, BT).load(tokens_of)
        v_t = v_s.index(stage).permute((1, 0)).load(chunk_l).to(gl.float32)
        if SCORES:  # q k^T was issued first: it is done before k h
            minus_kh, qk = warpgroup_mma_wait(0, deps=(minus_kh, qk))
        else:
            minus_kh = warpgroup_mma_wait(0, deps=(minus_kh,))
        v_prime = gl.convert_layout((v_t + minus_kh * w_scale[None, :]).to(dtype), state_a)
        v_new = warpgroup_mma(v_prime, t_s.index(stage).permute((1, 0)), zero, use_acc=False, is_async=True)
        if SCORES:  # P into the stage's P tile (which no copy writes in this form), in the shadow of T's product
            p_s.index(stage).store(_scores(qk, scales_s.index(stage).slice(4 * BT, 2 * BT), BT).to(dtype))
            fence_async_shared()
        if OUTPUTS:  # q h behind T's product, off the state's path.
            minus_qh = warpgroup_mma(minus_h, q_s.index(stage).permute((1, 0)), zero, use_acc=False, is_async=True)
            if c > 0:  # the previous chunk's output, while T's product and q h run
                _store_output_t(O_ptr, out_s.index((c + 1) % 2), chunk_start - BT, end, i_hv, col0, HV, V, BT, BV)
        state, v_new = _state_update(state, v_new, decay, k_s, scales_s, stage, dtype, BT, OUTPUTS, update_a,
                                     tokens_of)
        if OUTPUTS:
            if SCORES:
                gl.thread_barrier()  # every warpgroup's half of P is in before either's output product reads it
            minus_q_scale = -scales_s.index(stage).slice(0, BT).load(tokens_of)
            if CHECKED:
                minus_q_scale = minus_q_scale + poison
            state = _chunk_output(state, v_new, minus_qh, minus_q_scale, p_s, out_s, stage, c, dtype, state_a)
        else:
            state = warpgroup_mma_wait(0, deps=(state,))
    async_copy.wait_group(0)
    if TMA:
        _forget_tile_barriers(ready, STAGES)
    if OUTPUTS:
        _store_last_output(O_ptr, out_s, chunks, start, end, i_hv, col0, HV, V, BT, BV)
    return state


@gluon.jit
def gdn_recurrence_hopper_rs_kernel(
    Q_ptr, K_ptr, W_ptr, U_ptr, P_ptr, QS_ptr, KS_ptr, DECAY_ptr, HINIT_ptr, HT_ptr, O_ptr, HLOC_ptr, M_ptr,
    CU, T, N, SEGS_PER_SEQ, SEG_TOKENS, FLAGS, WS_ptr,
    H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, BK: gl.constexpr,
    BV: gl.constexpr, NV: gl.constexpr, VARLEN: gl.constexpr, LOG_N: gl.constexpr, HAS_INITIAL: gl.constexpr,
    SEGMENT_STATE: gl.constexpr, STORE_FINAL: gl.constexpr, DOT_PRECISION: gl.constexpr,
    STAGES: gl.constexpr, AWAIT: gl.constexpr, FROM_V: gl.constexpr = False, LEAD: gl.constexpr = False,
    AFTER_LEAD: gl.constexpr = False, FIRST_TAKES_REST: gl.constexpr = False,
    SEGMENT_WINDOW: gl.constexpr = False, AFTER_WINDOWS: gl.constexpr = False, SCORES: gl.constexpr = False,
    TMA: gl.constexpr = False, CHUNK_SCALES: gl.constexpr = False,
):
    gl.static_assert(K == BK, "the Hopper pass takes whole K rows (K a power of two)")
    WARPS: gl.constexpr = gl.num_warps()
    gl.static_assert(STAGES >= 2, "the Hopper pass copies a chunk ahead: STAGES must be at least 2")
    gl.static_assert(BV == 16 * WARPS, "the state's rows are 64-row products, one warpgroup each")
    gl.static_assert(not (AWAIT and SEGMENT_STATE and not AFTER_LEAD),
                     "segment states wait for ready flags only after a lead beside the prepare pass")
    gl.static_assert(not (FROM_V and (AFTER_LEAD or LEAD)), "FROM_V: not the lead form")
    gl.static_assert(not (FROM_V and SEGMENT_STATE and not SEGMENT_WINDOW),
                     "FROM_V: segment states only in the windowed form")
    gl.static_assert((FROM_V and not SEGMENT_STATE) or not SCORES, "SCORES: the FROM_V output pass forms P itself")
    gl.static_assert(not CHUNK_SCALES or (FROM_V and SEGMENT_WINDOW),
                     "CHUNK_SCALES: the windowed segment states before the pairs forming P (which take them so)")
    gl.static_assert(not (LEAD and (SEGMENT_STATE or FROM_V or AFTER_LEAD)), "LEAD: an output pass")
    gl.static_assert(not SEGMENT_WINDOW or (SEGMENT_STATE and not AWAIT and not FIRST_TAKES_REST),
                     "SEGMENT_WINDOW: a segment-state pass after the prepare pass (its GROWTH in the decays)")
    gl.static_assert(not AFTER_WINDOWS or not (SEGMENT_STATE or LEAD or AFTER_LEAD or AWAIT),
                     "AFTER_WINDOWS: the output pass after a windowed segment-state pass")
    state_l: gl.constexpr = _mma_layout(BK, WARPS)  # h^T: BV x K
    chunk_l: gl.constexpr = _mma_layout(BT, WARPS)  # v_new^T, o^T: BV x BT
    # Left operands from registers: an accumulator's registers are already the operand's.
    state_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=chunk_l, k_width=2)
    update_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=state_l, k_width=2)
    v_rows: gl.constexpr = gl.SliceLayout(1, state_l)
    k_cols: gl.constexpr = gl.SliceLayout(0, state_l)
    tokens_of: gl.constexpr = gl.SliceLayout(0, chunk_l)
    dtype: gl.constexpr = W_ptr.dtype.element_ty
    OUTPUTS: gl.constexpr = not SEGMENT_STATE
    # The scales as the prepare pass stores them where the pairs form P (chunk_scales), or token-major.
    CHUNK_MAJOR: gl.constexpr = SCORES or CHUNK_SCALES
    # u's columns all lie inside V: no column mask (the transition programs mask all of theirs: u = 0).
    U_COLS_IN: gl.constexpr = V % BV == 0 and OUTPUTS
    # A launch depends on this one programmatically (the prepare pass beside it, or the segment-state pass after
    # a lead): it may start at once, and it ends after this one (ready_flags.end_after_leader).
    LEADS: gl.constexpr = LEAD or (AWAIT and not AFTER_LEAD)

    i_col = gl.program_id(0)
    i_s = gl.program_id(1).to(gl.int64)
    if LEAD:  # each sequence's first segment (a packed one's first slot: kernels._sequence_of)
        i_s = _first_slot(gl.load(CU + i_s).to(gl.int64), i_s, SEG_TOKENS) if VARLEN else i_s * SEGS_PER_SEQ
    if AFTER_LEAD and not VARLEN:  # each sequence's segments after its first (which the LEAD launch ran), here
        # numbered apart (and, for segment states, before its last, which has none to form)
        runs = SEGS_PER_SEQ - 2 if SEGMENT_STATE else SEGS_PER_SEQ - 1
        i_s = (i_s // runs) * SEGS_PER_SEQ + 1 + i_s % runs
    i_hv = gl.program_id(2).to(gl.int64)
    i_h = i_hv // (HV // H)
    # Packed sequences after a lead: the programs number only the segments after each sequence's first, and i_s
    # becomes the segment's slot (h_local's, the scan's).
    n, j, count, start, end, valid, i_s = _segment(i_s, CU, T, N, SEGS_PER_SEQ, SEG_TOKENS, VARLEN, LOG_N,
                                                   FIRST_TAKES_REST, BT, AFTER_LEAD and VARLEN)
    k_idx = gl.arange(0, BK, layout=k_cols)
    if SEGMENT_STATE:  # the transition programs start from their tile of the identity's transpose
        end, is_transition, col0, cols, u_limit = _segment_state_columns(i_col, j, count, start, end, NV, BV, V,
                                                                         v_rows)
        state = gl.where(is_transition & (cols[:, None] == k_idx[None, :]), 1.0, 0.0)
        if SEGMENT_WINDOW:
            start, truncated, poisoned = _window(DECAY_ptr, start - j * SEG_TOKENS, start, end, i_hv, HV, BT)
            # A truncated segment's transition is dropped: its programs run no chunk and store 0. Where a chunk of
            # the sequence before the window is non-finite, both its state and its transition are NaN.
            dropped = truncated & is_transition
            end = gl.where(dropped, start, end)
            nan = gl.full([BV, BK], _NAN_BITS, gl.int32, layout=state_l).to(gl.float32, bitcast=True)
            state = gl.where(truncated & (is_transition | poisoned), gl.where(poisoned, nan, 0.0), state)
    else:
        col0 = i_col * BV
        cols = col0 + gl.arange(0, BV, layout=v_rows)
        u_limit = V
        if AFTER_LEAD:  # the scan over the segments before this one (no combine pass in the lead form)
            if VARLEN:  # from the sequence's first slot; a slot that runs nothing scans nothing
                state = _scan_from_lead(HLOC_ptr, M_ptr, i_s - j, gl.where(valid, j, 1), i_hv, col0, HV, K, V, BV,
                                        DOT_PRECISION, state_l, HLOC_ptr, i_s - j)
            else:
                state = _scan_from_lead(HLOC_ptr, M_ptr, n * SEGS_PER_SEQ, j, i_hv, col0, HV, K, V, BV,
                                        DOT_PRECISION, state_l, HLOC_ptr, n * SEGS_PER_SEQ)
        elif AFTER_WINDOWS:  # no combine pass: the scan back to the last window, here
            state = _state_after_windows(HLOC_ptr, M_ptr, DECAY_ptr, HINIT_ptr, n, i_s, gl.where(valid, j, 0), start,
                                         i_hv, col0, SEG_TOKENS, HV, K, V, BT, BV, HAS_INITIAL, DOT_PRECISION,
                                         state_l)
        # The state is stored K x V: h^T's element (v, k) sits at k * V + v.
        tile = k_idx[None, :] * V + cols[:, None]
        tile_mask = (k_idx[None, :] < K) & (cols[:, None] < V) & valid
        if not (AFTER_LEAD or AFTER_WINDOWS):
            if HAS_INITIAL:  # a segment's initial state (the sequence's, for a lead)
                state = gl.load(HINIT_ptr + ((n if LEAD else i_s) * HV + i_hv) * K * V + tile, mask=tile_mask,
                                other=0.0)
            else:
                state = gl.zeros([BV, BK], gl.float32, layout=state_l)

    # AWAIT: the prepare pass runs beside this one, or ran just before it: each chunk's copies wait for its
    # flag (ready_flags); a look-ahead past the last chunk copies nothing and waits for the last. Flags are
    # numbered by chunk slot (batch row and chunk; a packed sequence's from its first slot, kernels._sequence_of),
    # from the segment's first.
    if VARLEN:  # the segment's first chunk starts a whole number of chunks into its sequence
        flags = FLAGS + _first_slot(start, n, BT) * HV + i_hv
    else:
        flags = FLAGS + (n * ((T + BT - 1) // BT) + (start - n * T) // BT) * HV + i_hv
    if FROM_V:  # T (in W_ptr's place), v (in U_ptr's), w's factor of k (WS_ptr)
        if LEADS:
            launch_dependents()
        t_s, k_s, q_s, p_s, v_s, scales_s, out_s = _from_v_stages(dtype, STAGES, BT, BK, BV, SCORES)
        state = _chunks_from_v(state, start, end, i_h, i_hv, col0, u_limit, Q_ptr, K_ptr, W_ptr, U_ptr, P_ptr, QS_ptr,
                               KS_ptr, WS_ptr, DECAY_ptr, O_ptr, t_s, k_s, q_s, p_s, v_s, scales_s, out_s, H, HV, K, V,
                               BT, BK, BV, STAGES, False, state_l, chunk_l, flags, AWAIT, SCORES, OUTPUTS, TMA,
                               CHUNK_MAJOR)
        # A non-finite v or k row reaches every row of T's product (0 x Inf), and from there the state:
        # the rare output program whose state ends non-finite runs again, checking each chunk's v and k rows
        # (a segment state ends non-finite either way). The entry state is formed again: held across the
        # first run it made the pass spill.
        if OUTPUTS:  # noqa: SIM102 (a constexpr: segment states have no state tile's offsets to reload)
            if gl.max(gl.max(gl.where(state * 0.0 == 0.0, 0, 1), axis=1), axis=0) > 0:
                gl.thread_barrier()  # every thread's reads of the last stages are done
                if AFTER_WINDOWS:
                    # The scan's buffers and the stages do not fit together: the first run's stages end here
                    # and the second run's are new ones (shared memory goes by liveness).
                    state = _state_after_windows(HLOC_ptr, M_ptr, DECAY_ptr, HINIT_ptr, n, i_s,
                                                 gl.where(valid, j, 0), start, i_hv, col0, SEG_TOKENS, HV, K, V, BT,
                                                 BV, HAS_INITIAL, DOT_PRECISION, state_l)
                    t2_s, k2_s, q2_s, p2_s, v2_s, scales2_s, out2_s = _from_v_stages(dtype, STAGES, BT, BK, BV, SCORES)
                    state = _chunks_from_v(state, start, end, i_h, i_hv, col0, u_limit, Q_ptr, K_ptr, W_ptr, U_ptr,
                                           P_ptr, QS_ptr, KS_ptr, WS_ptr, DECAY_ptr, O_ptr, t2_s, k2_s, q2_s, p2_s,
                                           v2_s, scales2_s, out2_s, H, HV, K, V, BT, BK, BV, STAGES, True, state_l,
                                           chunk_l, flags, AWAIT, SCORES, OUTPUTS, TMA, CHUNK_MAJOR)
                else:
                    if HAS_INITIAL:
                        state = gl.load(HINIT_ptr + (i_s * HV + i_hv) * K * V + tile, mask=tile_mask, other=0.0)
                    else:
                        state = gl.zeros([BV, BK], gl.float32, layout=state_l)
                    state = _chunks_from_v(state, start, end, i_h, i_hv, col0, u_limit, Q_ptr, K_ptr, W_ptr, U_ptr,
                                           P_ptr, QS_ptr, KS_ptr, WS_ptr, DECAY_ptr, O_ptr, t_s, k_s, q_s, p_s, v_s,
                                           scales_s, out_s, H, HV, K, V, BT, BK, BV, STAGES, True, state_l, chunk_l,
                                           flags, AWAIT, SCORES, OUTPUTS, TMA, CHUNK_MAJOR)
    else:
        w_s, k_s, q_s, p_s, u_s = _chunk_stages(dtype, STAGES, BT, BK, BV)
        scales_s = gl.allocate_shared_memory(gl.float32, [STAGES, 2 * BT],
                                             gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0]))

        chunks = ((end - start + BT - 1) // BT).to(gl.int32)
        last = gl.maximum(chunks - 1, 0)
        if LEADS:
            launch_dependents()
        for ahead in gl.static_range(STAGES - 1):
            if AWAIT:
                await_flag(flags + gl.minimum(ahead, last) * HV)
            _copy_chunk_t(start + ahead * BT, end, ahead, i_h, i_hv, col0, u_limit, Q_ptr, K_ptr, W_ptr, U_ptr, P_ptr,
                          QS_ptr, KS_ptr, w_s, k_s, q_s, p_s, u_s, scales_s, H, HV, K, V, BT, BK, BV, OUTPUTS,
                          U_COLS_IN)
        zero = gl.zeros([BV, BT], gl.float32, layout=chunk_l)
        # Each chunk's output waits in shared memory (two buffers, alternating) and leaves during the
        # next chunk, while its products run: held in registers across the loop it made the pass spill.
        out_s = gl.allocate_shared_memory(dtype, [2, BV, BT], gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8,
                                                                                      order=[0, 1]))
        for c in range(0, chunks):
            chunk_start, stage, decay = _chunk_in(c, start, DECAY_ptr, i_hv, HV, BT, STAGES)
            # -h: v_new = u + (-h) w accumulates onto u's tile; o's first term is then -(h q).
            minus_h = gl.convert_layout((-state).to(dtype), state_a)
            u_t = u_s.index(stage).permute((1, 0)).load(chunk_l).to(gl.float32)
            v_new = warpgroup_mma(minus_h, w_s.index(stage).permute((1, 0)), u_t, is_async=True)
            if OUTPUTS:
                minus_qh = warpgroup_mma(minus_h, q_s.index(stage).permute((1, 0)), zero, use_acc=False, is_async=True)
            # While the products run: the chunk STAGES - 1 ahead into the stage the previous chunk used.
            if AWAIT:
                await_flag(flags + gl.minimum(c + STAGES - 1, last) * HV)
            _copy_chunk_t(chunk_start + (STAGES - 1) * BT, end, (c + STAGES - 1) % STAGES, i_h, i_hv, col0, u_limit,
                          Q_ptr, K_ptr, W_ptr, U_ptr, P_ptr, QS_ptr, KS_ptr, w_s, k_s, q_s, p_s, u_s, scales_s, H, HV,
                          K, V, BT, BK, BV, OUTPUTS, U_COLS_IN)
            if OUTPUTS and c > 0:  # the previous chunk's output
                _store_output_t(O_ptr, out_s.index((c + 1) % 2), chunk_start - BT, end, i_hv, col0, HV, V, BT, BV)
            state, v_new = _state_update(state, v_new, decay, k_s, scales_s, stage, dtype, BT, OUTPUTS, update_a,
                                         tokens_of)
            if OUTPUTS:
                minus_q_scale = -scales_s.index(stage).slice(0, BT).load(tokens_of)
                state = _chunk_output(state, v_new, minus_qh, minus_q_scale, p_s, out_s, stage, c, dtype, state_a)
            else:
                state = warpgroup_mma_wait(0, deps=(state,))
        async_copy.wait_group(0)
        if OUTPUTS:
            _store_last_output(O_ptr, out_s, chunks, start, end, i_hv, col0, HV, V, BT, BV)

    if SEGMENT_STATE:  # h^T and M^T: the tile's K index runs along its columns
        _store_segment_state(HLOC_ptr, M_ptr, state, k_idx[None, :], cols[:, None], (i_s * HV + i_hv) * K, valid,
                             is_transition, K, V)
    else:
        if LEAD:  # its end state, where the output programs of the sequence's other segments start their scan
            gl.store(HLOC_ptr + (i_s * HV + i_hv) * K * V + tile, state, mask=tile_mask)
        if STORE_FINAL:  # (a lead's where a packed sequence is one segment)
            gl.store(HT_ptr + (n * HV + i_hv) * K * V + tile, state, mask=tile_mask & (j == count - 1))
    # The done counters: after the ready flags where there are flags (the prepare pass's count, the leading
    # output pass's, then the segment states'), else at FLAGS (the segment states', the lead's).
    if AWAIT:
        counters = FLAGS + _flag_slots(T, N, (T + BT - 1) // BT, BT, VARLEN) * HV
        dependents = counters + 2
    else:
        counters = FLAGS
        dependents = counters
    if LEADS:  # counted done after the flags and the end state
        count_done(counters + 1)
    if AFTER_LEAD and SEGMENT_STATE:  # the output pass after this one reads the LEAD programs' end states
        end_after_leader(dependents, counters + 1, gl.num_programs(0) * gl.num_programs(1) * gl.num_programs(2),
                         NV * N * HV)
