"""Per-chunk ready flags between two Gluon kernels that run at the same time (sm_90).

When the gated delta rule's two passes overlap (``launch._recipe``'s ``concurrent``), the
sequential pass is launched first and the prepare pass second, as its programmatic dependent
(``launch_pdl``): every sequential program says so at its start (``launch_dependents``), so the
prepare programs start at once on the SMs the sequential ones leave. The prepare pass raises one
flag per (chunk, value head) once that chunk's w, u, scores and scales are stored, and the
sequential pass waits for a chunk's flag before it copies the chunk in. Flags are numbered by chunk slot
(batch row and chunk, or a packed sequence's slots: kernels._sequence_of), and the prepare programs take
every sequence's chunk c before any sequence's chunk c + 1 (kernels._ready_slot), the order in which the
chains beside them need the chunks. The flags are zeroed before
both (a memset in the same launch sequence) and are 32-bit; two counters follow them (prepare
programs done, sequential programs done): the prepare pass, the later launch, must also be the one
that ends last (``end_after_leader``), or a kernel after the op that waits only for the launch before
it (a programmatic dependent) could read o before the sequential pass has written it.

Release and acquire at GPU scope, as CUDA's grid-wide barriers do it: every thread of the producer
has stored its part, a CTA barrier, then one thread's fence and flag store; on the consumer's side
every thread reads the flag with acquire semantics before it issues the copies that read what the
flag covers.

The sequential pass waits for a launch queued after its own: a process whose launches run one after
the other would wait for ever. The plan keeps the passes apart there (``launch.concurrent_passes_allowed``:
CUDA_LAUNCH_BLOCKING=1, a tool injected into the CUDA runtime such as Nsight Compute or
compute-sanitizer). Should a flag still not be raised after ``TIMEOUT_NS``, the waiting program traps
(a launch failure the caller sees) rather than spin for ever.

The two counters also serve cut sequences whose first segments run beside the other segments'
segment-state pass (``launch.plan_segments``' ``lead``): the first segments' output pass is launched
first and lets the segment-state pass start at once as its programmatic dependent. No flag is waited
for there; only the dependent's last program waits for every leading program (``end_after_leader``),
so that the output pass after it reads the first segments' end states. Nothing waits for a later
launch, so launches that run one after the other finish too.

Where that lead also runs beside the prepare pass (``launch.HOPPER_LEAD_BESIDE_PREPARE``), both uses
meet: the lead is launched first and waits for each chunk's flag, the prepare pass is its programmatic
dependent and raises them, and the segment-state pass, the prepare pass's programmatic dependent,
waits for its chunks' flags (raised by then) and its last program for the lead. Three counters follow
the flags there: the prepare pass's (which waits for no one), the lead's, the segment states'. Like the
passes side by side, this form waits for a later launch and is kept to where launches may overlap.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

TIMEOUT_NS = 10_000_000_000

# The waits' way out: past TIMEOUT_NS since ``start`` (%globaltimer when the wait began), trap.
_TRAP_PAST_TIMEOUT = f"""mov.u64 now, %globaltimer;
sub.u64 now, now, start;
setp.gt.u64 late, now, {TIMEOUT_NS};
@late trap;
"""

# Each thread: one acquire load; only a flag not yet raised takes the loop (sleeping between reads,
# so waiting programs leave L2 to the prepare pass), with the trap past the timeout.
_AWAIT_ASM = gl.constexpr(f"""{{
.reg .pred ready, late;
.reg .b32 flag;
.reg .u64 start, now;
ld.acquire.gpu.global.b32 flag, [$1];
setp.ne.b32 ready, flag, 0;
@ready bra PK_READY;
mov.u64 start, %globaltimer;
PK_RETRY:
nanosleep.u32 256;
ld.acquire.gpu.global.b32 flag, [$1];
setp.ne.b32 ready, flag, 0;
@ready bra PK_READY;
{_TRAP_PAST_TIMEOUT}bra PK_RETRY;
PK_READY:
mov.b32 $0, flag;
}}""")


def _by_thread_zero(body: str) -> str:
    """Inline PTX whose ``body`` runs in thread 0 only (its instructions predicated on ``first``)."""
    return ("{\n.reg .pred first;\n.reg .b32 thread;\nmov.u32 thread, %tid.x;\nsetp.eq.u32 first, thread, 0;\n"
            f"{body}mov.b32 $0, 0;\n}}")


# One thread releases the flag for the whole program, after the barrier that every thread's stores
# precede (CUDA's grid barrier does the same).
_RAISE_ASM = gl.constexpr(_by_thread_zero("@first fence.acq_rel.gpu;\n@first st.relaxed.gpu.global.b32 [$1], 1;\n"))
# A leading program's last stores are done: thread 0 counts it (release) after the barrier.
_DONE_ASM = gl.constexpr(_by_thread_zero("@first red.release.gpu.global.add.u32 [$1], 1;\n"))


@gluon.jit
def _by_thread_zero_after_barrier(asm: gl.constexpr, pointer):
    gl.thread_barrier()
    gl.inline_asm_elementwise(asm, "=r,l", [pointer + _per_thread_zeros()], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def raise_flag(flag_ptr):
    """Called by every thread once its stores of what the flag covers are issued."""
    _by_thread_zero_after_barrier(_RAISE_ASM, flag_ptr)


@gluon.jit
def _per_thread_zeros():
    layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1], threads_per_warp=[32],
                                            warps_per_cta=[gl.num_warps()], order=[0])
    return gl.zeros([32 * gl.num_warps()], gl.int32, layout=layout)


@gluon.jit
def await_flag(flag_ptr):
    """Returns once the flag is raised; every thread reads it (acquire), so each thread's later
    copies see what the producer stored before raising it."""
    gl.inline_asm_elementwise(_AWAIT_ASM, "=r,l", [flag_ptr + _per_thread_zeros()], dtype=gl.int32, is_pure=False,
                              pack=1)


@gluon.jit
def launch_dependents():
    """Lets the launch that depends on this one programmatically (the prepare pass) start now."""
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32, is_pure=False,
                              pack=1)


# The last program of a programmatic dependent (by the count of its programs done) stays until every
# program of the launch it depends on (its leader) has counted itself done: the dependent then ends after
# the leader's stores, so whatever follows the op (a kernel that waits only for the launch before it, as
# a programmatic dependent does) sees them. Thread 0 only; the trap as in _AWAIT_ASM.
_LAST_ASM = gl.constexpr(f"""{{
.reg .pred first, last, ready, late;
.reg .b32 thread, old, done;
.reg .u64 start, now;
mov.u32 thread, %tid.x;
setp.eq.u32 first, thread, 0;
@!first bra PK_END;
atom.acq_rel.gpu.global.add.u32 old, [$1], 1;
setp.eq.u32 last, old, $3;
@!last bra PK_END;
mov.u64 start, %globaltimer;
PK_WAIT:
ld.acquire.gpu.global.u32 done, [$2];
setp.ge.u32 ready, done, $4;
@ready bra PK_END;
nanosleep.u32 256;
{_TRAP_PAST_TIMEOUT}bra PK_WAIT;
PK_END:
mov.b32 $0, 0;
}}""")

@gluon.jit
def end_after_leader(done_ptr, leader_done_ptr, programs, leader_programs):
    """Called by every thread of a dependent launch's program after its last stores (the prepare pass
    after its last flag): the last program to get here waits for every leader program's ``count_done``."""
    zeros = _per_thread_zeros()
    gl.inline_asm_elementwise(_LAST_ASM, "=r,l,l,r,r", [done_ptr + zeros, leader_done_ptr + zeros,
                                                        programs - 1 + zeros, leader_programs + zeros],
                              dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def count_done(done_ptr):
    """Called by every thread of a leading launch's program (the sequential pass) after its last stores."""
    _by_thread_zero_after_barrier(_DONE_ASM, done_ptr)
