"""The register-state passes' scans over segment states and the gates' windows, in Gluon (sm_90).

``hopper_register_kernels`` runs cut sequences in two forms. In the lead form (LEAD, AFTER_LEAD) each output
program scans the segment states from its sequence's first segment's end state up to its own segment
(``_scan_from_lead``: the combine pass's scan without a launch of its own). With the windows (SEGMENT_WINDOW,
AFTER_WINDOWS; launch.SEGMENT_WINDOWS) each segment-state program takes only its segment's last chunks where the
gates have decayed the past below 2^-30 (``_window``), and each output program scans back to the last segment
whose window did (``_state_after_windows``). The scan keeps two buffers per step at one warpgroup's 64 columns
and one at the pairs' 128 (``_scan_one_buffer``).

Offsets: int64 up to each segment's first element, int32 inside it (as in kernels.py).
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

from polykernels.gated_delta_rule.hopper_kernels import _copy_layout

# Scalar arithmetic only (no layouts), so the Triton helper's constants serve Gluon kernels too.
from polykernels.gated_delta_rule.kernels import WINDOW_CHUNKS, WINDOW_LOG2_BOUND

# A quiet NaN's bits: a NaN constant would differ from itself in Triton's check of a kernel's globals.
_NAN_BITS = gl.constexpr(0x7FC00000)


@gluon.jit
def _copy_segment_state(local_s, HLOC_ptr, slot, i_hv, col0, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr,
                        BV: gl.constexpr):
    """cp.async of segment ``slot``'s K x V fp32 state (this program's BV columns; those past V read 0)."""
    layout: gl.constexpr = _copy_layout(BV, gl.num_warps(), 4)
    rows = gl.arange(0, K, layout=gl.SliceLayout(1, layout))
    cols = col0 + gl.arange(0, BV, layout=gl.SliceLayout(0, layout))
    base = HLOC_ptr + (slot * HV + i_hv) * K * V
    async_copy.async_copy_global_to_shared(local_s, base + (rows[:, None] * V + cols[None, :]),
                                           (cols < V)[None, :] & (rows >= 0)[:, None])


@gluon.jit
def _copy_step(m_s, local_s, M_ptr, HLOC_ptr, slot, i_hv, col0, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr,
               BV: gl.constexpr):
    """One step of ``_scan_from_lead``, one cp.async group: segment ``slot``'s K x K fp32 transition into
    m_s, and its state from zero into local_s."""
    layout: gl.constexpr = _copy_layout(K, gl.num_warps(), 4)
    rows = gl.arange(0, K, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, K, layout=gl.SliceLayout(0, layout))
    base = M_ptr + (slot * HV + i_hv) * K * K
    async_copy.async_copy_global_to_shared(m_s, base + (rows[:, None] * K + cols[None, :]))
    _copy_segment_state(local_s, HLOC_ptr, slot, i_hv, col0, HV, K, V, BV)
    async_copy.commit_group()


@gluon.jit
def _scan_one_buffer(HLOC_ptr, M_ptr, first, j, i_hv, col0, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr,
                     BV: gl.constexpr, state_l: gl.constexpr, START_ptr, start_slot):
    """``_scan_from_lead`` with one buffer for each step's transition and state (BV = 128: 128 KiB), each step's
    copies after the previous step's product. Under decaying gates the scan is the start state alone."""
    tf32_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                     instr_shape=[16, K, 8])
    state_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=tf32_l, k_width=1)
    m_s = gl.allocate_shared_memory(gl.float32, [K, K], gl.NVMMASharedLayout.get_default_for([K, K], gl.float32))
    local_s = gl.allocate_shared_memory(gl.float32, [K, BV],
                                        gl.SwizzledSharedLayout(vec=4, per_phase=1, max_phase=8, order=[1, 0]))
    _copy_segment_state(local_s, START_ptr, start_slot, i_hv, col0, HV, K, V, BV)
    async_copy.commit_group()
    async_copy.wait_group(0)
    fence_async_shared()
    gl.thread_barrier()
    state = local_s.permute((1, 0)).load(tf32_l)
    for s in range(0, (j - 1).to(gl.int32)):
        gl.thread_barrier()  # every thread's reads of the buffers are done before they are refilled
        _copy_step(m_s, local_s, M_ptr, HLOC_ptr, first + 1 + s, i_hv, col0, HV, K, V, BV)
        async_copy.wait_group(0)
        fence_async_shared()
        gl.thread_barrier()
        local = local_s.permute((1, 0)).load(tf32_l)
        product = warpgroup_mma(gl.convert_layout(state, state_a), m_s.permute((1, 0)), local, is_async=True)
        state = warpgroup_mma_wait(0, deps=(product,))
    return gl.convert_layout(state, state_l)


@gluon.jit
def _scan_from_lead(HLOC_ptr, M_ptr, first, j, i_hv, col0, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr,
                    BV: gl.constexpr, DOT_PRECISION: gl.constexpr, state_l: gl.constexpr, START_ptr, start_slot):
    """Segment j's initial h^T, from its sequence's first segment's end state (which the LEAD launch left
    in h_local's slot of that segment, ``first``): h_(s+1)^T = h_s^T M_s^T + h_local_s^T for s = 1 .. j - 1.
    The state it starts from is START_ptr's K x V state ``start_slot`` (h_local's ``first``, or
    ``_state_after_windows``' initial state).
    The scan the combine pass ran as a launch of its own, here each output program's up to its own
    segment: each step's transition and state copied two steps ahead (two buffers, in the stages' shared
    memory before the chunk loop uses it), each step one tf32 product (the combine's precision) with the
    state's left operand in registers. Every operand comes in through cp.async, its addresses one base
    pointer per step plus 32-bit tile offsets: a first form that loaded the end state over the state
    tile's offsets and formed 64-bit row offsets put 9 spill instructions into the chunk loop, which
    sits at 255 registers, and made the op 12.5-14.9% slower on the H200 (BENCHMARKS.md, "twenty-ninth
    set")."""
    gl.static_assert(DOT_PRECISION == "tf32", "the transitions' products are tf32 (16-bit inputs)")
    if BV > 64:  # two warpgroups' columns: two buffers of each would take 256 KiB
        return _scan_one_buffer(HLOC_ptr, M_ptr, first, j, i_hv, col0, HV, K, V, BV, state_l, START_ptr, start_slot)
    # tf32 products take 8 of K per instruction: the state's accumulator layout, another instruction shape.
    tf32_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                     instr_shape=[16, K, 8])
    state_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=tf32_l, k_width=1)
    m_s = gl.allocate_shared_memory(gl.float32, [2, K, K], gl.NVMMASharedLayout.get_default_for([K, K], gl.float32))
    local_s = gl.allocate_shared_memory(gl.float32, [2, K, BV],
                                        gl.SwizzledSharedLayout(vec=4, per_phase=1, max_phase=8, order=[1, 0]))
    steps = (j - 1).to(gl.int32)
    # Step 1's copies into the first buffers, the first segment's end state into the second state buffer.
    if steps > 0:
        _copy_step(m_s.index(0), local_s.index(0), M_ptr, HLOC_ptr, first + 1, i_hv, col0, HV, K, V, BV)
    else:
        async_copy.commit_group()  # an empty group: one per step either way
    _copy_segment_state(local_s.index(1), START_ptr, start_slot, i_hv, col0, HV, K, V, BV)
    async_copy.commit_group()
    async_copy.wait_group(0)
    fence_async_shared()
    gl.thread_barrier()
    state = local_s.index(1).permute((1, 0)).load(tf32_l)
    gl.thread_barrier()  # every thread's read of the buffer step 2's copies go to
    if steps > 1:
        _copy_step(m_s.index(1), local_s.index(1), M_ptr, HLOC_ptr, first + 2, i_hv, col0, HV, K, V, BV)
    else:
        async_copy.commit_group()
    for s in range(0, steps):
        buffer = s % 2
        async_copy.wait_group(1)  # this step's copies are in (the next step's may be on their way)
        fence_async_shared()
        gl.thread_barrier()  # every thread's part of them
        local = local_s.index(buffer).permute((1, 0)).load(tf32_l)
        # fp32 operands: tf32 (Triton's default input precision, which a precision argument cannot name in
        # Gluon 3.6: it reaches the builder as a constexpr).
        product = warpgroup_mma(gl.convert_layout(state, state_a), m_s.index(buffer).permute((1, 0)), local,
                                is_async=True)
        state = warpgroup_mma_wait(0, deps=(product,))
        gl.thread_barrier()  # every warp's product and loads are done with the buffers refilled below
        if s + 2 < steps:
            _copy_step(m_s.index(buffer), local_s.index(buffer), M_ptr, HLOC_ptr, first + 3 + s, i_hv, col0, HV, K,
                       V, BV)
        else:
            async_copy.commit_group()
    async_copy.wait_group(0)
    return gl.convert_layout(state, state_l)


@gluon.constexpr_function
def _window_layout(chunks, warps):
    # [WINDOW_CHUNKS, WINDOW_CHUNKS]: each window's chunks along a row.
    return gl.BlockedLayout(size_per_thread=[1, 1], threads_per_warp=[32 // chunks, chunks], warps_per_cta=[warps, 1],
                            order=[1, 0])


@gluon.jit
def _window_start(DECAY_ptr, start, end, i_hv, HV: gl.constexpr, BT: gl.constexpr):
    """kernels._window's search in Gluon (its docstring says why a window is sound): (first token, truncated) of the
    chunks [start, end) with SEGMENT_WINDOW."""
    layout: gl.constexpr = _window_layout(WINDOW_CHUNKS, gl.num_warps())
    chunks = ((end - start + BT - 1) // BT).to(gl.int32)
    back = gl.arange(0, WINDOW_CHUNKS, layout=gl.SliceLayout(0, layout))  # chunks from the segment's end
    inside = back < chunks
    row = (start + (chunks - 1 - back).to(gl.int64) * BT) * HV + i_hv
    decay = gl.load(DECAY_ptr + row, mask=inside, other=1.0)
    growth = gl.load(DECAY_ptr + row + HV, mask=inside, other=0.0)
    bound = gl.log2(decay) + growth  # NaN for a non-finite chunk: never within the bound
    # Each window's bound (row i: the last i + 1 chunks), a NaN in it staying NaN.
    rows = gl.arange(0, WINDOW_CHUNKS, layout=gl.SliceLayout(1, layout))
    window_bound = gl.sum(gl.where(back[None, :] <= rows[:, None], bound[None, :], 0.0), axis=1)
    last = gl.min(gl.where((rows < chunks) & (window_bound <= WINDOW_LOG2_BOUND), rows, WINDOW_CHUNKS), axis=0)
    truncated = last < WINDOW_CHUNKS
    return gl.where(truncated, start + (chunks - 1 - last).to(gl.int64) * BT, start), truncated


@gluon.jit
def _window(DECAY_ptr, bos, start, end, i_hv, HV: gl.constexpr, BT: gl.constexpr):
    """kernels._window in Gluon: (first token, truncated, poisoned) of a segment-state program's chunks with
    SEGMENT_WINDOW, but poisoned where a chunk of the sequence before the window (from its first token, ``bos``)
    is non-finite, not only one of the segment: an output pass that scans from the last window
    (``_state_after_windows``) finds every earlier NaN there."""
    window_start, truncated = _window_start(DECAY_ptr, start, end, i_hv, HV, BT)
    poisoned = truncated & (start < 0)  # False
    if truncated:  # a chunk before the window non-finite (in the window none is)
        scan: gl.constexpr = gl.BlockedLayout(size_per_thread=[4], threads_per_warp=[32],
                                              warps_per_cta=[gl.num_warps()], order=[0])
        block: gl.constexpr = 4 * 32 * gl.num_warps()
        chunks = ((window_start - bos) // BT).to(gl.int32)
        for first in range(0, chunks, block):
            c = first + gl.arange(0, block, layout=scan)
            d = gl.load(DECAY_ptr + (bos + c.to(gl.int64) * BT) * HV + i_hv, mask=c < chunks, other=1.0)
            poisoned = poisoned | (gl.max(gl.where(d * 0.0 == 0.0, 0, 1), axis=0) > 0)
    return window_start, truncated, poisoned


@gluon.jit
def _state_after_windows(HLOC_ptr, M_ptr, DECAY_ptr, HINIT_ptr, n, slot, j, start, i_hv, col0, SEG_TOKENS,
                         HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BT: gl.constexpr, BV: gl.constexpr,
                         HAS_INITIAL: gl.constexpr, DOT_PRECISION: gl.constexpr, state_l: gl.constexpr):
    """Segment j's initial h^T after a windowed segment-state pass (AFTER_WINDOWS): the combine pass's scan, here
    each output program's, from the last segment before j whose window dropped its past (its end state is its
    h_local, its transition 0). Where none did: from the sequence's initial state (HAS_INITIAL) through every
    segment's transition before j, or else from the first segment's h_local (from a zero start, its end state;
    0 for j = 0). The windows are found as the segment-state programs found them (``_window_start``, the same
    loads and sums). A non-finite chunk before the scan's start reaches the state through that h_local, NaN
    then (``_window``). The initial state does not reach a segment after a window, a non-finite one neither:
    its part there is below 2^-30 of it (the combine pass carried a NaN one on through the zero transition)."""
    bos = start - j * SEG_TOKENS
    s = j - 1
    found = j < 0  # False
    while (s >= 0) & (found == 0):
        segment_start = bos + s * SEG_TOKENS
        _, truncated = _window_start(DECAY_ptr, segment_start, segment_start + SEG_TOKENS, i_hv, HV, BT)
        found = truncated
        s = gl.where(truncated, s, s - 1)
    s = gl.maximum(s, 0)
    if HAS_INITIAL:
        # The initial state as the step before the first segment's: slot - j - 1 is never copied (no step).
        initial = found == 0
        state = _scan_from_lead(HLOC_ptr, M_ptr, gl.where(initial, slot - j - 1, slot - j + s),
                                gl.where(initial, j + 1, j - s), i_hv, col0, HV, K, V, BV, DOT_PRECISION, state_l,
                                gl.where(initial, HINIT_ptr, HLOC_ptr), gl.where(initial, n, slot - j + s))
    else:
        # j = 0 scans one step's worth for nothing (one copy) and starts from zero.
        state = _scan_from_lead(HLOC_ptr, M_ptr, slot - j + s, gl.maximum(j - s, 1), i_hv, col0, HV, K, V, BV,
                                DOT_PRECISION, state_l, HLOC_ptr, slot - j + s)
        state = gl.where(j > 0, state, 0.0)
    return state
