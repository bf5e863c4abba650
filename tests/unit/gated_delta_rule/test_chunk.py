from __future__ import annotations

import itertools
import math

import pytest
import torch
import triton
import triton.language as tl

from polykernels.gated_delta_rule import (
    chunk_gated_delta_rule,
    chunk_gated_delta_rule_torch,
    naive_recurrent_gated_delta_rule,
)
from polykernels.gated_delta_rule.kernels import _chunk_span, _flag_slots, _ready_slot
from polykernels.gated_delta_rule.launch import LeadRates, launch_chunk_gated_delta_rule
from tests.helpers import boundaries, relative_rms_error

BOUND = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 5e-3}


def make_inputs(batch, tokens, heads, value_heads, key_dim, value_dim, dtype, *, gate="random", seed=0,
                device="cpu", l2norm_outside=True, keys="random"):
    """keys: "random" (about orthogonal at these sizes), "aligned" (each head's keys share one direction,
    cosine about 0.94) or "repeated" (one key for every token of a head, as a repeated token or padding).
    gate: "random", "zero", "very_negative" or "slow" (about -0.02 per token, as many trained heads)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, tokens, heads, key_dim, generator=gen)
    k = torch.randn(batch, tokens, heads, key_dim, generator=gen)
    shared = torch.randn(batch, 1, heads, key_dim, generator=gen)
    if keys == "aligned":
        k = 0.8 * shared + 0.2 * k
    elif keys == "repeated":
        k = shared.expand_as(k).clone()
    if l2norm_outside:
        k = torch.nn.functional.normalize(k, dim=-1)
    v = torch.randn(batch, tokens, value_heads, value_dim, generator=gen)
    g = torch.nn.functional.logsigmoid(torch.randn(batch, tokens, value_heads, generator=gen))
    if gate == "zero":
        g = torch.zeros_like(g)
    elif gate == "very_negative":
        g = g - 30.0
    elif gate == "slow":
        g = torch.nn.functional.logsigmoid(torch.randn(batch, tokens, value_heads, generator=gen) + 4.0)
    beta = torch.rand(batch, tokens, value_heads, generator=gen).sigmoid()
    tensors = [t.to(dtype) for t in (q, k, v)] + [g, beta.to(dtype)]
    return [t.to(device) for t in tensors]


def check_against_naive(run, inputs, dtype, *, initial=False, cu_seqlens=None, l2norm=False, num_seqs=None):
    q, k, v, g, beta = inputs
    n = num_seqs or q.shape[0]
    h0 = torch.randn(n, v.shape[2], k.shape[3], v.shape[3], device=q.device) if initial else None
    want_o, want_s = naive_recurrent_gated_delta_rule(
        *(t.double() for t in inputs), initial_state=None if h0 is None else h0.double(),
        output_final_state=True, cu_seqlens=cu_seqlens, use_qk_l2norm_in_kernel=l2norm)
    got_o, got_s = run(q, k, v, g, beta, k.shape[-1] ** -0.5, h0, True, cu_seqlens, l2norm)
    assert got_o.dtype == v.dtype and got_o.shape == v.shape
    assert relative_rms_error(got_o, want_o) < BOUND[dtype]
    assert relative_rms_error(got_s, want_s) < BOUND[dtype]


CASES = {
    "T1": (1, 1, 2, 2, 64, 64),
    "T63": (2, 63, 1, 2, 32, 32),
    "T64": (1, 64, 2, 4, 64, 64),
    "T65": (1, 65, 2, 2, 100, 100),
    "T75-K60-V100": (2, 75, 2, 4, 60, 100),
    "T500-K100": (1, 500, 1, 2, 100, 100),
}


@pytest.mark.cpu_only
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)  # interpreter bf16 dots are broken
@pytest.mark.parametrize("initial", [False, True], ids=["h0-none", "h0-random"])
def test_triton_kernels_match_naive_recurrence(case: str, dtype: torch.dtype, initial: bool) -> None:
    check_against_naive(launch_chunk_gated_delta_rule, make_inputs(*CASES[case], dtype), dtype, initial=initial)


@pytest.mark.cpu_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_triton_kernels_match_naive_recurrence_at_the_widest_heads(dtype: torch.dtype) -> None:
    # K = V = 256, the widest the op takes: 256-row state tiles and the launch tables' K = 256 entries. (The
    # interpreter has no shared-memory limit: fp32 inputs this wide take the torch path on GPUs, guards.choose.)
    check_against_naive(launch_chunk_gated_delta_rule, make_inputs(1, 130, 1, 2, 256, 256, dtype), dtype, initial=True)


@pytest.mark.parametrize(("fp32_inputs", "key_dim", "path"), [
    (True, 256, "torch"), (True, 129, "torch"), (True, 128, "triton"), (False, 256, "triton")])
def test_fp32_inputs_wider_than_128_take_the_torch_path_on_gpus(fp32_inputs: bool, key_dim: int, path: str) -> None:
    # Their Triton tiles do not fit a program's shared memory on most GPUs (the prepare pass 256 KiB on sm_90).
    from polykernels.gated_delta_rule import guards

    choice = guards.choose("cuda", fp32_inputs, key_dim)
    assert choice.path == path
    assert (f"fp32 inputs with K = {key_dim}" in choice.reason) == (path == "torch")
    assert guards.choose("cpu", fp32_inputs, key_dim).path == "torch"


@pytest.mark.cpu_only
@pytest.mark.parametrize("gate", ["zero", "very_negative"])
def test_triton_kernels_extreme_gates(gate: str) -> None:
    dtype = torch.float32
    check_against_naive(launch_chunk_gated_delta_rule, make_inputs(1, 130, 1, 2, 32, 48, dtype, gate=gate), dtype,
                        initial=True)


@pytest.mark.cpu_only
@pytest.mark.parametrize("keys", ["aligned", "repeated"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_triton_kernels_keys_pointing_one_way(keys: str, dtype: torch.dtype) -> None:
    # Keys sharing a direction under slowly decaying gates make A's powers 1e4-1e17 within a chunk. The
    # squaring series for (I + A)^-1 summed and cancelled them: NaN outputs in bf16, 40x the output's
    # size in fp32 (kernels._unit_lower_inverse). Both heads, a chunk boundary and segments included.
    check_against_naive(launch_chunk_gated_delta_rule, make_inputs(1, 200, 1, 2, 64, 64, dtype, keys=keys, gate="slow"),
                        dtype, initial=True)

    def run(*args):
        return launch_chunk_gated_delta_rule(*args, num_segments=2)

    check_against_naive(run, make_inputs(1, 200, 1, 2, 64, 64, dtype, keys=keys, gate="slow", seed=1), dtype)


@pytest.mark.cpu_only
def test_triton_kernels_l2norm_in_kernel() -> None:
    dtype = torch.float32
    inputs = make_inputs(1, 70, 2, 4, 32, 32, dtype, l2norm_outside=False)
    check_against_naive(launch_chunk_gated_delta_rule, inputs, dtype, l2norm=True)


@pytest.mark.cpu_only
def test_triton_kernels_varlen_mixed_lengths() -> None:
    lengths = [1, 63, 0, 64, 65, 1]
    cu = boundaries(lengths)
    dtype = torch.float32
    inputs = make_inputs(1, int(cu[-1]), 1, 2, 32, 32, dtype)
    check_against_naive(launch_chunk_gated_delta_rule, inputs, dtype, initial=True, cu_seqlens=cu,
                        num_seqs=len(lengths))


@pytest.mark.cpu_only
@pytest.mark.parametrize(("batch", "tokens", "segments"), [(1, 300, 3), (2, 200, 2), (1, 130, 5)],
                         ids=["B1-T300-3seg", "B2-T200-2seg", "B1-T130-one-chunk-segments"])
def test_triton_context_parallel_segments_match_naive(batch: int, tokens: int, segments: int) -> None:
    # Segments start from a zero state and the identity, then a scan gives each its initial state.
    dtype = torch.float32
    inputs = make_inputs(batch, tokens, 1, 2, 32, 48, dtype)

    def run(*args):
        return launch_chunk_gated_delta_rule(*args, num_segments=segments)

    check_against_naive(run, inputs, dtype, initial=True)


@pytest.mark.cpu_only
@pytest.mark.parametrize("lengths", [[10, 250, 0, 40], [0, 129, 64, 0, 1]], ids=["empty-inside", "empty-at-ends"])
def test_triton_varlen_sequences_split_independently(lengths: list[int]) -> None:
    # Chunk and segment slots come from the boundaries alone (kernels._sequence_of): empty sequences
    # still get their one segment (the final state is the initial one), whole-chunk ends leave a slot free.
    cu = boundaries(lengths)
    dtype = torch.float32
    inputs = make_inputs(1, int(cu[-1]), 1, 2, 32, 32, dtype)

    def run(*args):
        return launch_chunk_gated_delta_rule(*args, num_segments=3)

    check_against_naive(run, inputs, dtype, initial=True, cu_seqlens=cu, num_seqs=len(lengths))


@pytest.mark.cpu_only
@pytest.mark.parametrize("segments", [None, 2], ids=["whole", "2seg"])
def test_triton_many_packed_sequences_int32_boundaries(segments: int | None) -> None:
    # 37 sequences (six levels of the binary search for a slot's sequence), empty ones among them,
    # int32 boundaries as FLA and vLLM pass them.
    gen = torch.Generator().manual_seed(3)
    lengths = torch.randint(0, 150, (37,), generator=gen)
    lengths[[0, 5, 36]] = 0
    lengths[[7, 8]] = 64
    cu = torch.tensor([0, *lengths.cumsum(0).tolist()], dtype=torch.int32)
    dtype = torch.float32
    inputs = make_inputs(1, int(cu[-1]), 1, 2, 16, 16, dtype)

    def run(*args):
        return launch_chunk_gated_delta_rule(*args, num_segments=segments)

    check_against_naive(run, inputs, dtype, initial=True, cu_seqlens=cu, num_seqs=len(lengths))


@triton.jit
def _prepare_order_kernel(CU, T, N, CHUNKS_PER_SEQ, OUT, VARLEN: tl.constexpr, LOG_N: tl.constexpr):
    """Each prepare program's (slot or -1 past the flags' slots, first token, rows), as the Gluon pass takes them
    beside the sequential pass."""
    i_c = _ready_slot(tl.program_id(0), tl.num_programs(0), N).to(tl.int64)  # int32, as the Gluon pass takes it
    start, length = _chunk_span(i_c, CU, T, N, CHUNKS_PER_SEQ, 64, VARLEN, LOG_N)
    in_slots = i_c < _flag_slots(T, N, CHUNKS_PER_SEQ, 64, VARLEN)
    column = tl.arange(0, 4)
    tl.store(OUT + tl.program_id(0) * 3 + column,
             tl.where(column == 0, tl.where(in_slots, i_c, -1), tl.where(column == 1, start, length)), mask=column < 3)


def _prepare_order(cu: torch.Tensor | None, batch: int, tokens: int) -> list[tuple[int, int]]:
    """(sequence, chunk in it) of each prepare program beside the sequential pass, in launch order
    (kernels._ready_slot over the recipe's grid, then kernels._chunk_span), programs of no slot left out."""
    packed = cu is not None
    sequences = len(cu) - 1 if packed else batch
    slots = -(-tokens // 64) + sequences if packed else batch * -(-tokens // 64)
    grid = sequences * -(-slots // sequences)  # launch._recipe's prepare_grid beside the sequential pass
    out = torch.zeros(grid, 3, dtype=torch.int64)
    bounds = cu if packed else torch.zeros(1, dtype=torch.int64)
    _prepare_order_kernel[(grid,)](bounds, tokens, sequences, -(-tokens // 64), out, VARLEN=packed,
                                   LOG_N=max(1, sequences.bit_length()))
    assert sorted(slot for slot in out[:, 0].tolist() if slot >= 0) == list(range(slots))  # each slot once
    starts = [0, *torch.tensor([tokens] * batch).cumsum(0).tolist()] if not packed else cu.tolist()
    taken = []
    for slot, start, length in out.tolist():
        if slot >= 0 and length > 0:
            n = next(i for i in range(sequences) if starts[i] <= start < starts[i + 1])  # empty ones hold none
            taken.append((n, (start - starts[n]) // 64))
    return taken


@pytest.mark.cpu_only
@pytest.mark.parametrize(("lengths", "batch", "tokens"), [
    (None, 3, 64 * 5 + 7), (None, 1, 640), ([1024] * 8, 1, 8192), ([100, 0, 64, 1, 300], 1, 465)],
    ids=["B3-tail-chunk", "B1", "packed-of-one-length", "packed-mixed"])
def test_prepare_programs_beside_the_chains_take_every_sequences_chunk_c_before_chunk_c_plus_one(
        lengths, batch: int, tokens: int) -> None:
    # Beside the sequential pass every chain starts at once and needs its chunks in order: the prepare programs
    # take the slots as one row per sequence, column by column (kernels._ready_slot), over a grid rounded up to
    # whole rows. Every slot once; batch rows and packed sequences of one length in the chains' order (packed
    # sequences of mixed lengths span rows: every chunk still taken once).
    cu = None if lengths is None else boundaries(lengths)
    taken = _prepare_order(cu, batch, tokens)
    sequences = batch if lengths is None else len(lengths)
    chunks = [-(-length // 64) for length in (lengths or [tokens] * batch)]
    assert sorted(taken) == [(n, c) for n in range(sequences) for c in range(chunks[n])]
    if lengths is None or len(set(lengths)) == 1:
        assert [c for _, c in taken] == sorted(c for _, c in taken)  # chunk c of all before any c + 1
        assert taken[:sequences] == [(n, 0) for n in range(sequences)]


def _nan_causality(run, device: str, positions, dtype: torch.dtype = torch.float32, dim: int = 32,
                   tokens: int = 130) -> None:
    """A non-finite input at token t: outputs before t stay finite, and t (k/v/g/beta: onwards) is NaN.
    16-bit inputs are checked after the bf16/fp16 loads, before the products round anything."""
    for name in ("q", "k", "v", "g", "beta"):
        for t in positions:
            inputs = dict(zip(["q", "k", "v", "g", "beta"],
                              make_inputs(1, tokens, 1, 1, dim, dim, dtype, device=device), strict=True))
            inputs[name][0, t, 0] = float("inf") if name == "v" else float("nan")
            o, state = run(*inputs.values())
            finite = torch.isfinite(o[0, :, 0]).all(-1).cpu()
            assert finite[:t].all(), (name, t, "an earlier token became non-finite")
            assert not finite[t], (name, t)
            if name == "q":  # q reaches only its own token's output
                assert finite[t + 1:].all() and torch.isfinite(state).all(), (name, t)
            else:
                assert not finite[t:].any() and not torch.isfinite(state).any(), (name, t)


NAN_POSITIONS = [0, 6, 63, 64, 100, 129]


# No bf16 on the CPU: the Triton interpreter keeps bf16 tiles as uint16 and multiplies their bit
# patterns. fp16 takes the kernels' 16-bit path; the GPU test below runs bf16 too.
@pytest.mark.cpu_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("segments", [None, 2], ids=["whole", "2-segments"])
def test_triton_nan_never_reaches_earlier_tokens(segments, dtype: torch.dtype) -> None:
    _nan_causality(lambda *a: launch_chunk_gated_delta_rule(*a, 0.2, None, True, None, False, segments), "cpu",
                   NAN_POSITIONS, dtype)


def test_torch_chunked_nan_never_reaches_earlier_tokens() -> None:
    _nan_causality(lambda *a: chunk_gated_delta_rule_torch(*a, 0.2, None, True), "cpu", range(130))


def test_segment_plan_fills_the_gpu_and_can_be_forced() -> None:
    from polykernels.gated_delta_rule.launch import plan_segments

    # Qwen3.5 split 8 ways: 1 sequence x 8 value heads would be 32 narrow-tile programs for 132 SMs,
    # so the sequence is cut anyway: 16 wide-tile programs, cut into as many segments as fit one
    # wave (8 x 16 = 128 programs for 132 SMs).
    thin = plan_segments(1, 65536, 8, 132)
    assert (thin.block_v, thin.segments) == (64, 8) and thin.segment_chunks * thin.segments >= 1024
    assert "8 segments" in thin.reason
    # Too short to cut (fewer than 2 x MIN_SEGMENT_CHUNKS chunks): narrow tiles, more programs.
    assert plan_segments(1, 15 * 64, 8, 132).block_v == 32
    # B8 x 32 heads: 512 wide-tile programs, no split; one sequence x 32 heads: 128 narrow ones, no split.
    assert (plan_segments(8, 8 * 4096, 32, 132).block_v, plan_segments(8, 8 * 4096, 32, 132).segments) == (64, 1)
    assert (plan_segments(1, 32768, 32, 132).block_v, plan_segments(1, 32768, 32, 132).segments) == (32, 1)
    assert plan_segments(8, 8 * 4096, 32, 132, num_segments=3).segments == 3
    # Never more segments than chunks, nor segments shorter than MIN_SEGMENT_CHUNKS unless asked.
    assert plan_segments(1, 100, 1, 132, num_segments=5).segments == 2
    assert plan_segments(1, 100, 1, 132).segments == 1


def test_segment_plan_takes_wide_tiles_for_fewer_waves_with_the_register_state_pass() -> None:
    from polykernels.gated_delta_rule.launch import plan_segments

    # 1 x 8192 x 64 value heads: 128 wide programs fill 132 SMs in one wave where 256 narrow ones
    # take two; the register-state pass runs 64 columns in about 1.3x the narrow pass's time for 32.
    assert plan_segments(1, 8192, 64, 132).block_v == 32
    wide = plan_segments(1, 8192, 64, 132, register_tiles=(64,))
    assert (wide.block_v, wide.segments) == (64, 1) and "1 wave(s) of register-state programs" in wide.reason
    assert plan_segments(8, 8 * 1024, 8, 132, register_tiles=(64,)).block_v == 64  # 8 x 1024 tokens, 8 heads
    # One sequence x 32 heads: 64 wide programs or 128 narrow ones, one wave either way: narrow.
    assert plan_segments(1, 32768, 32, 132, register_tiles=(64,)).block_v == 32
    # Thin shapes are cut as before.
    assert plan_segments(1, 65536, 8, 132, register_tiles=(64,)) == plan_segments(1, 65536, 8, 132)


def _needs_register_state_passes(gpu_device: str) -> None:
    """Skips a GPU test of the register-state passes (Gluon) on a GPU that is not sm_90, where they do not run."""
    if torch.cuda.get_device_capability(gpu_device) != (9, 0):
        pytest.skip("the register-state passes run on sm_90 only")


def _sm90_recipe(monkeypatch: pytest.MonkeyPatch, batch: int, tokens: int, heads: int, value_heads: int,
                 num_segments: int | None, packed: int | None = None, has_initial: bool = False, sms: int = 132):
    """launch._recipe for bf16 K = V = 128 inputs on an sm_90 of ``sms`` SMs, with the launch tables as they are
    (``packed``: that many sequences packed in one batch row of ``tokens``, int32 cu_seqlens)."""
    from polykernels import platform
    from polykernels.gated_delta_rule import launch
    from polykernels.platform import Platform

    monkeypatch.setattr(launch, "_triton_release", lambda: "3.6")
    monkeypatch.setattr(platform, "sm_count", lambda device: sms)
    seen = Platform(backend="cuda", arch="sm_90", device_name=None, warp_size=32, runtime_version=None)
    return launch._recipe(
        torch.Size([batch, tokens, heads, 128]), torch.Size([batch, tokens, value_heads, 128]), torch.bfloat16,
        None if packed is None else torch.int32, batch if packed is None else packed, has_initial, True, False,
        num_segments, torch.device("cpu"), seen, *launch.launch_tables(128, seen.arch))


def test_an_assignment_to_a_plan_constant_takes_effect_at_the_next_call(monkeypatch: pytest.MonkeyPatch) -> None:
    # The plan reads its least chunks from the module, not from the cached recipe's arguments: an assignment (a
    # sweep's, a test's) must drop the recipes planned before it, as it moves the launch programs' version.
    from polykernels.gated_delta_rule import launch

    before = _sm90_recipe(monkeypatch, 8, 1024, 2, 8, None)  # 16 chunks: the pairs beside the prepare pass
    assert before.plan.concurrent and before.plan.warpgroups == 2
    version = launch.configuration_version
    monkeypatch.setattr(launch, "CONCURRENT_PAIRS_MIN_CHUNKS", 17)
    assert launch.configuration_version > version
    assert not _sm90_recipe(monkeypatch, 8, 1024, 2, 8, None).plan.concurrent  # after it
    monkeypatch.undo()
    assert _sm90_recipe(monkeypatch, 8, 1024, 2, 8, None).plan.concurrent


def test_segment_plan_runs_the_passes_side_by_side_where_wide_tiles_leave_half_the_sms() -> None:
    from polykernels.gated_delta_rule.launch import CONCURRENT_MIN_CHUNKS, CONCURRENT_PAIRS_MIN_CHUNKS, plan_segments

    beside = {"register_tiles": (64,), "concurrent_tiles": {64: 1}}
    b1 = plan_segments(1, 32768, 32, 132, **beside)  # 64 programs of 64 columns, 68 SMs for the prepare pass
    assert (b1.concurrent, b1.block_v, b1.segments, b1.warpgroups) == (True, 64, 1, 1)
    assert "64 sequential programs (N x HV x V/64) on SMs of their own beside the prepare pass on the other 68" in (
        b1.reason)
    assert not plan_segments(1, 32768, 32, 132, register_tiles=(64,)).concurrent  # no concurrent form
    assert not plan_segments(1, 32768, 32, 120, **beside).concurrent  # 64 programs would take over half of 120 SMs
    assert not plan_segments(8, 8 * 4096, 32, 132, **beside).concurrent  # 512 programs: they fill the GPU
    assert not plan_segments(1, 65536, 8, 132, **beside).concurrent  # thin: cut into segments as before
    assert not plan_segments(1, 32768, 32, 132, num_segments=1, **beside).concurrent  # a forced plan is kept
    short = (CONCURRENT_MIN_CHUNKS - 1) * 64
    assert not plan_segments(1, short, 32, 132, **beside).concurrent
    assert plan_segments(1, short + 64, 32, 132, **beside).concurrent
    # Two tiles per program: 32 programs, which leave half of 64 SMs too; never past the head's V columns.
    pairs = plan_segments(1, 32768, 32, 64, register_tiles=(64,), concurrent_tiles={64: 2})
    assert (pairs.concurrent, pairs.block_v, pairs.warpgroups) == (True, 64, 2)
    assert "32 sequential programs (N x HV x V/128)" in pairs.reason
    narrow_head = plan_segments(1, 32768, 66, 132, value_dim=64, register_tiles=(64,), concurrent_tiles={64: 2})
    assert (narrow_head.concurrent, narrow_head.warpgroups) == (True, 1)
    # concurrent_pairs: two tiles per program where one would leave the prepare pass too few SMs.
    both = {**beside, "concurrent_pairs": (64,)}
    wide = plan_segments(1, 8192, 64, 132, **both)  # 128 one-tile programs; 64 pairs leave 68 SMs
    assert (wide.concurrent, wide.block_v, wide.warpgroups) == (True, 64, 2)
    assert "64 sequential programs (N x HV x V/128) on SMs of their own beside the prepare pass on the other 68" in (
        wide.reason)
    assert not plan_segments(1, 8192, 64, 132, **beside).concurrent  # no pairs beside: after the prepare pass
    assert plan_segments(1, 32768, 32, 132, **both).warpgroups == 1  # one tile per program where it leaves half
    assert not plan_segments(1, 8192, 80, 132, **both).concurrent  # 80 pairs take over half the SMs
    pairs_short = (CONCURRENT_PAIRS_MIN_CHUNKS - 1) * 64  # the pairs' own least chunks
    assert not plan_segments(1, pairs_short, 64, 132, **both).concurrent
    assert plan_segments(1, pairs_short + 64, 64, 132, **both).concurrent


def test_concurrent_recipe_launches_the_prepare_pass_as_the_waiting_sequential_pass_dependent(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from polykernels.gated_delta_rule import launch

    for variable in ("CUDA_LAUNCH_BLOCKING", *launch.INJECTED_TOOL_VARIABLES, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                     "POLYKERNELS_GDN_CONCURRENT"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(launch, "HOPPER_WINDOWED_PAIRS", {})  # B1 rows: not cut into windowed pairs here
    recipe = _sm90_recipe(monkeypatch, 1, 32768, 32, 32, None)
    assert recipe.concurrent and recipe.hopper_registers and recipe.hopper_prepare
    assert recipe.prepare_meta["CONCURRENT"] and recipe.prepare_meta["launch_pdl"]  # the dependent launch
    assert not recipe.prepare_meta["WARP_BLOCKS"]  # this GPU's DRAM not known: the inverse's levels stay whole
    assert recipe.recurrence_grid == (2, 1, 32) and recipe.recurrence_meta["AWAIT"]
    assert "launch_pdl" not in recipe.recurrence_meta
    flags = recipe.workspace.parts[launch._Scratch._fields.index("flags")]
    assert flags.shape == (512 * 32 + 2,) and flags.dtype == torch.int32  # a flag per (chunk, head), two counters
    assert recipe.sequential_programs == 64
    order = [name for _, _, name, _, _ in launch._launches(recipe, launch._launchers(), ())]
    assert order == ["recurrence", "prepare"]
    serial = _sm90_recipe(monkeypatch, 8, 4096, 32, 32, None)
    assert not serial.concurrent and not serial.prepare_meta["CONCURRENT"] and not serial.recurrence_meta["AWAIT"]
    assert "launch_pdl" not in serial.prepare_meta
    assert serial.prepare_meta["WARP_BLOCKS"] == launch.HOPPER_WARP_BLOCK_INVERSE
    assert serial.workspace.parts[launch._Scratch._fields.index("flags")].shape == (0,)
    # Nsight Compute and compute-sanitizer 2025.3 set the second and third, not CUDA_INJECTION64_PATH.
    for variable, value in (("CUDA_LAUNCH_BLOCKING", "1"), ("CUDA_INJECTION64_PATH", "/a/profiler.so"),
                            ("NV_NSIGHT_INJECTION_TRANSPORT_TYPE", "uds"),
                            ("NV_SANITIZER_INJECTION_TRANSPORT_TYPE", "uds"),
                            ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "50"), ("POLYKERNELS_GDN_CONCURRENT", "0")):
        with monkeypatch.context() as env:  # launches that run one after the other: never side by side
            env.setenv(variable, value)
            launch._recipe.cache_clear()
            assert not _sm90_recipe(monkeypatch, 1, 32768, 32, 32, None).concurrent
    launch._recipe.cache_clear()
    monkeypatch.setattr(launch, "HOPPER_CONCURRENT", {128: (2, 2)})  # two tiles per program, two stages
    paired = _sm90_recipe(monkeypatch, 1, 32768, 32, 32, None)
    assert paired.concurrent and paired.recurrence_grid == (1, 1, 32) and paired.sequential_programs == 32
    assert (paired.recurrence_meta["BV"], paired.recurrence_meta["STAGES"], paired.recurrence_meta["num_warps"]) == (
        128, 2, 8)
    monkeypatch.setattr(launch, "HOPPER_CONCURRENT", {128: (1, 3)})
    # One tile per program would leave too few SMs: the pairs beside the prepare pass, FlashInfer's order of the
    # chain (the prepare pass stores T), launch.HOPPER_CONCURRENT_PAIRS's stages.
    wide = _sm90_recipe(monkeypatch, 1, 8192, 16, 64, None)
    assert wide.concurrent and wide.from_v and wide.recurrence_grid == (1, 1, 64) and wide.sequential_programs == 64
    assert (wide.recurrence_meta["BV"], wide.recurrence_meta["STAGES"], wide.recurrence_meta["num_warps"]) == (
        128, launch.HOPPER_CONCURRENT_PAIRS[128], 8)
    assert wide.recurrence_meta["AWAIT"] and wide.recurrence_meta["FROM_V"]
    assert wide.prepare_meta["CONCURRENT"] and wide.prepare_meta["STORE_T"] and wide.prepare_meta["launch_pdl"]
    monkeypatch.setattr(launch, "HOPPER_CONCURRENT_PAIRS", {})  # an empty table: the pairs after the prepare pass
    serial = _sm90_recipe(monkeypatch, 1, 8192, 16, 64, None)
    assert not serial.concurrent and serial.recurrence_meta["BV"] == 64
    monkeypatch.setattr(launch, "HOPPER_CONCURRENT_PAIRS", {128: 2})
    monkeypatch.setattr(launch, "HOPPER_CONCURRENT", {})  # an empty table turns it off, the pairs beside too
    off = _sm90_recipe(monkeypatch, 1, 32768, 32, 32, None)
    assert not off.concurrent and off.recurrence_meta["BV"] == 32
    assert not _sm90_recipe(monkeypatch, 1, 8192, 16, 64, None).concurrent


def test_packed_sequences_run_beside_the_prepare_pass_only_where_the_table_says(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # launch.HOPPER_CONCURRENT_PACKED: packed sequences beside the prepare pass by the batch rows' rules, their
    # average length against the least chunks; the prepare grid rounds the slots up to one row per sequence
    # (kernels._ready_slot) and the flags cover the slots. Never the lead form beside the prepare pass.
    from polykernels.gated_delta_rule import launch

    for variable in ("CUDA_LAUNCH_BLOCKING", *launch.INJECTED_TOOL_VARIABLES, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                     "POLYKERNELS_GDN_CONCURRENT"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(launch, "CONCURRENT_PAIRS_MIN_CHUNKS", 16)
    assert not _sm90_recipe(monkeypatch, 1, 8192, 2, 8, None, packed=8).concurrent  # the table's default: off
    monkeypatch.setattr(launch, "HOPPER_CONCURRENT_PACKED", True)
    eight = _sm90_recipe(monkeypatch, 1, 8192, 2, 8, None, packed=8)
    assert eight.concurrent and eight.from_v and eight.plan.warpgroups == 2 and eight.recurrence_grid == (1, 8, 8)
    assert eight.recurrence_meta["AWAIT"] and eight.recurrence_meta["VARLEN"] and eight.prepare_meta["CONCURRENT"]
    assert eight.prepare_grid == (136, 8)  # 128 + 8 slots, already whole rows of 17
    three = _sm90_recipe(monkeypatch, 1, 3 * 2048, 2, 16, None, packed=3)  # 96 + 3 slots: 3 rows of 33
    assert three.concurrent and three.prepare_grid == (99, 16)
    five = _sm90_recipe(monkeypatch, 1, 5 * 1024 + 64, 2, 8, None, packed=5)  # 81 + 5 slots: 5 rows of 18
    assert five.concurrent and five.prepare_grid == (90, 8)
    flags = five.workspace.parts[launch._Scratch._fields.index("flags")]
    assert flags.shape == (86 * 8 + 2,)  # a flag per slot and head, then the two counters
    assert five.sequential_programs == 5 * 8
    monkeypatch.setattr(launch, "CONCURRENT_PAIRS_MIN_CHUNKS", 17)  # 16 chunks on average: after the prepare pass
    assert not _sm90_recipe(monkeypatch, 1, 8192, 2, 8, None, packed=8).concurrent
    # Cut packed sequences keep the lead form after the prepare pass (its rates are for batch rows).
    cut = _sm90_recipe(monkeypatch, 1, 8192, 2, 8, None, packed=2)
    assert not cut.concurrent and not cut.beside_prepare and "beside the prepare pass" not in cut.plan.reason
    launch._recipe.cache_clear()


def test_recipes_planned_for_other_devices_or_environments_never_share_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    # The launchers keep each compiled kernel by the recipe's spec. Recipes of the same arguments whose plans read
    # another SM count, DRAM bandwidth or environment launch other kernels, so their specs must differ too: the
    # >2^31-element check, planning for 100 SMs after a call planned for the GPU's own count, ran the one-tile
    # kernel on the pairs' arguments (an illegal address) while the spec left the SM count out.
    from polykernels import platform
    from polykernels.gated_delta_rule import launch

    for variable in ("CUDA_LAUNCH_BLOCKING", *launch.INJECTED_TOOL_VARIABLES, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(launch, "HOPPER_WINDOWED_PAIRS", {})  # B1 rows: not cut into windowed pairs here
    recipes = []
    for sms, dram_gbps, overlap in ((132, 3352.0, "1"), (100, 3352.0, "1"), (132, 4800.0, "1"), (132, 3352.0, "0")):
        monkeypatch.setenv("POLYKERNELS_GDN_CONCURRENT", overlap)
        monkeypatch.setattr(platform, "dram_gbps", lambda device, gbps=dram_gbps: gbps)
        launch._recipe.cache_clear()
        recipes.append(_sm90_recipe(monkeypatch, 1, 32768, 32, 32, None, sms=sms))
    launch._recipe.cache_clear()
    kernels = {(str(recipe.prepare_meta), str(recipe.recurrence_meta)) for recipe in recipes}
    assert len(kernels) == len(recipes)  # one-tile beside, pairs beside, per-warp inverse beside, one after the other
    assert len({recipe.spec for recipe in recipes}) == len(recipes)


@pytest.mark.parametrize(("heads", "dram_gbps", "per_warp"), [
    (32, 4800.0, True), (32, 3352.0, False), (32, None, False), (16, 3352.0, True), (16, None, True)],
    ids=["h200", "h100", "unknown", "h100-gva", "unknown-gva"])
def test_concurrent_prepare_takes_the_per_warp_inverse_where_dram_or_heads_allow(
        monkeypatch: pytest.MonkeyPatch, heads: int, dram_gbps: float | None, per_warp: bool) -> None:
    # Beside the sequential pass the per-warp levels paid on an H200 (4.8 TB/s) and cost on an H100 (3.35)
    # at 32/32; with half the qk heads they paid on both (launch.HOPPER_CONCURRENT_WARP_BLOCKS_GBPS).
    from polykernels import platform
    from polykernels.gated_delta_rule import launch

    for variable in ("CUDA_LAUNCH_BLOCKING", *launch.INJECTED_TOOL_VARIABLES, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                     "POLYKERNELS_GDN_CONCURRENT"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(platform, "dram_gbps", lambda device: dram_gbps)
    monkeypatch.setattr(launch, "HOPPER_WINDOWED_PAIRS", {})  # B1 rows: not cut into windowed pairs here
    recipe = _sm90_recipe(monkeypatch, 1, 32768, heads, 32, None)
    assert recipe.concurrent and recipe.prepare_meta["CONCURRENT"]
    assert recipe.prepare_meta["WARP_BLOCKS"] is per_warp
    monkeypatch.setattr(launch, "HOPPER_WARP_BLOCK_INVERSE", False)  # the inverse's switch holds beside too
    assert not _sm90_recipe(monkeypatch, 1, 32768, heads, 32, None).prepare_meta["WARP_BLOCKS"]
    monkeypatch.setattr(launch, "HOPPER_WARP_BLOCK_INVERSE", True)
    monkeypatch.setattr(launch, "HOPPER_CONCURRENT_WARP_BLOCKS_GBPS", math.inf)  # a new table, a new recipe
    assert _sm90_recipe(monkeypatch, 1, 32768, heads, 32, None).prepare_meta["WARP_BLOCKS"] is (heads < 32)
    launch._recipe.cache_clear()


@pytest.mark.parametrize(("value_heads", "num_segments", "registers"), [
    (64, None, True), (64, 2, True), (64, 8, False), (32, None, False)],
    ids=["uncut-wide", "cut-64-chunks", "cut-16-chunks", "narrow"])
def test_register_state_pass_runs_wide_tiles_of_long_segments_on_sm90(
        monkeypatch: pytest.MonkeyPatch, value_heads: int, num_segments: int | None, registers: bool) -> None:
    # The recipe picks hopper_register_kernels' pass at the wide tile on sm_90 for uncut sequences and
    # for both passes over segments of at least HOPPER_REGISTER_CUT's chunks (1 x 8192: 128 chunks, in
    # two segments of 64 or eight of 16); shorter segments and narrow tiles keep hopper_kernels'.
    from polykernels.gated_delta_rule import launch

    assert launch.HOPPER_REGISTER_CUT[64] == 64
    monkeypatch.setattr(launch, "HOPPER_CONCURRENT", {})  # 1 x 8192 x 32 heads would run side by side
    monkeypatch.setattr(launch, "HOPPER_LEAD_SEGMENT", {})  # the lead form runs the register-state pass throughout
    monkeypatch.setattr(launch, "SEGMENT_WINDOWS", False)  # and so do the windows
    recipe = _sm90_recipe(monkeypatch, 1, 8192, value_heads // 4, value_heads, num_segments)
    assert recipe.hopper and recipe.hopper_registers is registers
    assert recipe.recurrence_meta["BV"] == (64 if registers or num_segments else 32)
    assert recipe.recurrence_meta["STAGES"] == (launch.HOPPER_REGISTER_STAGES[64] if registers
                                                else launch.HOPPER_STAGES[recipe.recurrence_meta["BV"]])
    assert recipe.recurrence_meta["num_warps"] == 4
    if num_segments:
        assert recipe.segment_registers is registers
        assert recipe.segment_state_meta["STAGES"] == (launch.HOPPER_REGISTER_SEGMENT_STAGES[64] if registers
                                                       else launch.HOPPER_STAGES[64])
        assert recipe.segment_state_meta.get("AWAIT", False) is False
        sequential = [launcher for launcher, _, name, _, _ in launch._launches(recipe, launch._launchers(), ())
                      if name in ("segment_state", "recurrence")]
        register_launcher = launch._hopper_register_launcher()
        assert [launcher is register_launcher for launcher in sequential] == [registers, registers]
        with monkeypatch.context() as tables:  # the register-state passes need no other pass
            tables.setattr(launch, "HOPPER_STAGES", {})
            alone = _sm90_recipe(tables, 1, 8192, value_heads // 4, value_heads, num_segments)
            assert (alone.hopper_registers, alone.segment_registers) == (registers, registers)
        monkeypatch.setattr(launch, "HOPPER_REGISTER_SEGMENT_STAGES", {})  # the segment-state pass off
        output_only = _sm90_recipe(monkeypatch, 1, 8192, value_heads // 4, value_heads, num_segments)
        assert (output_only.hopper_registers, output_only.segment_registers) == (registers, False)
        assert output_only.segment_state_meta["STAGES"] == launch.HOPPER_STAGES[64]


def test_segment_plan_takes_one_segment_more_where_the_first_runs_beside_the_segment_states() -> None:
    # A cut sequence's first segment needs no segment state: its output pass runs beside the others'
    # segment-state pass, and the output pass after them holds one segment fewer per wave.
    from polykernels.gated_delta_rule.launch import plan_segments

    lead = {"register_tiles": (64,), "lead_tiles": {64: 32}}
    thin = plan_segments(1, 32768, 8, 132, **lead)  # 16 programs: 8 segments + 1 of 57 chunks, not 8 of 64
    assert (thin.segments, thin.segment_chunks, thin.block_v, thin.lead) == (9, 57, 64, True)
    assert "9 segments" in thin.reason and "the first segment's output pass beside" in thin.reason
    assert (plan_segments(1, 32768, 16, 132, **lead).segments, plan_segments(1, 32768, 16, 132).segments) == (5, 4)
    # Segments shorter than the table's least chunks keep the plan without the lead form.
    short = plan_segments(1, 4096, 8, 132, **lead)
    assert (short.segments, short.lead) == (plan_segments(1, 4096, 8, 132).segments, False)
    # The form only where it buys a segment: at 1x2048 the count stays 4 (segments of 8 chunks), without it.
    from_eight = {"register_tiles": (64,), "lead_tiles": {64: 8}}
    assert [plan_segments(1, tokens, 8, 132, **from_eight).lead for tokens in (2048, 4096)] == [False, True]
    # The count is what runs: 1x4096 asks for a ninth segment, and 64 chunks make eight of 8.
    at_4096 = plan_segments(1, 4096, 8, 132, **from_eight)
    assert (at_4096.segments, at_4096.segment_chunks) == (8, 8) and "8 segments of 8 chunks run" in at_4096.reason
    # A forced plan keeps its count, with the lead form from three segments on; uncut sequences never.
    assert [plan_segments(1, 32768, 8, 132, num_segments=n, **lead).lead for n in (2, 3)] == [False, True]
    assert not plan_segments(1, 8192, 64, 132, **lead).lead
    assert not plan_segments(1, 32768, 8, 132, register_tiles=(64,), lead_tiles={32: 1}).lead  # not at this tile


def test_lead_recipe_launches_the_segment_states_as_the_first_segments_dependent(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from polykernels.gated_delta_rule import launch

    monkeypatch.setattr(launch, "SEGMENT_WINDOWS", False)  # the lead form's plan

    monkeypatch.setattr(launch, "HOPPER_LEAD_BESIDE_PREPARE", {})  # the lead after the prepare pass
    recipe = _sm90_recipe(monkeypatch, 1, 32768, 2, 8, None)  # 9 segments of 57 chunks
    assert recipe.lead and recipe.segments_per_seq == 9 and recipe.hopper_registers and recipe.segment_registers
    order = [name for _, _, name, _, _ in launch._launches(recipe, launch._launchers(), ())]
    # No combine pass: each output program scans the segment states up to its own segment.
    assert order == ["prepare", "lead", "segment_state", "recurrence"]
    assert recipe.lead_grid == (2, 1, 8) and recipe.lead_meta["LEAD"] and not recipe.lead_meta["STORE_FINAL"]
    assert recipe.segment_state_grid == (4, 7, 8)  # value and transition tiles of segments 2 to 8
    assert recipe.segment_state_meta["AFTER_LEAD"] and recipe.segment_state_meta["launch_pdl"]
    assert recipe.recurrence_grid == (2, 8, 8) and recipe.recurrence_meta["AFTER_LEAD"]
    parts = recipe.workspace.parts
    assert parts[launch._Scratch._fields.index("flags")].shape == (2,)  # the two done counters
    # The segment states (the lead's end state in the first segment's slot) and transitions; no initial states.
    assert parts[launch._Scratch._fields.index("h_local")].shape == (9, 8, 128, 128)
    assert parts[launch._Scratch._fields.index("h_init")].shape == (0, 8, 128, 128)
    # Below HOPPER_REGISTER_CUT's 64 chunks: all three sequential passes are the register-state pass's.
    assert recipe.segment_chunks < launch.HOPPER_REGISTER_CUT[64]
    monkeypatch.setattr(launch, "HOPPER_LEAD_SEGMENT", {})  # an empty table turns it off
    off = _sm90_recipe(monkeypatch, 1, 32768, 2, 8, None)
    assert not off.lead and off.segments_per_seq == 8 and off.recurrence_grid == (2, 8, 8)
    assert not off.recurrence_meta["AFTER_LEAD"]
    assert [name for _, _, name, _, _ in launch._launches(off, launch._launchers(), ())] == [
        "prepare", "segment_state", "combine", "recurrence"]


def test_segment_plan_takes_the_lead_for_packed_sequences_where_its_bound_gives_shorter_segments() -> None:
    # Packed sequences (varlen 6144+2048, 2/8 heads): the plan knows only their number and total. Without the
    # lead form, 4 segments of the average 64 chunks (16 each); with it, the segments after each sequence's
    # first must fit one wave whatever the lengths: 15 chunks (at most 8 x 16 programs for 132 SMs).
    from polykernels.gated_delta_rule.launch import CHUNK, _packed_lead_chunks, plan_segments

    lead = {"register_tiles": (64,), "lead_tiles": {64: 8}}
    plain = plan_segments(2, 8192, 8, 132, register_tiles=(64,))
    packed = plan_segments(2, 8192, 8, 132, packed=True, **lead)
    assert (plain.segment_chunks, plain.lead) == (16, False)
    assert (packed.segment_chunks, packed.lead, packed.segments) == (15, True, 5)
    assert "packed sequences in segments of 15 chunks" in packed.reason
    # Batch rows of the same average length take the average's segments (13 chunks: 4 + 1 segments of 64).
    assert plan_segments(2, 8192, 8, 132, **lead).segment_chunks == 13
    # The bound holds for any split of the tokens, empty and one-token sequences among them.
    for total, seqs, heads in ((8192, 2, 8), (8192, 3, 8), (16384, 2, 8), (32768, 4, 4), (20000, 2, 16)):
        per_segment = 2 * heads  # HV x V/64 programs per segment
        chunks = _packed_lead_chunks(seqs, total, seqs * per_segment, 132, 8)
        tokens = chunks * CHUNK
        for cuts in itertools.combinations(sorted({0, 1, 63, 64, 65, tokens - 1, tokens, tokens + 1, total // 3,
                                                   total // 2, total - 1, total}), seqs - 1):
            bounds = [0, *cuts, total]
            lengths = [b - a for a, b in itertools.pairwise(bounds) if b >= a]
            if len(lengths) != seqs:
                continue
            after_first = sum(max(-(-length // tokens), 1) - 1 for length in lengths)
            assert after_first * per_segment <= 132, (total, seqs, heads, lengths, chunks)
        # ... and the next shorter segments do not (the bound is the least that holds).
        if chunks > 8:
            shorter = (chunks - 1) * CHUNK
            assert (total - seqs) // shorter * per_segment > 132
    # Not where the bound is no shorter than the plan without it (2 x 2048: 8 chunks either way), nor uncut.
    assert not plan_segments(2, 4096, 8, 132, packed=True, **lead).lead
    assert not plan_segments(8, 8192, 8, 132, packed=True, **lead).lead
    # A forced count keeps the average's segments, the lead form from three on.
    forced = plan_segments(2, 8192, 8, 132, num_segments=4, packed=True, **lead)
    assert (forced.segment_chunks, forced.lead) == (16, True)


def test_packed_lead_recipe_numbers_the_segments_after_each_first(monkeypatch: pytest.MonkeyPatch) -> None:
    # Packed sequences number their segments by slot (kernels._sequence_of): the lead takes each sequence's
    # first slot; the segment-state and output passes number only the segments after each sequence's first,
    # at most total // segment tokens of them whatever the lengths (6144+2048 in segments of 960 tokens: 8).
    from polykernels.gated_delta_rule import launch

    monkeypatch.setattr(launch, "SEGMENT_WINDOWS", False)  # the lead form's plan
    recipe = _sm90_recipe(monkeypatch, 1, 8192, 2, 8, None, packed=2)
    assert recipe.lead and not recipe.beside_prepare and recipe.segment_chunks == 15
    order = [(name, meta.get("launch_pdl", False)) for _, _, name, meta, _ in
             launch._launches(recipe, launch._launchers(), ())]
    assert order == [("prepare", False), ("lead", False), ("segment_state", True), ("recurrence", False)]
    slots = -(-8192 // (15 * 64)) + 2  # at most ceil(T / segment tokens) + N (kernels._sequence_of)
    assert recipe.max_segments == slots and recipe.segments_per_seq == 1
    assert recipe.lead_grid == (2, 2, 8) and recipe.segment_state_grid == (4, 8, 8)
    assert recipe.recurrence_grid == (2, 8, 8)  # 128 programs: one wave
    # A packed sequence may be one segment: its lead stores its final state.
    assert recipe.lead_meta["VARLEN"] and recipe.lead_meta["STORE_FINAL"] and recipe.lead_meta["LEAD"]
    assert recipe.segment_state_meta["AFTER_LEAD"] and recipe.recurrence_meta["AFTER_LEAD"]
    assert not any(meta.get("AWAIT") or meta.get("FIRST_TAKES_REST")
                   for meta in (recipe.lead_meta, recipe.segment_state_meta, recipe.recurrence_meta))
    parts = recipe.workspace.parts
    assert parts[launch._Scratch._fields.index("flags")].shape == (2,)  # the two done counters
    assert parts[launch._Scratch._fields.index("h_local")].shape == (slots, 8, 128, 128)
    assert parts[launch._Scratch._fields.index("h_init")].shape == (0, 8, 128, 128)
    monkeypatch.setattr(launch, "HOPPER_LEAD_SEGMENT", {})  # without the form: 16-chunk segments and a combine
    off = _sm90_recipe(monkeypatch, 1, 8192, 2, 8, None, packed=2)
    assert not off.lead and off.segment_chunks == 16
    assert [name for _, _, name, _, _ in launch._launches(off, launch._launchers(), ())] == [
        "prepare", "segment_state", "combine", "recurrence"]


def test_lead_beside_the_prepare_pass_is_launched_first_with_the_longer_first_segment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Where launches may overlap, the lead is launched first and waits for the ready flags, the prepare pass is
    # its programmatic dependent and the segment-state pass the prepare pass's; the segments after the first
    # are shorter, the first takes the rest (the plan's estimate from HOPPER_LEAD_BESIDE_PREPARE's rates).
    from polykernels.gated_delta_rule import launch

    monkeypatch.setattr(launch, "SEGMENT_WINDOWS", False)  # the lead form's plan

    recipe = _sm90_recipe(monkeypatch, 1, 32768, 4, 16, None)
    assert recipe.lead and recipe.beside_prepare and recipe.segments_per_seq == 5
    assert recipe.segment_chunks == 67  # the first segment: 512 - 4 x 67 = 244 chunks
    order = [(name, meta.get("launch_pdl", False)) for _, _, name, meta, _ in
             launch._launches(recipe, launch._launchers(), ())]
    assert order == [("lead", False), ("prepare", True), ("segment_state", True), ("recurrence", False)]
    assert recipe.lead_meta["AWAIT"] and recipe.segment_state_meta["AWAIT"] and not recipe.recurrence_meta["AWAIT"]
    assert all(meta["FIRST_TAKES_REST"] for meta in (recipe.lead_meta, recipe.segment_state_meta,
                                                     recipe.recurrence_meta))
    # The prepare pass raises the flags and waits for no sequential program: the segment states start after it.
    assert recipe.prepare_meta["CONCURRENT"] and recipe.sequential_programs == 0
    parts = recipe.workspace.parts
    assert parts[launch._Scratch._fields.index("flags")].shape == (512 * 16 + 3,)  # flags, then three counters
    assert recipe.segment_state_grid == (4, 3, 16) and recipe.recurrence_grid == (2, 4, 16)
    # Off where launches run one after the other (the lead would wait for a launch queued behind it).
    monkeypatch.setenv("POLYKERNELS_GDN_CONCURRENT", "0")
    launch._recipe.cache_clear()
    serial = _sm90_recipe(monkeypatch, 1, 32768, 4, 16, None)
    assert serial.lead and not serial.beside_prepare and serial.segment_chunks == 103
    assert not serial.recurrence_meta["FIRST_TAKES_REST"] and not serial.prepare_meta["CONCURRENT"]
    launch._recipe.cache_clear()


def test_segment_plan_takes_the_lead_beside_the_prepare_pass_where_its_rates_estimate_it_shorter() -> None:
    from polykernels.gated_delta_rule.launch import HOPPER_LEAD_BESIDE_PREPARE, plan_segments

    rates = HOPPER_LEAD_BESIDE_PREPARE[128]
    beside = {"register_tiles": (64,), "lead_tiles": {64: 8}, "lead_rates": rates}
    # 2/8 heads: the lead's 16 SMs cost the prepare pass about what its head start gives back (not taken).
    thin = plan_segments(1, 32768, 8, 132, **beside)
    assert (thin.segments, thin.segment_chunks, thin.lead, thin.beside_prepare, thin.first_chunks) == (9, 57, True,
                                                                                                      False, 0)
    # 4/16: the lead's 32 programs run 244 of the 512 chunks, most of them beside the prepare pass; 4 x 67 follow.
    wide = plan_segments(1, 32768, 16, 132, **beside)
    assert (wide.segments, wide.segment_chunks, wide.first_chunks, wide.beside_prepare) == (5, 67, 244, True)
    assert wide.first_chunks + 4 * wide.segment_chunks == 512 and "the first segment (244 chunks)" in wide.reason
    # A lead as fast beside the prepare pass as after it, on a prepare pass that does not slow: taken at 2/8 too,
    # the first segment the longer one.
    quick = plan_segments(1, 32768, 8, 132, **{**beside, "lead_rates": rates._replace(
        prepare_beside=rates.prepare, lead_beside=rates.lead)})
    assert quick.beside_prepare and quick.first_chunks > quick.segment_chunks and quick.segments == 9
    # Short sequences: the head start is too short to pay.
    assert not plan_segments(1, 4096, 8, 132, **beside).beside_prepare


def test_register_state_pass_pairs_tiles_where_the_pairs_fill_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    # B8 T4096 32/32: 256 programs of two 64-column tiles (two warpgroups, 8 warps) still fill 132 SMs.
    from polykernels.gated_delta_rule import launch

    recipe = _sm90_recipe(monkeypatch, 8, 4096, 32, 32, None)
    assert recipe.hopper_registers and recipe.recurrence_grid == (1, 8, 32)
    assert (recipe.recurrence_meta["BV"], recipe.recurrence_meta["num_warps"]) == (128, 8)
    assert recipe.recurrence_meta["STAGES"] == launch.HOPPER_REGISTER_PAIRS[64]
    # HOPPER_PAIRS_FROM_V: the prepare pass stores T, the pairs form v_new from v
    assert recipe.recurrence_meta["FROM_V"] and recipe.prepare_meta["STORE_T"]
    # HOPPER_PAIRS_SCORES: after the prepare pass the pairs form P too, from two fp32 exponents per token in its place,
    # there among the chunk's scales (hopper_prepare_kernels.chunk_scales: eight fp32 a token and head, k's factor in
    # w among them), so u's part and the token-major q and k scales are empty
    assert recipe.recurrence_meta["SCORES"] and recipe.prepare_meta["SCORE_FACTORS"]
    assert recipe.workspace.parts[2].shape == (8 * 4096, 32, 8) and recipe.workspace.parts[2].dtype == torch.float32
    parts = dict(zip(launch._Scratch._fields, recipe.workspace.parts, strict=True))
    assert all(parts[name].shape == (0, 32) for name in ("u", "q_scale", "k_scale"))
    assert parts["decay"].shape == (8 * 4096, 32)
    # HOPPER_PAIRS_TMA: their tiles by TMA, the descriptors in the workspace (TMA_SCRATCH_BYTES a program)
    assert recipe.tma and recipe.recurrence_meta["TMA"]
    assert recipe.workspace.parts[-1].shape == (8 * 32 * launch.TMA_SCRATCH_BYTES,)
    with monkeypatch.context() as tables:
        tables.setattr(launch, "HOPPER_PAIRS_TMA", False)
        copied = _sm90_recipe(monkeypatch, 8, 4096, 32, 32, None)
        assert not copied.tma and not copied.recurrence_meta["TMA"] and copied.workspace.parts[-1].shape == (0,)
    beside = _sm90_recipe(monkeypatch, 1, 8192, 16, 64, None)  # the pairs beside the prepare pass: P stored, as before
    assert beside.concurrent and beside.recurrence_meta["FROM_V"] and not beside.recurrence_meta.get("SCORES")
    assert not beside.tma and beside.workspace.parts[-1].shape == (0,)  # and their tiles by cp.async
    assert not beside.prepare_meta.get("SCORE_FACTORS") and beside.workspace.parts[2].shape == (8192, 64, 64)
    # (u's part holds k's factor in w, fp32, beside the token-major q and k scales)
    parts = dict(zip(launch._Scratch._fields, beside.workspace.parts, strict=True))
    assert all(parts[name].shape == (8192, 64) for name in ("u", "q_scale", "k_scale"))
    assert parts["u"].dtype == torch.float32
    # HOPPER_PREPARE_SCORES: the prepare pass storing the score exponents takes its own register cap, the others not
    assert recipe.prepare_meta["maxnreg"] == launch.HOPPER_PREPARE_SCORES[128] != launch.HOPPER_PREPARE[128]
    assert beside.prepare_meta["maxnreg"] == launch.HOPPER_PREPARE[128]
    with monkeypatch.context() as tables:
        tables.setattr(launch, "HOPPER_PREPARE_SCORES", {})
        assert _sm90_recipe(monkeypatch, 8, 4096, 32, 32, None).prepare_meta["maxnreg"] == launch.HOPPER_PREPARE[128]
    monkeypatch.setattr(launch, "HOPPER_PAIRS_SCORES", False)
    recipe = _sm90_recipe(monkeypatch, 8, 4096, 32, 32, None)
    assert recipe.recurrence_meta["FROM_V"] and not recipe.recurrence_meta.get("SCORES")
    assert not recipe.prepare_meta.get("SCORE_FACTORS") and recipe.workspace.parts[2].shape == (8 * 4096, 32, 64)
    monkeypatch.setattr(launch, "HOPPER_PAIRS_FROM_V", False)
    recipe = _sm90_recipe(monkeypatch, 8, 4096, 32, 32, None)
    assert not recipe.recurrence_meta["FROM_V"] and not recipe.prepare_meta["STORE_T"]
    alone = _sm90_recipe(monkeypatch, 1, 8192, 16, 64, None)  # one tile per program: never
    assert alone.recurrence_meta["num_warps"] == 4 and not alone.recurrence_meta["FROM_V"]


def test_segment_plan_pairs_register_tiles_only_where_the_pairs_fill_the_gpu() -> None:
    from polykernels.gated_delta_rule.launch import plan_segments

    both = {"register_tiles": (64,), "register_pairs": (64,)}
    paired = plan_segments(8, 8 * 4096, 32, 132, **both)
    assert (paired.block_v, paired.segments, paired.warpgroups) == (64, 1, 2)
    assert "two 64-column tiles per register-state program: 256 programs" in paired.reason
    assert plan_segments(8, 8 * 4096, 32, 132, register_tiles=(64,)).warpgroups == 1  # no pair form
    assert plan_segments(1, 8192, 64, 132, **both).warpgroups == 1  # 64 pairs for 132 SMs
    assert plan_segments(8, 8 * 4096, 32, 132, num_segments=2, **both).warpgroups == 1  # cut: segment passes
    assert plan_segments(8, 8 * 4096, 32, 132, value_dim=64, **both).warpgroups == 1  # one tile only
    assert plan_segments(1, 32768, 32, 132, **both).warpgroups == 1  # narrow tiles


@pytest.mark.parametrize("sm_count", [80, 108, 132, 304])
def test_segment_plan_cuts_into_one_wave(sm_count: int) -> None:
    from polykernels.gated_delta_rule.launch import plan_segments

    # A second wave of segments ran slower than one fewer segment (BENCHMARKS.md, "segments").
    for num_seqs, value_heads, value_dim in itertools.product((1, 2, 3, 8), (1, 2, 6, 8, 16, 64), (64, 100, 128)):
        plan = plan_segments(num_seqs, num_seqs * 65536, value_heads, sm_count, value_dim=value_dim)
        programs = num_seqs * value_heads * -(-value_dim // plan.block_v)
        assert plan.segments == 1 or programs * plan.segments <= sm_count, (num_seqs, value_heads, plan)
        assert plan.segments > 1 or 2 * programs > sm_count, (num_seqs, value_heads, plan)


@pytest.mark.parametrize(("arch", "dtype", "key_dim", "release", "expected"), [
    ("sm_90", torch.bfloat16, 128, "3.6", True), ("sm_90", torch.bfloat16, 64, "3.6", True),
    ("sm_90", torch.float16, 128, "3.6", True), ("sm_90", torch.float32, 128, "3.6", False),
    ("sm_90", torch.bfloat16, 100, "3.6", False), ("sm_90", torch.bfloat16, 32, "3.6", False),
    ("sm_100", torch.bfloat16, 128, "3.6", False), ("sm_80", torch.bfloat16, 128, "3.6", False),
    ("sm_90", torch.bfloat16, 128, "3.7", False), ("sm_90", torch.bfloat16, 128, "", False)])
def test_gluon_pass_only_where_it_was_built_and_measured(monkeypatch: pytest.MonkeyPatch, arch: str,
                                                         dtype: torch.dtype, key_dim: int, release: str,
                                                         expected: bool) -> None:
    # wgmma is sm_90's; Gluon's API moves between Triton releases: elsewhere the Triton pass runs.
    from polykernels.gated_delta_rule import launch
    from polykernels.platform import Platform

    monkeypatch.setattr(launch, "_triton_release", lambda: release)
    seen = Platform(backend="cuda", arch=arch, device_name=None, warp_size=32, runtime_version=None)
    assert launch.hopper_pass(seen, dtype, key_dim) is expected


def test_gluon_passes_off_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # POLYKERNELS_GDN_GLUON=0: the Triton passes on sm_90 too, for calls whose recipes were made before as well.
    from polykernels.gated_delta_rule import launch
    from polykernels.platform import Platform

    monkeypatch.setattr(launch, "_triton_release", lambda: "3.6")
    seen = Platform(backend="cuda", arch="sm_90", device_name=None, warp_size=32, runtime_version=None)
    gluon = _sm90_recipe(monkeypatch, 1, 32768, 2, 8, None)
    assert launch.hopper_pass(seen, torch.bfloat16, 128) and gluon.hopper and gluon.hopper_prepare
    monkeypatch.setenv("POLYKERNELS_GDN_GLUON", "0")
    triton_only = _sm90_recipe(monkeypatch, 1, 32768, 2, 8, None)
    assert not launch.hopper_pass(seen, torch.bfloat16, 128)
    assert not (triton_only.hopper or triton_only.hopper_prepare or triton_only.lead or triton_only.concurrent)
    monkeypatch.setenv("POLYKERNELS_GDN_GLUON", "1")
    again = _sm90_recipe(monkeypatch, 1, 32768, 2, 8, None)
    assert again.spec == gluon.spec and again.hopper and again.hopper_prepare


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_torch_chunked_matches_naive(case: str, dtype: torch.dtype) -> None:
    check_against_naive(chunk_gated_delta_rule_torch, make_inputs(*CASES[case], dtype), dtype, initial=True)


def test_public_op_segments_chain_through_state() -> None:
    # The large-shape oracle in miniature: one run equals segments chained final -> initial.
    q, k, v, g, beta = make_inputs(1, 300, 2, 4, 32, 32, torch.float32)
    full_o, full_s = chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)
    state, outs = None, []
    for start, end in ((0, 64), (64, 129), (129, 300)):
        o, state = chunk_gated_delta_rule(q[:, start:end], k[:, start:end], v[:, start:end], g[:, start:end],
                                          beta[:, start:end], initial_state=state, output_final_state=True)
        outs.append(o)
    assert relative_rms_error(torch.cat(outs, dim=1), full_o) < 1e-5
    assert relative_rms_error(state, full_s) < 1e-5


def test_public_op_without_final_state_returns_none() -> None:
    o, final = chunk_gated_delta_rule(*make_inputs(1, 10, 1, 1, 16, 16, torch.float32))
    assert final is None and o.shape == (1, 10, 1, 16)


def test_torch_compile_traces_the_op() -> None:
    inputs = make_inputs(1, 20, 1, 2, 16, 16, torch.float32)
    compiled = torch.compile(lambda *a: chunk_gated_delta_rule(*a, output_final_state=True)[0] * 2,
                             fullgraph=True, backend="aot_eager")
    assert torch.allclose(compiled(*inputs), chunk_gated_delta_rule(*inputs)[0] * 2)


def test_torch_compile_fullgraph_with_cu_seqlens() -> None:
    # The packed prefill path: checking cu_seqlens' values must not break the graph.
    inputs = make_inputs(1, 20, 1, 2, 16, 16, torch.float32)
    cu = torch.tensor([0, 7, 20])
    compiled = torch.compile(lambda *a: chunk_gated_delta_rule(*a, cu_seqlens=cu, output_final_state=True),
                             fullgraph=True, backend="aot_eager")
    got_o, got_s = compiled(*inputs)
    want_o, want_s = chunk_gated_delta_rule(*inputs, cu_seqlens=cu, output_final_state=True)
    assert torch.allclose(got_o, want_o) and torch.allclose(got_s, want_s)


def _inputs(**changes):
    base = dict(zip(["q", "k", "v", "g", "beta"], make_inputs(1, 8, 2, 4, 16, 16, torch.float32), strict=True))
    base.update(changes)
    return base


@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        ({"k": torch.randn(1, 8, 2, 8)}, ValueError, r"q and k must both be \[B, T, H, K\]"),
        ({"v": torch.randn(1, 8, 3, 16)}, ValueError, r"value heads of v \(HV=3\) must be a multiple of .* \(H=2\)"),
        ({"v": torch.randn(1, 7, 4, 16)}, ValueError, r"v must be \[B, T, HV, V\] = \[1, 8, HV, V\]"),
        ({"g": torch.randn(1, 8, 2)}, ValueError, r"g must be \[B, T, HV\] = \[1, 8, 4\]"),
        ({"beta": torch.ones(1, 8, 4, dtype=torch.int64)}, TypeError, r"beta must be a floating-point tensor"),
        ({"q": torch.randn(1, 8, 2, 16).half()}, TypeError, r"q, k, v must share one dtype"),
        ({"q": torch.randn(1, 8, 16, 2).transpose(2, 3)}, ValueError, r"q must be contiguous"),
        ({"cu_seqlens": torch.tensor([0, 5, 3, 8])}, ValueError, r"cu_seqlens must be non-decreasing"),
        ({"cu_seqlens": torch.tensor([0, 5, 7])}, ValueError, r"cu_seqlens must start at 0 and end at T = 8"),
        ({"cu_seqlens": torch.tensor([0.0, 8.0])}, TypeError, r"cu_seqlens must be a 1-D int32/int64 tensor"),
        ({"initial_state": torch.zeros(2, 4, 16, 16)}, ValueError, r"initial_state must be \[N, HV, K, V\] = \[1, 4"),
        ({"q": torch.randn(1, 8, 2, 300), "k": torch.randn(1, 8, 2, 300)}, ValueError, r"between 1 and 256"),
        ({"use_qk_l2norm_in_kernel": "no"}, TypeError, r"use_qk_l2norm_in_kernel must be a bool, got str"),
        ({"output_final_state": 1}, TypeError, r"output_final_state must be a bool, got int"),
        ({"scale": float("nan")}, ValueError, r"scale must be a finite number, got nan"),
        ({"scale": "0.1"}, ValueError, r"scale must be a finite number"),
        ({"num_segments": 0}, ValueError, r"num_segments must be None or a positive int, got 0"),
    ],
    ids=["k-shape", "hv-not-multiple", "v-tokens", "g-heads", "beta-int", "dtype-mix", "non-contiguous",
         "cu-decreasing", "cu-end", "cu-float", "h0-shape", "k-too-large", "l2norm-str", "final-int", "scale-nan",
         "scale-str", "segments-zero"],
)
def test_bad_input_names_the_argument(changes, error, match) -> None:
    with pytest.raises(error, match=match):
        chunk_gated_delta_rule(**_inputs(**changes))


@pytest.mark.parametrize("changes", [{}, {"scale": 0.5}, {"use_qk_l2norm_in_kernel": True}, {"num_segments": 2},
                                     {"cu_seqlens": torch.tensor([0, 3, 8])}],
                         ids=["defaults", "scale", "l2norm", "segments", "cu_seqlens"])
def test_good_input_runs(changes) -> None:
    o, final = chunk_gated_delta_rule(**_inputs(**changes), output_final_state=True)
    assert torch.isfinite(o).all() and torch.isfinite(final).all()
    assert final.shape[0] == (2 if "cu_seqlens" in changes else 1)


def test_cu_seqlens_requires_batch_one() -> None:
    inputs = make_inputs(2, 8, 1, 1, 16, 16, torch.float32)
    with pytest.raises(ValueError, match=r"cu_seqlens requires B == 1.*got B = 2"):
        chunk_gated_delta_rule(*inputs, cu_seqlens=torch.tensor([0, 8]))


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How often the op reads cu_seqlens' values to the host (one list element per read; the CPU
    path's own use of them is not counted)."""
    from polykernels.gated_delta_rule import chunk

    reads: list[int] = []
    read = chunk._boundaries_on_host

    def counting(cu_seqlens: torch.Tensor) -> list[int]:
        reads.append(1)
        return read(cu_seqlens)

    monkeypatch.setattr(chunk, "_boundaries_on_host", counting)
    return reads


def test_cu_seqlens_values_are_read_once_until_written(monkeypatch: pytest.MonkeyPatch) -> None:
    # The layers of a forward share one cu_seqlens: its values are read (a GPU synchronization) once.
    inputs = _inputs()
    cu = torch.tensor([0, 3, 8])
    reads = _count_reads(monkeypatch)
    for _ in range(3):
        chunk_gated_delta_rule(**inputs, cu_seqlens=cu)
    assert len(reads) == 1
    cu[1] = 5  # written in place: read again, and still valid
    chunk_gated_delta_rule(**inputs, cu_seqlens=cu)
    assert len(reads) == 2
    cu[2] = 7  # now invalid: the next call must say so, not trust the earlier check
    with pytest.raises(ValueError, match=r"cu_seqlens must start at 0 and end at T = 8"):
        chunk_gated_delta_rule(**inputs, cu_seqlens=cu)
    shorter = {name: t[:, :7] for name, t in _inputs().items()}  # same tensor, another T: read again
    cu[2] = 7
    chunk_gated_delta_rule(**{name: t.contiguous() for name, t in shorter.items()}, cu_seqlens=cu)
    chunk_gated_delta_rule(**inputs, cu_seqlens=torch.tensor([0, 3, 8]))  # a new tensor is read
    assert len(reads) == 5


def test_cu_seqlens_inference_tensors_are_read_every_call(monkeypatch: pytest.MonkeyPatch) -> None:
    # Inference tensors have no version counter: a write to them could not be seen.
    inputs = _inputs()
    with torch.inference_mode():
        cu = torch.tensor([0, 3, 8])
        reads = _count_reads(monkeypatch)
        for _ in range(2):
            chunk_gated_delta_rule(**inputs, cu_seqlens=cu)
    assert len(reads) == 2


# Every unfriendly shape in bf16 (what models run); fp16 at one shape and fp32 at two: each distinct
# shape/dtype is a fresh Triton compile, and compiles dominate a GPU run. fp32 at K = 100 (padded to
# 128) is the shared-memory-hungry case: three pipeline stages of fp32 tiles do not fit on an H200.
GPU_CASES = [(case, torch.bfloat16) for case in CASES] + [("T65", torch.float16), ("T75-K60-V100", torch.float32),
                                                          ("T500-K100", torch.float32)]


@pytest.mark.gpu
@pytest.mark.parametrize(("case", "dtype"), GPU_CASES, ids=lambda v: str(v).removeprefix("torch."))
def test_gpu_matches_naive_recurrence(gpu_device: str, case: str, dtype: torch.dtype) -> None:
    inputs = make_inputs(*CASES[case], dtype, device=gpu_device)
    check_against_naive(launch_chunk_gated_delta_rule, inputs, dtype, initial=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gpu_widest_heads_through_the_op(gpu_device: str, dtype: torch.dtype) -> None:
    # K = V = 256 through the public op: bf16 on the Triton passes (their K = 256 launches), fp32 on the chunked
    # torch implementation (guards.FP32_TRITON_MAX_KEY_DIM): on sm_90 the Triton prepare pass would need 256 KiB
    # of shared memory for fp32 tiles this wide and could not launch.
    packed = boundaries([300, 0, 213], gpu_device)
    inputs = make_inputs(1, 513, 2, 4, 256, 256, dtype, device=gpu_device)
    check_against_naive(chunk_gated_delta_rule, inputs, dtype, initial=True, cu_seqlens=packed, num_seqs=3)


@pytest.mark.gpu
@pytest.mark.parametrize("keys", ["aligned", "repeated"])
@pytest.mark.parametrize("prepare", ["default", "triton"])
def test_gpu_keys_pointing_one_way(gpu_device: str, monkeypatch: pytest.MonkeyPatch, keys: str, prepare: str) -> None:
    # bf16 (I + A)^-1 products where A's powers reach 1e4-1e17 (test_triton_kernels_keys_pointing_one_way):
    # the squaring series gave NaN or 1e21-1e36 here, block doubling about what an fp32 inverse gives
    # (the bf16 w, u and state updates: 5e-3 to 1.1e-2 in a torch emulation of both, BENCHMARKS.md,
    # "(I + A)^-1 by block doubling"). "triton": the portable prepare pass on every GPU (sm_90 too).
    from polykernels.gated_delta_rule import launch

    if prepare == "triton":
        monkeypatch.setattr(launch, "HOPPER_PREPARE", {})
    inputs = make_inputs(1, 2000, 2, 4, 128, 128, torch.bfloat16, device=gpu_device, keys=keys, gate="slow")
    want_o, want_s = naive_recurrent_gated_delta_rule(*(t.double() for t in inputs), output_final_state=True)
    got_o, got_s = launch_chunk_gated_delta_rule(*inputs, 128**-0.5, None, True, None, False)
    assert relative_rms_error(got_o, want_o) < 2e-2
    assert relative_rms_error(got_s, want_s) < 2e-2


@pytest.mark.gpu
def test_gpu_varlen_and_l2norm(gpu_device: str) -> None:
    lengths = [1, 63, 0, 64, 65, 1, 300]
    cu = boundaries(lengths, gpu_device)
    inputs = make_inputs(1, int(cu[-1]), 2, 4, 128, 128, torch.bfloat16, device=gpu_device, l2norm_outside=False)
    check_against_naive(launch_chunk_gated_delta_rule, inputs, torch.bfloat16, initial=True, cu_seqlens=cu,
                        l2norm=True, num_seqs=len(lengths))


@pytest.mark.gpu
@pytest.mark.parametrize("segments", [None, 1, 7], ids=["auto", "whole", "7-segments"])
def test_gpu_segments_match_naive(gpu_device: str, segments) -> None:
    inputs = make_inputs(2, 1000, 2, 8, 128, 128, torch.bfloat16, device=gpu_device)

    def run(*args):
        return launch_chunk_gated_delta_rule(*args, num_segments=segments)

    check_against_naive(run, inputs, torch.bfloat16, initial=True)


def _matches_with_the_pass_off(monkeypatch: pytest.MonkeyPatch, run, factory: str, table: str,
                               tolerance: float, exact: tuple[torch.Tensor, torch.Tensor] | None = None) -> list:
    """``run()`` launches the Gluon pass of ``launch.<factory>()``, and its (o, state) match those of
    ``run()`` with that pass turned off (its table ``launch.<table>`` emptied): within ``tolerance``
    of them or, given the fp64 results ``exact``, each no further from them than ``tolerance`` times
    the other pass's error (for passes that round differently). Returns the (grid, num_warps) of
    each of the pass's launches."""
    from polykernels.gated_delta_rule import launch

    runs, real = [], getattr(launch, factory)()

    def counted(*args, **kwargs):
        runs.append((args[0], args[2].get("num_warps")))
        return real(*args, **kwargs)

    monkeypatch.setattr(launch, factory, lambda: counted)
    got = run()
    assert runs, f"the Gluon pass of launch.{factory} did not run"
    monkeypatch.setattr(launch, table, {})
    for got_part, want_part, exact_part in zip(got, run(), exact or (None, None), strict=True):
        if exact_part is None:
            assert relative_rms_error(got_part, want_part.double()) < tolerance
        else:
            got_error, want_error = relative_rms_error(got_part, exact_part), relative_rms_error(want_part, exact_part)
            assert got_error <= tolerance * want_error, f"error {got_error:.3e} against {want_error:.3e}"
    return runs


def _starting_mid_row(tensor: torch.Tensor) -> torch.Tensor:
    """The same values in a contiguous view whose data starts 2 bytes past a 16-byte boundary."""
    storage = torch.empty(tensor.numel() + 1, dtype=tensor.dtype, device=tensor.device)
    view = storage[1:].view(tensor.shape)
    view.copy_(tensor)
    assert view.data_ptr() % 16 != 0
    return view


@pytest.mark.gpu
@pytest.mark.parametrize(("tokens", "key_dim", "value_dim", "lengths", "segments", "dtype", "mid_row"), [
    (3000, 128, 128, None, None, torch.bfloat16, False),
    (2000, 64, 100, [700, 0, 1, 1299], 3, torch.bfloat16, False),
    (2000, 128, 128, [700, 0, 1, 1299], 3, torch.bfloat16, False),
    (1500, 128, 64, None, 2, torch.bfloat16, False),
    (3000, 128, 128, None, None, torch.float16, False),
    (1000, 128, 128, None, None, torch.bfloat16, True)],
    ids=["K128", "K64-V100-packed-3seg", "K128-packed-3seg", "K128-V64-2seg", "K128-fp16", "K128-qk-mid-row"])
@pytest.mark.parametrize("variant", ["shared-state", "register-state", "register-state-cut", "register-pair",
                                     "register-pair-from-v", "register-pair-scores"])
def test_gpu_hopper_pass_matches_the_portable_pass(gpu_device: str, monkeypatch: pytest.MonkeyPatch, tokens: int,
                                                   key_dim: int, value_dim: int, lengths, segments,
                                                   dtype: torch.dtype, mid_row: bool, variant: str) -> None:
    # Each Gluon sequential pass (sm_90) against the pass that runs without it on the same prepared
    # chunks (the shared-state pass against the Triton one; the register-state pass, at its 64-column
    # V tile, against the shared-state pass, on uncut sequences and as the output pass of cut ones;
    # its two-warpgroup form, two tiles per program, against the one-warpgroup form): cp.async tiles
    # reading zeros past each sequence's end and past V (100 columns), fp16, and q, k views starting
    # off a 16-byte boundary (copied first). The pairs as they run at K = 128 (launch.HOPPER_PAIRS_FROM_V:
    # the prepare pass stores T, the pairs form v_new from v; with launch.HOPPER_PAIRS_SCORES P from q and k too)
    # round v - diag(factor) k h to 16 bits where the one-warpgroup form rounds w and u: held to that form's
    # error against the fp64 recurrence.
    if torch.cuda.get_device_capability(gpu_device) != (9, 0):
        pytest.skip("the Gluon sequential passes run on sm_90 only; the other GPU tests cover this GPU's pass")
    from polykernels.gated_delta_rule import launch

    from_v = variant in ("register-pair-from-v", "register-pair-scores")
    monkeypatch.setattr(launch, "HOPPER_PAIRS_FROM_V", from_v)
    monkeypatch.setattr(launch, "HOPPER_PAIRS_SCORES", variant == "register-pair-scores")

    if variant == "shared-state":
        monkeypatch.setattr(launch, "HOPPER_REGISTER_STAGES", {})
        factory, table = "_hopper_launcher", "HOPPER_STAGES"
    else:  # at its 64-column tile, on uncut sequences or (cut) segments of any length
        monkeypatch.setattr(launch, "RECURRENCE_BLOCK_V", {**launch.RECURRENCE_BLOCK_V, key_dim: (64, 64)})
        factory, table = "_hopper_register_launcher", "HOPPER_REGISTER_STAGES"
        segments = (segments or 2) if variant == "register-state-cut" else 1
        monkeypatch.setattr(launch, "HOPPER_REGISTER_CUT", {64: 1})
    pairs = variant.startswith("register-pair")
    if pairs:  # pairs on a GPU of one SM: they always fill it
        from polykernels import platform

        monkeypatch.setattr(platform, "sm_count", lambda device: 1)
        table = "HOPPER_REGISTER_PAIRS"
        # Recipes are kept per class of call, whose key holds no SM count (the compiled launches' key, the
        # recipe's spec, does): a fresh recipe, and no launchers left from other tests' plans.
        launch._recipe.cache_clear()
        launch.forget_launchers()
    inputs = make_inputs(1, tokens, 2, 4, key_dim, value_dim, dtype, device=gpu_device)
    if mid_row:
        inputs = (_starting_mid_row(inputs[0]), _starting_mid_row(inputs[1]), *inputs[2:])
    cu = None if lengths is None else boundaries(lengths, gpu_device)
    num_seqs = 1 if lengths is None else len(lengths)
    h0 = torch.randn(num_seqs, 4, key_dim, value_dim, device=gpu_device)

    def run():
        return launch_chunk_gated_delta_rule(*inputs, key_dim**-0.5, h0, True, cu, False, segments)

    exact = None
    if from_v:
        exact = naive_recurrent_gated_delta_rule(*(t.double() for t in inputs), key_dim**-0.5, h0.double(), True, cu,
                                                 False)
    try:
        runs = _matches_with_the_pass_off(monkeypatch, run, factory, table, 1e-3 if exact is None else 1.5, exact)
    finally:
        if pairs:  # the real factories back, then what the pairs left is dropped
            monkeypatch.undo()
            launch._recipe.cache_clear()
            launch.forget_launchers()
    if pairs and value_dim > 64:  # two tiles per program of 8 warps, against one of 4
        (paired_grid, paired_warps), (single_grid, single_warps) = runs
        assert (paired_grid[0], paired_warps, single_grid[0], single_warps) == (-(-value_dim // 128), 8,
                                                                                 -(-value_dim // 64), 4), runs


def serial_at_64(launch, call):
    """The concurrent form's oracle: the same two kernels one after the other at the same 64-column
    tile (a forced uncut plan; the table without a concurrent entry). Replaces the two tables."""
    launch.RECURRENCE_BLOCK_V = {**launch.RECURRENCE_BLOCK_V, 128: (64, 64)}
    launch.HOPPER_CONCURRENT = {}
    return call(num_segments=1)


def ran_side_by_side(launch) -> bool:
    """The prepare pass was compiled for a programmatic-dependent launch (the concurrent form)."""
    kernels = launch._hopper_prepare_launcher()._kernels.values()
    return any(getattr(kernel.metadata, "launch_pdl", False) for kernel in kernels)


def _replayed_from_a_graph(call):
    """What ``call()`` returns captured in a CUDA graph (on a side stream) and replayed once."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        captured = call()
    graph.replay()
    torch.cuda.synchronize()
    return captured


def _registered_programs(monkeypatch: pytest.MonkeyPatch) -> list:
    """The steps of every launch program registered from now on."""
    from polykernels import _programs

    registered, register = [], _programs.register
    monkeypatch.setattr(_programs, "register", lambda *args, **kwargs: registered.append(args[4]) or register(*args,
                                                                                                                **kwargs))
    return registered


def _side_by_side_calls(monkeypatch: pytest.MonkeyPatch, inputs, h0, cu: torch.Tensor | None = None) -> tuple:
    """The public op from h0 with the final state: its Python path, its replayed launch program (the flags
    zeroed, the sequential pass, the prepare pass as its programmatic dependent) and a CUDA graph of it;
    then the direct launch at a given segment count, for the oracle (``cu``: packed sequences)."""
    from polykernels import _programs
    from polykernels._programs import Zero
    from polykernels.gated_delta_rule import launch

    # The batch rows that run beside the prepare pass in these tests are cut into windowed pairs by default.
    monkeypatch.setattr(launch, "HOPPER_WINDOWED_PAIRS", {})
    registered = _registered_programs(monkeypatch)

    def public():
        return chunk_gated_delta_rule(*inputs, initial_state=h0, output_final_state=True, cu_seqlens=cu)

    def call(num_segments=None):
        return launch_chunk_gated_delta_rule(*inputs, 128**-0.5, h0, True, cu, False, num_segments)

    first, replayed = public(), public()
    if _programs.enabled():
        (steps,) = registered
        assert isinstance(steps[0], Zero) and len(steps) == 3
        assert steps[2].launcher.described(steps[2].spec_key).dependent
    return first, replayed, _replayed_from_a_graph(public), call


def _tables_here(key_dim: int) -> tuple:
    """The launch tables' entries a call with K = ``key_dim`` reads on this GPU (``launch._recipe``'s arguments)."""
    from polykernels import platform
    from polykernels.gated_delta_rule import launch

    return launch.launch_tables(launch._block(key_dim), platform.current().arch)


@pytest.mark.gpu
@pytest.mark.parametrize(("batch", "tokens", "value_heads"), [(1, 8192 + 37, 32), (2, 8192, 16)],
                         ids=["B1-tail-chunk", "B2"])
@pytest.mark.parametrize("form", [(1, 3), (1, 2), (2, 2)], ids=["one-tile-3-stages", "one-tile-2-stages", "pair"])
def test_gpu_passes_side_by_side_match_them_one_after_the_other(gpu_device: str, monkeypatch: pytest.MonkeyPatch,
                                                                batch: int, tokens: int, value_heads: int,
                                                                form: tuple[int, int]) -> None:
    # The register-state pass and the prepare pass at once (the second the first's programmatic
    # dependent, ready flags between them) against the same two kernels one after the other: every
    # bit of o and the final state, from the Python path, the replayed launch program and a CUDA graph.
    # Each form of launch.HOPPER_CONCURRENT (tiles per program, stages), the kept one and those measured.
    if torch.cuda.get_device_capability(gpu_device) != (9, 0):
        pytest.skip("the passes run side by side on sm_90 only")
    from polykernels import platform
    from polykernels.gated_delta_rule import launch

    monkeypatch.setattr(launch, "HOPPER_CONCURRENT", {128: form})
    sm_count = platform.sm_count(torch.device(gpu_device))
    if 2 * batch * value_heads * 2 // form[0] > sm_count:
        pytest.skip("this GPU has too few SMs for the sequential programs to leave half of them")
    inputs = make_inputs(batch, tokens, 8, value_heads, 128, 128, torch.bfloat16, device=gpu_device)
    h0 = torch.randn(batch, value_heads, 128, 128, device=gpu_device)
    first, replayed, captured, call = _side_by_side_calls(monkeypatch, inputs, h0)
    with monkeypatch.context() as tables:
        for name in ("RECURRENCE_BLOCK_V", "HOPPER_CONCURRENT"):
            tables.setattr(launch, name, getattr(launch, name))  # restored after serial_at_64 replaces them
        if form[0] == 2:  # the serial plan pairs the tiles where the pairs fill the SMs: make them do so
            tables.setattr(platform, "sm_count", lambda device: 1)
        tables.setattr(launch, "HOPPER_PAIRS_FROM_V", False)  # the same kernels' bits: w and u from the prepare pass
        # and the inverse's levels as beside (per warp where the GPU's DRAM or the heads allow)
        beside, _ = launch.concurrent_warp_blocks(8, value_heads, platform.dram_gbps(torch.device(gpu_device)),
                                                  launch.HOPPER_CONCURRENT_WARP_BLOCKS_GBPS)
        tables.setattr(launch, "HOPPER_WARP_BLOCK_INVERSE", launch.HOPPER_WARP_BLOCK_INVERSE and beside)
        want = serial_at_64(launch, call)
    assert ran_side_by_side(launch)
    for got in (first, replayed, captured):
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.gpu
@pytest.mark.parametrize(("batch", "tokens", "value_heads"), [(1, 8192 + 37, 64), (2, 8192, 32)],
                         ids=["B1-tail-chunk", "B2"])
def test_gpu_pairs_beside_the_prepare_pass_match_them_one_after_the_other(gpu_device: str,
                                                                          monkeypatch: pytest.MonkeyPatch, batch: int,
                                                                          tokens: int, value_heads: int) -> None:
    # Where one 64-column tile per program would leave the prepare pass fewer than half the SMs, two per program
    # run beside it in FlashInfer's order of the chain (launch.HOPPER_CONCURRENT_PAIRS, the prepare pass storing
    # T): every bit of o and the final state as the same kernels give one after the other, from the Python path,
    # the replayed launch program and a CUDA graph.
    if torch.cuda.get_device_capability(gpu_device) != (9, 0):
        pytest.skip("the passes run side by side on sm_90 only")
    from polykernels import platform

    sm_count = platform.sm_count(torch.device(gpu_device))
    if not 4 * batch * value_heads > sm_count >= 2 * batch * value_heads:
        pytest.skip("on this GPU one tile per program leaves half the SMs, or the pairs do not")
    inputs = make_inputs(batch, tokens, 8, value_heads, 128, 128, torch.bfloat16, device=gpu_device)
    h0 = torch.randn(batch, value_heads, 128, 128, device=gpu_device)
    runs, want = _pairs_beside_and_after(monkeypatch, inputs, h0, None, batch)
    for got in runs:
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def _pairs_beside_and_after(monkeypatch: pytest.MonkeyPatch, inputs, h0, cu: torch.Tensor | None,
                            num_seqs: int) -> tuple[list, tuple]:
    """The pairs beside the prepare pass (the plan must take them): the public op's three runs (Python path,
    replayed launch program, CUDA graph); and the same kernels one after the other, the oracle."""
    from polykernels import platform
    from polykernels.gated_delta_rule import launch

    monkeypatch.setattr(launch, "HOPPER_WINDOWED_PAIRS", {})  # (batch rows: not cut into windowed pairs)
    recipe = launch._recipe(inputs[0].shape, inputs[2].shape, torch.bfloat16, None if cu is None else cu.dtype,
                            num_seqs, True, True, False, None, inputs[0].device, platform.current(),
                            *_tables_here(128))
    assert recipe.concurrent and recipe.from_v and recipe.plan.warpgroups == 2
    first, replayed, captured, call = _side_by_side_calls(monkeypatch, inputs, h0, cu)
    assert ran_side_by_side(launch)
    with monkeypatch.context() as tables:
        for name in ("RECURRENCE_BLOCK_V", "HOPPER_CONCURRENT"):
            tables.setattr(launch, name, getattr(launch, name))  # restored after serial_at_64 replaces them
        tables.setattr(platform, "sm_count", lambda device: 1)  # the serial plan then pairs the tiles
        want = serial_at_64(launch, call)
    return [first, replayed, captured], want


@pytest.mark.gpu
@pytest.mark.parametrize("lengths", [[1024] * 8, [3000, 0, 1, 2000, 20 * 64 + 5]], ids=["of-one-length", "mixed"])
def test_gpu_packed_sequences_beside_the_prepare_pass_match_them_one_after_the_other(
        gpu_device: str, monkeypatch: pytest.MonkeyPatch, lengths: list[int]) -> None:
    # launch.HOPPER_CONCURRENT_PACKED: the pairs beside the prepare pass for packed sequences, their flags numbered
    # by slot and the prepare programs taking the slots row by row (kernels._ready_slot, the grid rounded up to
    # whole rows): every bit of o and the final state as the same kernels give one after the other, from the
    # Python path, the replayed launch program and a CUDA graph; an empty and a one-token sequence among them.
    _needs_register_state_passes(gpu_device)
    from polykernels import platform
    from polykernels.gated_delta_rule import launch

    value_heads = 8
    programs = len(lengths) * value_heads  # the pairs'
    if not 4 * programs > platform.sm_count(torch.device(gpu_device)) >= 2 * programs:
        pytest.skip("on this GPU one tile per program leaves half the SMs, or the pairs do not")
    monkeypatch.setattr(launch, "HOPPER_CONCURRENT_PACKED", True)
    monkeypatch.setattr(launch, "CONCURRENT_PAIRS_MIN_CHUNKS", 1)
    launch.forget_launchers()
    cu = boundaries(lengths, gpu_device, torch.int32)
    inputs = make_inputs(1, sum(lengths), 2, value_heads, 128, 128, torch.bfloat16, device=gpu_device)
    h0 = torch.randn(len(lengths), value_heads, 128, 128, device=gpu_device)
    try:
        runs, want = _pairs_beside_and_after(monkeypatch, inputs, h0, cu, len(lengths))
    finally:
        launch._recipe.cache_clear()
        launch.forget_launchers()
    assert torch.isfinite(want[0]).all() and torch.isfinite(want[1]).all()
    for got in runs:
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.gpu
@pytest.mark.parametrize(("batch", "tokens", "lengths", "dtype"), [
    (2, 4096 + 37, None, torch.bfloat16), (1, 3000, [1000, 0, 1, 1999], torch.bfloat16),
    (2, 2048, None, torch.float16)], ids=["B2-tail-chunk", "packed", "fp16"])
@pytest.mark.parametrize(("table", "meta"), [("HOPPER_PAIRS_SCORES", "SCORES"), ("HOPPER_PAIRS_TMA", "TMA")],
                         ids=["scores", "tma"])
def test_gpu_pairs_forming_the_scores_match_the_stored_scores(gpu_device: str, monkeypatch: pytest.MonkeyPatch,
                                                              batch: int, tokens: int, lengths,
                                                              dtype: torch.dtype, table: str, meta: str) -> None:
    # launch.HOPPER_PAIRS_SCORES: the pairs after the prepare pass form P = q k^T (gated, scaled, causal) from the
    # q and k tiles and two exponents per token, where the prepare pass formed and stored it. Same arithmetic in
    # the same order: every bit of o and the final state as with P stored, from the Python path, the replayed
    # launch program and a CUDA graph; packed sequences (an empty one, one of one token) and fp16 too.
    # launch.HOPPER_PAIRS_TMA: those pairs copy their tiles by TMA (rows past a sequence's end read 0, the
    # descriptors in the workspace as the kernel's global scratch): every bit as with cp.async.
    _needs_register_state_passes(gpu_device)
    from polykernels import platform
    from polykernels.gated_delta_rule import launch

    monkeypatch.setattr(platform, "sm_count", lambda device: 1)  # the pairs fill a GPU of one SM
    launch._recipe.cache_clear()
    launch.forget_launchers()
    inputs = make_inputs(batch, tokens, 4, 8, 128, 128, dtype, device=gpu_device)
    cu = None if lengths is None else boundaries(lengths, gpu_device)
    num_seqs = batch if lengths is None else len(lengths)
    h0 = torch.randn(num_seqs, 8, 128, 128, device=gpu_device)

    def public():
        return chunk_gated_delta_rule(*inputs, initial_state=h0, output_final_state=True, cu_seqlens=cu)

    try:
        monkeypatch.setattr(launch, table, True)
        recipe = launch._recipe(inputs[0].shape, inputs[2].shape, dtype, None if cu is None else cu.dtype, num_seqs,
                                True, True, False, None, inputs[0].device, platform.current(), *_tables_here(128))
        assert recipe.recurrence_meta.get("SCORES") and recipe.prepare_meta.get("SCORE_FACTORS")
        assert recipe.recurrence_meta.get(meta)
        runs = [public(), public(), _replayed_from_a_graph(public)]
        monkeypatch.setattr(launch, table, False)
        want = public()
    finally:
        monkeypatch.undo()
        launch._recipe.cache_clear()
        launch.forget_launchers()
    assert torch.isfinite(want[0]).all() and torch.isfinite(want[1]).all()
    for got in runs:
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


# launch.HOPPER_LEAD_BESIDE_PREPARE's rates that give the lead beside the prepare pass a head start of ten
# chunks at any size (a prepare pass that costs nothing, its first chunk ready before the start): the plan
# then takes that form, with the first segment the longer one, in the small shapes of the GPU tests.
HEAD_START = LeadRates(prepare=0.0, prepare_beside=0.0, first_ready=-10 * 1.58, lead_beside=1.58, lead=1.58,
                       state=1.63)


@pytest.mark.gpu
@pytest.mark.parametrize(("batch", "tokens", "segments", "initial", "key_dim", "value_dim"), [
    (1, 3000, 3, True, 128, 128), (2, 2000 + 37, 4, False, 128, 128), (1, 1100, 9, True, 128, 128),
    (1, 2000, 4, True, 64, 100), (2, 1500, 3, True, 128, 128)],
    ids=["B1-3seg-initial", "B2-tail-chunk-4seg", "B1-9seg-initial", "K64-V100-4seg", "B2-3seg-initial"])
@pytest.mark.parametrize("beside_prepare", [False, True], ids=["after-prepare", "beside-prepare"])
def test_gpu_lead_segment_beside_the_segment_states(gpu_device: str, monkeypatch: pytest.MonkeyPatch, batch: int,
                                                    tokens: int, segments: int, initial: bool, key_dim: int,
                                                    value_dim: int, beside_prepare: bool) -> None:
    # Each sequence's first segment through its output pass, with the other segments' segment-state
    # pass beside it as its programmatic dependent, and each output program's scan from the second
    # segment up to its own (launch.HOPPER_LEAD_SEGMENT): against the fp64 recurrence, no further from
    # it than the segment passes without that form (which start the second segment from M h0 + h_local
    # where the first segment's own chain carries the state on); the Python path, the replayed launch
    # program and a CUDA graph give the same bits. beside_prepare: the lead launched first, beside the prepare
    # pass (launch.HOPPER_LEAD_BESIDE_PREPARE, its rates made to give the first segment a long head start:
    # the others are shorter, and the first takes the rest).
    _needs_register_state_passes(gpu_device)
    from polykernels import platform
    from polykernels.gated_delta_rule import launch

    monkeypatch.setattr(launch, "HOPPER_LEAD_SEGMENT", {64: 1})  # segments of any length
    monkeypatch.setattr(launch, "SEGMENT_WINDOWS", False)  # the lead form's plan
    head_start = {64: HEAD_START, 128: HEAD_START} if beside_prepare else {}
    monkeypatch.setattr(launch, "HOPPER_LEAD_BESIDE_PREPARE", head_start)
    inputs = make_inputs(batch, tokens, 2, 8, key_dim, value_dim, torch.bfloat16, device=gpu_device)
    h0 = torch.randn(batch, 8, key_dim, value_dim, device=gpu_device) if initial else None
    registered = _registered_programs(monkeypatch)

    def public():
        return chunk_gated_delta_rule(*inputs, initial_state=h0, output_final_state=True, num_segments=segments)

    first, replayed = public(), public()
    recipe = launch._recipe(inputs[0].shape, inputs[2].shape, torch.bfloat16, None, batch, initial, True, False,
                            segments, inputs[0].device, platform.current(), *_tables_here(key_dim))
    assert recipe.beside_prepare is beside_prepare and recipe.segments_per_seq == segments
    if beside_prepare:
        first_chunks = -(-tokens // 64) - (segments - 1) * recipe.segment_chunks
        assert first_chunks > recipe.segment_chunks, (first_chunks, recipe.segment_chunks)
    # The counters zeroed, then prepare, lead, segment states (dependent), outputs; or the lead first, then
    # prepare (dependent), segment states (the prepare pass's dependent), outputs.
    _holds_as_the_lead_form(monkeypatch, public, first, replayed, registered,
                            [False, True, True, False] if beside_prepare else [False, False, True, False],
                            inputs, h0, None, segments)


def test_segment_windows_cut_without_the_lead_form(monkeypatch: pytest.MonkeyPatch) -> None:
    # launch.SEGMENT_WINDOWS on sm_90: cut sequences without the lead form, one wave of segments, the
    # register-state passes over them whatever their length, the prepare pass storing each chunk's growth and
    # the segment-state programs finding their windows. Off, the lead form.
    from polykernels.gated_delta_rule import launch

    monkeypatch.setattr(launch, "HOPPER_WINDOWED_PAIRS", {})  # one tile per program (the pairs': the tests after)
    monkeypatch.setattr(launch, "HOPPER_WINDOWED_PACKED_PAIRS", {})
    thin = _sm90_recipe(monkeypatch, 1, 32768, 2, 8, None)
    assert (thin.segment_windows, thin.lead, thin.segments_per_seq, thin.segment_chunks) == (True, False, 8, 64)
    assert thin.segment_state_meta["SEGMENT_WINDOW"] and thin.prepare_meta["GROWTH"]
    assert "gates have decayed the rest below 2^-30" in thin.plan.reason
    assert "SEGMENT_WINDOW" not in thin.recurrence_meta  # the output pass is the same kernel as without
    # launch.HOPPER_SCAN_WINDOWS: the output programs scan the segment states (from the initial state where one is
    # passed and no window found), no combine pass and no workspace for its initial states.
    names = [name for _, _, name, _, _ in launch._launches(thin, launch._launchers(), ())]
    assert names == ["prepare", "segment_state", "recurrence"] and thin.after_windows
    assert thin.recurrence_meta["AFTER_WINDOWS"] and not thin.recurrence_meta["HAS_INITIAL"]
    assert thin.workspace.parts[launch._Scratch._fields.index("h_init")].shape[0] == 0
    initial = _sm90_recipe(monkeypatch, 1, 32768, 2, 8, None, has_initial=True)
    assert initial.after_windows and initial.recurrence_meta["HAS_INITIAL"]
    assert [name for _, _, name, _, _ in launch._launches(initial, launch._launchers(), ())] == names
    wide = _sm90_recipe(monkeypatch, 1, 32768, 4, 16, None)
    assert (wide.segment_windows, wide.lead, wide.beside_prepare, wide.segments_per_seq) == (True, False, False, 4)
    short = _sm90_recipe(monkeypatch, 1, 8192, 2, 8, None)  # 8 segments of 16 chunks
    assert short.segment_windows and not short.lead and short.segment_registers and short.hopper_registers
    assert short.segment_chunks == 16
    # Packed sequences take the windows where the output pass scans them; with HOPPER_PACKED_WINDOWS or
    # HOPPER_SCAN_WINDOWS off, the lead form.
    packed = _sm90_recipe(monkeypatch, 1, 8192, 2, 8, None, packed=2)  # 6144 + 2048 tokens: 4 of 16 on average
    assert packed.segment_windows and not packed.lead and packed.segment_chunks == 16 and packed.after_windows
    packed = _sm90_recipe(monkeypatch, 1, 8192, 2, 8, None, packed=2, has_initial=True)
    assert packed.segment_windows and packed.after_windows and packed.recurrence_meta["HAS_INITIAL"]
    monkeypatch.setattr(launch, "HOPPER_PACKED_WINDOWS", False)
    packed = _sm90_recipe(monkeypatch, 1, 8192, 2, 8, None, packed=2)
    assert packed.lead and not packed.segment_windows and not packed.prepare_meta["GROWTH"]
    monkeypatch.setattr(launch, "HOPPER_PACKED_WINDOWS", True)
    monkeypatch.setattr(launch, "HOPPER_SCAN_WINDOWS", False)
    combined = _sm90_recipe(monkeypatch, 1, 32768, 2, 8, None)
    assert combined.segment_windows and not combined.after_windows and combined.recurrence_meta["HAS_INITIAL"]
    assert [name for _, _, name, _, _ in launch._launches(combined, launch._launchers(), ())] == [
        "prepare", "segment_state", "combine", "recurrence"]
    assert _sm90_recipe(monkeypatch, 1, 8192, 2, 8, None, packed=2).lead
    monkeypatch.setattr(launch, "SEGMENT_WINDOWS", False)
    off = _sm90_recipe(monkeypatch, 1, 32768, 2, 8, None)
    assert off.lead and not off.segment_windows and off.segments_per_seq == 9


def test_segment_plan_cuts_batch_rows_into_windowed_pairs_of_one_wave() -> None:
    # launch.HOPPER_WINDOWED_PAIRS: where two-tile programs leave half the SMs, one wave of them in segments of at
    # least the table's chunks, at least WINDOWED_PAIRS_MIN_SEGMENTS of them, shorter than the one-tile programs'
    # segments would be; never a forced count.
    from polykernels.gated_delta_rule.launch import WINDOWED_PAIRS_MIN_SEGMENTS, plan_segments

    pairs = {"register_tiles": (64,), "register_pairs": (64,), "windowed_pairs": {64: 32}}
    b1 = plan_segments(1, 32768, 32, 132, **pairs)  # 32 pair programs: four segments of 128 chunks
    assert (b1.segments, b1.segment_chunks, b1.block_v, b1.warpgroups, b1.concurrent) == (4, 128, 64, 2, False)
    assert "32 sequential programs of two 64-column tiles (N x HV x V/128) for 132 SMs" in b1.reason
    assert (plan_segments(1, 32768, 8, 132, **pairs).segments, plan_segments(1, 65536, 8, 132, **pairs).segments) == (
        16, 16)  # 8 pair programs: sixteen segments of 32 and of 64 chunks
    assert plan_segments(1, 16384, 8, 132, **pairs).segment_chunks == 32  # 256 chunks: eight of the least 32
    # 1 x 8192 at 8 value heads: four pair segments of 32 chunks, where the one-tile programs run eight of 16.
    assert plan_segments(1, 8192, 8, 132, **pairs).warpgroups == 1
    shorter = plan_segments(1, 8192, 8, 132, **{**pairs, "windowed_pairs": {64: 8}})  # sixteen of 8
    assert (shorter.segments, shorter.segment_chunks, shorter.warpgroups) == (16, 8, 2)
    assert plan_segments(1, 4096, 8, 132, **{**pairs, "windowed_pairs": {64: 8}}).warpgroups == 1  # 8 either way
    assert WINDOWED_PAIRS_MIN_SEGMENTS == 4
    assert plan_segments(1, 8192, 64, 132, **pairs).warpgroups == 1  # 64 pair programs: two segments, too few
    assert plan_segments(1, 4096, 8, 132, **pairs).warpgroups == 1  # 64 chunks: two of 32, too few
    assert plan_segments(8, 8 * 4096, 32, 132, **pairs).segments == 1  # 256 pairs fill the GPU: not cut
    assert plan_segments(1, 32768, 32, 132, num_segments=2, **pairs).warpgroups == 1  # a forced count
    assert plan_segments(1, 32768, 32, 132, value_dim=64, **pairs).warpgroups == 1  # one tile only
    assert plan_segments(1, 32768, 32, 132, register_tiles=(64,), register_pairs=(64,)).warpgroups == 1  # no table
    assert plan_segments(1, 32768, 32, 132, register_tiles=(64,), windowed_pairs={64: 32}).warpgroups == 1  # no pairs


def test_segment_plan_cuts_packed_sequences_into_windowed_pairs_of_one_wave_whatever_the_lengths() -> None:
    # launch.HOPPER_WINDOWED_PACKED_PAIRS: the lengths are not known, so the segments are the shortest (of at least
    # the table's chunks) whose slots, at most ceil(tokens / segment tokens) + N (kernels._sequence_of), make one
    # wave of pairs; taken where a sequence of the average length makes WINDOWED_PAIRS_MIN_SEGMENTS of them.
    from polykernels.gated_delta_rule.launch import _packed_windowed_pairs, plan_segments

    pairs = {"register_tiles": (64,), "register_pairs": (64,), "windowed_pairs": {64: 8}, "packed": True}
    varlen = plan_segments(2, 8192, 8, 132, **pairs)  # 6144 + 2048 tokens: 16 slots of 8 pairs, 14 after the firsts
    assert (varlen.segments, varlen.segment_chunks, varlen.block_v, varlen.warpgroups) == (7, 10, 64, 2)
    assert "packed sequences in segments of 10 chunks, their slots one wave whatever the lengths" in varlen.reason
    # At least 16 chunks: the one-tile programs' segments (16) are as short, so theirs.
    assert plan_segments(2, 8192, 8, 132, **{**pairs, "windowed_pairs": {64: 16}}).warpgroups == 1
    longer = plan_segments(2, 16384, 8, 132, **{**pairs, "windowed_pairs": {64: 16}})  # the one-tile ones: 32
    assert (longer.segment_chunks, longer.warpgroups) == (19, 2)
    assert plan_segments(2, 8192, 8, 132, **{**pairs, "windowed_pairs": {64: 32}}).warpgroups == 1  # two: too few
    assert plan_segments(8, 8192, 8, 132, **pairs).warpgroups == 1  # 8 x 1024: 16 chunks each, one segment
    assert plan_segments(2, 8192, 8, 132, num_segments=4, **pairs).warpgroups == 1  # a forced count
    assert plan_segments(2, 8192, 8, 132, **{**pairs, "windowed_pairs": {}}).warpgroups == 1  # no table
    assert _packed_windowed_pairs(16, 8192, 8, 132, 8) is None  # a slot per sequence is already the wave
    for sequences, tokens, per_segment, sms in itertools.product((1, 2, 5, 15), (1, 64, 65, 8192, 100_003),
                                                                 (1, 8, 16, 33), (100, 132)):
        chunks = _packed_windowed_pairs(sequences, tokens, per_segment, sms, 8)
        if chunks is None:
            assert (sequences + 1) * per_segment > sms
        else:  # every slot the recipe allocates (launch._recipe's max_segments) in one wave
            assert chunks >= 8 and (-(-tokens // (64 * chunks)) + sequences) * per_segment <= sms
            shorter = chunks - 1
            assert shorter < 8 or (-(-tokens // (64 * shorter)) + sequences) * per_segment > sms  # the shortest


def test_windowed_pairs_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    # B1 T32768 32/32 on sm_90: the prepare pass alone storing T, the score exponents and the growth; the windowed
    # segment states in FlashInfer's order (two tiles, no outputs: no P formed); the pairs after them forming P and
    # scanning back to the last window: no combine pass, no lead, nothing side by side. The tables it needs off: the
    # one-tile form beside the prepare pass, as before.
    from polykernels.gated_delta_rule import launch

    for variable in ("CUDA_LAUNCH_BLOCKING", *launch.INJECTED_TOOL_VARIABLES, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                     "POLYKERNELS_GDN_CONCURRENT"):
        monkeypatch.delenv(variable, raising=False)
    recipe = _sm90_recipe(monkeypatch, 1, 32768, 32, 32, None)
    assert (recipe.segments_per_seq, recipe.segment_chunks, recipe.plan.warpgroups) == (4, 128, 2)
    assert recipe.from_v and recipe.segment_windows and recipe.after_windows and recipe.segment_registers
    assert not (recipe.concurrent or recipe.lead or recipe.beside_prepare)
    assert [name for _, _, name, _, _ in launch._launches(recipe, launch._launchers(), ())] == [
        "prepare", "segment_state", "recurrence"]
    prepare, states, outputs = recipe.prepare_meta, recipe.segment_state_meta, recipe.recurrence_meta
    assert prepare["STORE_T"] and prepare["SCORE_FACTORS"] and prepare["GROWTH"] and not prepare["CONCURRENT"]
    assert recipe.segment_state_grid == (2, 4, 32) and recipe.recurrence_grid == (1, 4, 32)
    pair_stages = launch.HOPPER_REGISTER_PAIRS[64]
    assert (states["BV"], states["num_warps"], states["STAGES"]) == (128, 8, pair_stages)
    assert states["FROM_V"] and states["SEGMENT_WINDOW"] and "SCORES" not in states and not states["AWAIT"]
    assert states["CHUNK_SCALES"]  # the scales where the pairs after them read them
    assert (outputs["BV"], outputs["num_warps"], outputs["STAGES"]) == (128, 8, pair_stages)
    assert outputs["FROM_V"] and outputs["SCORES"] and outputs["AFTER_WINDOWS"] and not outputs["HAS_INITIAL"]
    parts = dict(zip(launch._Scratch._fields, recipe.workspace.parts, strict=True))
    # HOPPER_PAIRS_TMA: in the output pass only
    assert recipe.recurrence_meta["TMA"] and not recipe.segment_state_meta.get("TMA")
    assert parts["descriptors"].shape == (4 * 32 * launch.TMA_SCRATCH_BYTES,)  # one wave of 128 pair programs
    # The chunks' scales (P's two exponents per token, k's factor in w, q's and k's scales among them): no
    # token-major copy of any
    assert parts["scores"].shape == (32768, 32, 8)
    assert all(parts[name].shape == (0, 32) for name in ("u", "q_scale", "k_scale"))
    assert parts["decay"].shape == (32768, 32)
    assert parts["h_local"].shape == (4, 32, 128, 128) and parts["transitions"].shape == (4, 32, 128, 128)
    assert parts["h_init"].shape[0] == 0 and parts["flags"].shape == (0,)
    assert _sm90_recipe(monkeypatch, 1, 32768, 32, 32, None, has_initial=True).recurrence_meta["HAS_INITIAL"]
    # Each table it rests on turns it off: the one-tile programs beside the prepare pass instead.
    for name, off in (("HOPPER_WINDOWED_PAIRS", {}), ("HOPPER_PAIRS_SCORES", False), ("HOPPER_PAIRS_FROM_V", False),
                      ("SEGMENT_WINDOWS", False), ("HOPPER_SCAN_WINDOWS", False), ("HOPPER_REGISTER_PAIRS", {})):
        with monkeypatch.context() as tables:
            tables.setattr(launch, name, off)
            other = _sm90_recipe(monkeypatch, 1, 32768, 32, 32, None)
            assert other.concurrent and other.plan.warpgroups == 1 and not other.from_v, name
    # Packed sequences (launch.HOPPER_WINDOWED_PACKED_PAIRS): 12288 + 4096 tokens at 2/8 heads in segments of 19
    # chunks, slots for ceil(16384 / 1216) + 2 of them; off, the one-tile windows.
    packed = _sm90_recipe(monkeypatch, 1, 16384, 2, 8, None, packed=2, has_initial=True)
    assert (packed.segment_chunks, packed.max_segments, packed.plan.warpgroups) == (19, 16, 2)
    assert packed.from_v and packed.after_windows and packed.segment_registers and not packed.lead
    assert packed.segment_state_grid == (2, 16, 8) and packed.recurrence_grid == (1, 16, 8)
    assert packed.prepare_meta["STORE_T"] and packed.prepare_meta["SCORE_FACTORS"] and packed.prepare_meta["VARLEN"]
    assert packed.segment_state_meta["SEGMENT_WINDOW"] and packed.segment_state_meta["VARLEN"]
    assert packed.recurrence_meta["AFTER_WINDOWS"] and packed.recurrence_meta["SCORES"]
    assert packed.recurrence_meta["HAS_INITIAL"] and packed.recurrence_meta["STORE_FINAL"]
    assert packed.workspace.parts[launch._Scratch._fields.index("h_local")].shape == (16, 8, 128, 128)
    assert not _sm90_recipe(monkeypatch, 1, 8192, 2, 8, None, packed=2).from_v  # 6144 + 2048: one-tile's as short
    monkeypatch.setattr(launch, "HOPPER_WINDOWED_PACKED_PAIRS", {})
    one_tile = _sm90_recipe(monkeypatch, 1, 16384, 2, 8, None, packed=2)
    assert one_tile.plan.warpgroups == 1 and not one_tile.from_v and one_tile.segment_windows


def _windowed_and_whole(monkeypatch: pytest.MonkeyPatch, inputs, segments: int, h0=None, cu=None):
    """(outputs, transitions) with launch.SEGMENT_WINDOWS, then the same cut without it (and without the lead
    form, so both run the same passes but the windows): each segment's stored transition beside the outputs."""
    from polykernels._workspace import Layout
    from polykernels.gated_delta_rule import launch

    allocated, allocate = [], Layout.allocate
    monkeypatch.setattr(Layout, "allocate", lambda self, device: allocated.append(allocate(self, device)) or
                        allocated[-1])
    key_dim = inputs[0].shape[-1]
    num_seqs = inputs[0].shape[0] if cu is None else cu.shape[0] - 1
    monkeypatch.setattr(launch, "HOPPER_PACKED_WINDOWS", True)  # the Gluon passes' windows, packed sequences too
    results = []
    for windows in (True, False):
        monkeypatch.setattr(launch, "SEGMENT_WINDOWS", windows)
        monkeypatch.setattr(launch, "HOPPER_LEAD_SEGMENT", {} if not windows else launch.HOPPER_LEAD_SEGMENT)
        outputs = launch_chunk_gated_delta_rule(*inputs, key_dim**-0.5, h0, True, cu, False, segments)
        if inputs[0].is_cuda:
            torch.cuda.synchronize()
        recipe = launch._recipe(inputs[0].shape, inputs[2].shape, inputs[0].dtype, None if cu is None else cu.dtype,
                                num_seqs, h0 is not None, True, False, segments, inputs[0].device,
                                *_platform_and_tables_here(key_dim))
        assert recipe.segment_windows is windows and not recipe.lead and recipe.segment_chunks
        transitions = launch._Scratch(*recipe.workspace.views(allocated[-1])).transitions
        results.append((outputs, transitions.clone()))
    return results


def _no_further_from_the_recurrence(got, want, inputs, scale: float, h0=None, cu=None, factor: float = 1.1,
                                    slack: float = 0.0) -> None:
    """``got``'s (o, final state) within the dtype's bound of the fp64 recurrence, and no further from it than
    ``factor`` times ``want``'s (the same call by another form of the passes), plus ``slack``."""
    exact = naive_recurrent_gated_delta_rule(*(t.double() for t in inputs), scale, None if h0 is None else
                                             h0.double(), True, cu)
    for got_part, want_part, oracle in zip(got, want, exact, strict=True):
        assert relative_rms_error(got_part, oracle) < BOUND[inputs[0].dtype]
        assert relative_rms_error(got_part, oracle) <= factor * relative_rms_error(want_part, oracle) + slack


def _platform_and_tables_here(key_dim: int) -> tuple:
    from polykernels import platform

    return (platform.current(), *_tables_here(key_dim))


def _steady_gates(inputs, per_token: float):
    """The inputs with every gate at ``per_token``."""
    return (*inputs[:3], torch.full_like(inputs[3], per_token), inputs[4])


@pytest.mark.cpu_only
def test_triton_segment_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    # The Triton passes (every target but sm_90's 16-bit inputs): 48 chunks in 4 segments of 12, gates of
    # -0.06 a token (5.5 off log2 a chunk: 6-chunk windows). Value head 0 takes them: its transitions stored
    # as 0 where without the windows they are about 2^-66. Value head 1 (g = 0) takes none: its transitions
    # (small: (I - beta k k^T) alone over 768 tokens of K = 16 keys) and outputs the same bits as without.
    # Both as near the fp64 recurrence as without the windows.
    inputs = _steady_gates(make_inputs(1, 48 * 64, 1, 2, 16, 16, torch.float32), -0.06)
    inputs[3][..., 1] = 0.0
    h0 = torch.randn(1, 2, 16, 16)
    (windowed, kept), (whole, full) = _windowed_and_whole(monkeypatch, inputs, 4, h0)
    assert bool((kept[:3, 0] == 0).all()) and bool((full[:3, 0] != 0).any())
    assert torch.equal(kept[:3, 1], full[:3, 1]) and bool(full[:3, 1].abs().amax() > 0)  # (I - beta k k^T) alone
    assert torch.equal(windowed[0][..., 1, :], whole[0][..., 1, :]) and torch.equal(windowed[1][:, 1], whole[1][:, 1])
    _no_further_from_the_recurrence(windowed, whole, inputs, 0.25, h0, slack=1e-7)


@pytest.mark.cpu_only
def test_triton_segment_windows_of_packed_sequences(monkeypatch: pytest.MonkeyPatch) -> None:
    # Packed sequences of 1500, 700 (one segment: none to hand on), 37 and 2900 tokens in segments of 12 chunks.
    lengths = [1500, 700, 37, 2900]
    inputs = _steady_gates(make_inputs(1, sum(lengths), 1, 2, 16, 16, torch.float32), -0.06)
    cu = boundaries(lengths)
    (windowed, kept), (whole, full) = _windowed_and_whole(monkeypatch, inputs, 3, cu=cu)
    assert bool((kept == 0).any()) and not torch.equal(kept, full)
    _no_further_from_the_recurrence(windowed, whole, inputs, 0.25, cu=cu, slack=1e-7)


@pytest.mark.cpu_only
def test_triton_segment_windows_carry_a_nan_and_skip_a_growing_beta(monkeypatch: pytest.MonkeyPatch) -> None:
    # A NaN k at token 100 (the first segment's, long before its window): every later output of the value
    # heads reading it NaN, as without the windows (its transition stored as NaN). beta = 2.2 (|1 - beta| = 1.2
    # a token, 2^16.8 a chunk against 2^-5.5 of gates): no window, the same bits as without.
    inputs = _steady_gates(make_inputs(1, 48 * 64, 1, 2, 16, 16, torch.float32), -0.06)
    poisoned = (*inputs[:1], inputs[1].clone(), *inputs[2:])
    poisoned[1][0, 100, 0, 3] = float("nan")
    (windowed, kept), (whole, _) = _windowed_and_whole(monkeypatch, poisoned, 4)
    assert bool(torch.isnan(kept[0]).all()) and torch.equal(torch.isnan(windowed[0]), torch.isnan(whole[0]))
    assert bool(torch.isnan(windowed[0][0, 100:]).all()) and bool(torch.isfinite(windowed[0][0, :100]).all())
    growing = (*inputs[:4], torch.full_like(inputs[4], 2.2))
    (windowed, kept), (whole, full) = _windowed_and_whole(monkeypatch, growing, 4)
    assert torch.equal(kept[:3], full[:3]) and torch.equal(windowed[0], whole[0])


@pytest.mark.gpu
@pytest.mark.parametrize("gate", ["random", "slow", "zero", "mixed"])
def test_gpu_segment_windows(gpu_device: str, monkeypatch: pytest.MonkeyPatch, gate: str) -> None:
    # 1 x 16384 tokens in 4 segments of 64 chunks (2 qk / 8 v heads): with launch.SEGMENT_WINDOWS each
    # segment-state program runs only the last chunks over which its gates decay the rest below 2^-30 and
    # stores a zero transition. random (logsigmoid(randn), about -0.8 a token): every segment but the last
    # takes a window, its transitions zero, and the outputs are as near the fp64 recurrence as the whole
    # segments' (not the same bits: the state handed on is formed another way). slow (about -0.02 a token,
    # about 18 chunks to 2^-30) too, within WINDOW_CHUNKS. zero: no window anywhere, the transitions the same bits
    # as without, the outputs as near the recurrence (the output programs scan from the initial state, where
    # without the windows the combine pass does). mixed: the zero gates on half the value heads, those as zero.
    _needs_register_state_passes(gpu_device)
    inputs = make_inputs(1, 16384, 2, 8, 128, 128, torch.bfloat16, gate="zero" if gate == "zero" else
                         "slow" if gate == "slow" else "random", device=gpu_device)
    if gate == "mixed":
        inputs[3][:, :, 4:] = 0.0
    h0 = torch.randn(1, 8, 128, 128, device=gpu_device)
    (windowed, kept), (whole, full) = _windowed_and_whole(monkeypatch, inputs, 4, h0)
    still = slice(0, 8) if gate == "zero" else slice(4, 8) if gate == "mixed" else slice(0, 0)
    decaying = slice(0, 0) if gate == "zero" else slice(0, 4) if gate == "mixed" else slice(0, 8)
    if gate in ("zero", "mixed"):
        assert torch.equal(kept[:3, still], full[:3, still]) and bool(full[:3, still].abs().amax() > 0)
    assert bool((kept[:3, decaying] == 0).all()), "a segment with decaying gates kept its transition"
    exact = naive_recurrent_gated_delta_rule(*(t.double() for t in inputs), 128**-0.5, h0.double(), True, None, False)
    for got_all, want_all, oracle_all, heads in zip(windowed, whole, exact, (2, 1), strict=True):
        for part in (still, decaying):
            got, want, oracle = (t.narrow(heads, part.start, part.stop - part.start)
                                 for t in (got_all, want_all, oracle_all))
            if got.numel():
                assert relative_rms_error(got, oracle) < BOUND[torch.bfloat16]
                assert relative_rms_error(got, oracle) <= 1.1 * relative_rms_error(want, oracle)


@pytest.mark.gpu
@pytest.mark.parametrize("initial", [False, True])
@pytest.mark.parametrize("gate", ["random", "slow", "mixed"])
def test_gpu_segment_windows_scanned_by_the_output_pass(gpu_device: str, monkeypatch: pytest.MonkeyPatch,
                                                       gate: str, initial: bool) -> None:
    # launch.HOPPER_SCAN_WINDOWS: no combine pass; each output program finds the last segment before its own whose
    # window dropped its past and takes its state from there. Where every segment takes a window (random, slow),
    # that is the state the combine pass forms from a zero transition, and a first segment's is the initial state:
    # the same bits as with the combine pass. mixed: the heads that never forget scan every segment's transition
    # (from the initial state, where there is one), as the combine pass does, in another kernel. Every head as near
    # the fp64 recurrence as the cut without windows.
    from polykernels.gated_delta_rule import launch

    _needs_register_state_passes(gpu_device)
    inputs = make_inputs(1, 16384, 2, 8, 128, 128, torch.bfloat16, gate="slow" if gate == "slow" else "random",
                         device=gpu_device)
    if gate == "mixed":
        inputs[3][:, :, 4:] = 0.0
    h0 = torch.randn(1, 8, 128, 128, device=gpu_device) if initial else None
    cut = (128**-0.5, h0, True, None, False, 4)
    scanned = launch_chunk_gated_delta_rule(*inputs, *cut)
    monkeypatch.setattr(launch, "HOPPER_SCAN_WINDOWS", False)
    combined = launch_chunk_gated_delta_rule(*inputs, *cut)
    monkeypatch.setattr(launch, "SEGMENT_WINDOWS", False)
    monkeypatch.setattr(launch, "HOPPER_LEAD_SEGMENT", {})
    whole = launch_chunk_gated_delta_rule(*inputs, *cut)
    decaying = slice(0, 4) if gate == "mixed" else slice(0, 8)
    assert torch.equal(scanned[0][..., decaying, :], combined[0][..., decaying, :])
    assert torch.equal(scanned[1][:, decaying], combined[1][:, decaying])
    _no_further_from_the_recurrence(scanned, whole, inputs, 128**-0.5, h0)


@pytest.mark.gpu
@pytest.mark.parametrize("initial", [False, True])
def test_gpu_segment_windows_of_packed_sequences(gpu_device: str, monkeypatch: pytest.MonkeyPatch,
                                                 initial: bool) -> None:
    # The bench's varlen 6144 + 2048 (2 qk / 8 v heads) in segments of 16 chunks: zero transitions where the
    # gates decay, as near the fp64 recurrence as the cut without windows (whose segment states run in the
    # shared-state pass there: not the same kernels, so no bits compared); with each sequence's initial state too.
    _needs_register_state_passes(gpu_device)
    lengths = [6144, 2048]
    inputs = make_inputs(1, sum(lengths), 2, 8, 128, 128, torch.bfloat16, device=gpu_device)
    cu = boundaries(lengths, gpu_device, torch.int32)
    h0 = torch.randn(2, 8, 128, 128, device=gpu_device) if initial else None
    (windowed, kept), (whole, _) = _windowed_and_whole(monkeypatch, inputs, None, h0, cu=cu)
    # Slots (kernels._first_slot): the first sequence's six segments 0-5, the second's two 7-8; each last none.
    assert bool((kept[:5] == 0).all()) and bool((kept[7] == 0).all())
    _no_further_from_the_recurrence(windowed, whole, inputs, 128**-0.5, h0, cu)


@pytest.mark.gpu
@pytest.mark.parametrize(("lengths", "segments", "initial", "gate"), [
    ([1500, 0, 1, 700, 3000], 3, True, "slow"), ([1500, 0, 1, 700, 3000], 3, False, "random"),
    ([37, 2963], None, True, "random")],
    ids=["mixed-3seg-initial-slow", "mixed-3seg", "37+2963-planned-initial"])
def test_gpu_packed_sequences_take_the_windows(gpu_device: str, monkeypatch: pytest.MonkeyPatch, lengths: list[int],
                                               segments: int | None, initial: bool, gate: str) -> None:
    # Packed sequences with the windows and the output pass's scan (launch.HOPPER_PACKED_WINDOWS): sequences of one
    # segment (0, 1 and 37 tokens: the output program starts from the initial state and stores the final one), of
    # two and more; against the fp64 recurrence no further from it than the passes without the windows; the Python
    # path, the replayed launch program and a CUDA graph give the same bits; an empty sequence's final state is
    # its initial state. slow: segments of about 6 chunks, shorter than a window (about 17 chunks at these
    # gates), so every output program scans from the initial state through each transition before it; random: a
    # window in every segment.
    _needs_register_state_passes(gpu_device)
    from polykernels import platform
    from polykernels.gated_delta_rule import launch

    inputs = make_inputs(1, sum(lengths), 2, 8, 128, 128, torch.bfloat16, gate=gate, device=gpu_device)
    cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=gpu_device)
    h0 = torch.randn(len(lengths), 8, 128, 128, device=gpu_device) if initial else None

    def public():
        return chunk_gated_delta_rule(*inputs, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                                      num_segments=segments)

    first, replayed = public(), public()
    recipe = launch._recipe(inputs[0].shape, inputs[2].shape, torch.bfloat16, torch.int32, len(lengths), initial,
                            True, False, segments, inputs[0].device, platform.current(), *_tables_here(128))
    assert recipe.segment_windows and recipe.after_windows and not recipe.lead and recipe.segment_chunks
    captured = _replayed_from_a_graph(public)
    for got in (replayed, captured):
        assert torch.equal(got[0], first[0]) and torch.equal(got[1], first[1])
    if h0 is not None and 0 in lengths:  # an empty sequence's final state is its initial state
        assert torch.equal(first[1][lengths.index(0)], h0[lengths.index(0)])
    monkeypatch.setattr(launch, "SEGMENT_WINDOWS", False)
    monkeypatch.setattr(launch, "HOPPER_LEAD_SEGMENT", {})
    without = launch_chunk_gated_delta_rule(*inputs, 128**-0.5, h0, True, cu, False, segments)
    _no_further_from_the_recurrence(first, without, inputs, 128**-0.5, h0, cu, factor=1.5)


def _windowed_pairs_and_without(monkeypatch: pytest.MonkeyPatch, inputs, h0=None):
    """(the op with launch.HOPPER_WINDOWED_PAIRS as the plan takes it, the same call without the form), each the
    Python path's; checks the first ran the pairs cut into segments, their states windowed, scanned by the pairs."""
    from polykernels import platform
    from polykernels.gated_delta_rule import launch

    def public():
        return chunk_gated_delta_rule(*inputs, initial_state=h0, output_final_state=True)

    monkeypatch.setattr(launch, "HOPPER_WINDOWED_PAIRS", {64: 16})
    recipe = launch._recipe(inputs[0].shape, inputs[2].shape, inputs[0].dtype, None, inputs[0].shape[0],
                            h0 is not None, True, False, None, inputs[0].device, platform.current(),
                            *_tables_here(128))
    if recipe.plan.warpgroups != 2:
        pytest.skip(f"this GPU's {platform.sm_count(inputs[0].device)} SMs do not give these rows the least "
                    "segments of pairs in one wave, shorter than the one-tile programs'")
    cut = public()
    assert recipe.segment_chunks and recipe.from_v and recipe.after_windows
    torch.testing.assert_close(_replayed_from_a_graph(public)[0], cut[0], rtol=0, atol=0, equal_nan=True)
    monkeypatch.setattr(launch, "HOPPER_WINDOWED_PAIRS", {})
    return cut, public()


@pytest.mark.gpu
@pytest.mark.parametrize("initial", [False, True])
@pytest.mark.parametrize("gate", ["random", "slow", "mixed"])
def test_gpu_windowed_pairs_match_the_recurrence(gpu_device: str, monkeypatch: pytest.MonkeyPatch, gate: str,
                                                 initial: bool) -> None:
    # launch.HOPPER_WINDOWED_PAIRS: 1 x 16384 tokens at 2 qk / 8 v heads (eight pair programs), cut into sixteen
    # segments of 16 chunks; the segment states in FlashInfer's order from T and v, windowed; the pairs scanning back
    # to the last window and forming P. random gates: a window in every segment; slow: segments shorter than a
    # window (about 17 chunks), each scanned from the sequence's start; mixed: a quarter of the heads never forget,
    # their segment states whole and scanned. As near the fp64 recurrence as the plan without the
    # form, a CUDA graph's replay the same bits.
    _needs_register_state_passes(gpu_device)
    inputs = make_inputs(1, 16384, 2, 8, 128, 128, torch.bfloat16, gate="slow" if gate == "slow" else "random",
                         device=gpu_device)
    if gate == "mixed":
        inputs[3][:, :, :2] = 0.0
    h0 = torch.randn(1, 8, 128, 128, device=gpu_device) if initial else None
    cut, without = _windowed_pairs_and_without(monkeypatch, inputs, h0)
    _no_further_from_the_recurrence(cut, without, inputs, 128**-0.5, h0, factor=1.5)


@pytest.mark.gpu
def test_gpu_windowed_pairs_of_several_batch_rows(gpu_device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Two batch rows of 8192 tokens at 2 qk / 8 v heads (sixteen pair programs, eight segments each): each row's
    # segments, windows and initial state its own.
    _needs_register_state_passes(gpu_device)
    inputs = make_inputs(2, 8192, 2, 8, 128, 128, torch.bfloat16, device=gpu_device)
    h0 = torch.randn(2, 8, 128, 128, device=gpu_device)
    cut, without = _windowed_pairs_and_without(monkeypatch, inputs, h0)
    _no_further_from_the_recurrence(cut, without, inputs, 128**-0.5, h0, factor=1.5)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["q", "k", "v", "g", "beta"])
def test_gpu_nan_never_reaches_earlier_tokens_where_windowed_pairs_cut(gpu_device: str, monkeypatch: pytest.MonkeyPatch,
                                                                      name: str) -> None:
    # launch.HOPPER_WINDOWED_PAIRS at 1 x 16384 tokens, 2 qk / 8 v heads (sixteen segments of 16 chunks): a
    # non-finite input at token 3000 (the third segment's) never reaches an earlier token, and q only its own. k, g
    # and beta reach every later token (the prepare pass marks the chunk's decay, which the windows read); v the rest
    # of its segment at least: the prepare pass does not read v here, so a later window drops it with the past.
    _needs_register_state_passes(gpu_device)
    inputs = dict(zip(["q", "k", "v", "g", "beta"], make_inputs(1, 16384, 2, 8, 128, 128, torch.bfloat16,
                                                                device=gpu_device), strict=True))
    inputs[name][0, 3000, 0] = float("inf") if name == "v" else float("nan")
    (o, state), _ = _windowed_pairs_and_without(monkeypatch, tuple(inputs.values()))
    head = 0
    finite = torch.isfinite(o[0, :, head]).all(-1).cpu()
    assert finite[:3000].all() and not finite[3000]
    if name == "q":
        assert finite[3001:].all() and torch.isfinite(state).all()
    elif name == "v":
        assert not finite[3000:3072].any()  # its segment (tokens 2048-3071)
    else:
        assert not finite[3000:].any() and not torch.isfinite(state[0, head]).any()


def _windowed_packed_pairs_and_without(monkeypatch: pytest.MonkeyPatch, inputs, lengths: list[int], h0=None):
    """(the op with launch.HOPPER_WINDOWED_PACKED_PAIRS on packed sequences of ``lengths``, the same call without
    the form), each the Python path's; checks the first ran the pairs cut into segments, their states windowed and
    scanned by the pairs, and that the replayed launch program and a CUDA graph give its bits."""
    from polykernels import platform
    from polykernels.gated_delta_rule import launch

    cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=inputs[0].device)

    def public():
        return chunk_gated_delta_rule(*inputs, initial_state=h0, output_final_state=True, cu_seqlens=cu)

    monkeypatch.setattr(launch, "HOPPER_WINDOWED_PACKED_PAIRS", {64: 16})
    recipe = launch._recipe(inputs[0].shape, inputs[2].shape, inputs[0].dtype, torch.int32, len(lengths),
                            h0 is not None, True, False, None, inputs[0].device, platform.current(),
                            *_tables_here(128))
    if recipe.plan.warpgroups != 2:
        pytest.skip(f"this GPU's {platform.sm_count(inputs[0].device)} SMs do not give these sequences the least "
                    "segments of pairs in one wave")
    assert recipe.segment_chunks and recipe.from_v and recipe.after_windows and not recipe.lead
    cut, replayed = public(), public()
    for got in (replayed, _replayed_from_a_graph(public)):
        torch.testing.assert_close(got[0], cut[0], rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(got[1], cut[1], rtol=0, atol=0, equal_nan=True)
    monkeypatch.setattr(launch, "HOPPER_WINDOWED_PACKED_PAIRS", {})
    return cut, public(), cu


@pytest.mark.gpu
@pytest.mark.parametrize(("lengths", "heads", "gate", "initial"), [
    ([12288, 4096], (2, 8), "random", False), ([12288, 4096], (2, 8), "slow", True),
    ([12288, 4096], (2, 8), "mixed", True), ([12000, 0, 1, 700, 18000, 37], (1, 4), "random", True)],
    ids=["12288+4096", "12288+4096-slow-initial", "12288+4096-mixed-initial", "six-lengths-initial"])
def test_gpu_windowed_pairs_of_packed_sequences_match_the_recurrence(gpu_device: str, monkeypatch: pytest.MonkeyPatch,
                                                                    lengths: list[int], heads: tuple[int, int],
                                                                    gate: str, initial: bool) -> None:
    # launch.HOPPER_WINDOWED_PACKED_PAIRS: packed sequences cut into segments of pairs, their slots one wave
    # whatever the lengths (12288 + 4096 tokens at 2/8 heads: segments of 19 chunks). Sequences of one segment
    # (0, 1 and 37 tokens: the output program starts from the initial state and stores the final one), of two and
    # of many; slow gates (segments shorter than a window: every output program scans each transition before it);
    # mixed (a quarter of the heads never forget: their segment states whole). As near the fp64 recurrence as the
    # one-tile windows, the replayed program and a CUDA graph the same bits, an empty sequence's final state its
    # initial state.
    _needs_register_state_passes(gpu_device)
    qk_heads, value_heads = heads
    inputs = make_inputs(1, sum(lengths), qk_heads, value_heads, 128, 128, torch.bfloat16,
                         gate="slow" if gate == "slow" else "random", device=gpu_device)
    if gate == "mixed":
        inputs[3][:, :, : value_heads // 4] = 0.0
    h0 = torch.randn(len(lengths), value_heads, 128, 128, device=gpu_device) if initial else None
    cut, without, cu = _windowed_packed_pairs_and_without(monkeypatch, inputs, lengths, h0)
    if h0 is not None and 0 in lengths:
        assert torch.equal(cut[1][lengths.index(0)], h0[lengths.index(0)])
    _no_further_from_the_recurrence(cut, without, inputs, 128**-0.5, h0, cu, factor=1.5)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["q", "k", "v", "g", "beta"])
def test_gpu_nan_never_leaves_its_packed_sequence_where_windowed_pairs_cut(gpu_device: str,
                                                                          monkeypatch: pytest.MonkeyPatch,
                                                                          name: str) -> None:
    # launch.HOPPER_WINDOWED_PACKED_PAIRS at 12288 + 4096 tokens, 2/8 heads (segments of 19 chunks): a non-finite
    # input at token 1000 of the first sequence never reaches an earlier token nor the second sequence (its slots
    # the next ones), and q only its own token; k, g and beta every later token of the sequence and its final state;
    # v the rest of its segment (1216 tokens) at least.
    _needs_register_state_passes(gpu_device)
    inputs = dict(zip(["q", "k", "v", "g", "beta"], make_inputs(1, 16384, 2, 8, 128, 128, torch.bfloat16,
                                                                device=gpu_device), strict=True))
    head = 0
    inputs[name][0, 1000, head // 4 if name in ("q", "k") else head] = float("inf") if name == "v" else float("nan")
    (o, state), _, _ = _windowed_packed_pairs_and_without(monkeypatch, tuple(inputs.values()), [12288, 4096])
    finite = torch.isfinite(o[0, :, head]).all(-1).cpu()
    assert finite[:1000].all() and not finite[1000] and finite[12288:].all() and torch.isfinite(state[1]).all()
    if name == "q":
        assert finite[1001:12288].all() and torch.isfinite(state[0]).all()
    elif name == "v":
        assert not finite[1000:1216].any()  # its segment (tokens 0-1215)
    else:
        assert not finite[1000:12288].any() and not torch.isfinite(state[0, head]).any()


@pytest.mark.gpu
def test_gpu_segment_windows_carry_a_nan_before_the_window(gpu_device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A non-finite k at token 100 (the first segment's first chunk, far before its window): its value heads'
    # outputs from there on are NaN as without the windows (the dropped transition stored as NaN carries it).
    _needs_register_state_passes(gpu_device)
    inputs = make_inputs(1, 16384, 2, 8, 128, 128, torch.bfloat16, device=gpu_device)
    inputs[1][0, 100, 0] = float("nan")
    (windowed, kept), (whole, _) = _windowed_and_whole(monkeypatch, inputs, 4)
    assert torch.isnan(kept[0, :4]).all() and bool((kept[:3, 4:] == 0).all())
    assert torch.equal(torch.isnan(windowed[0]), torch.isnan(whole[0]))
    assert torch.isnan(windowed[0][0, 100:, :4]).all() and torch.isfinite(windowed[0][0, :100]).all()
    assert torch.isfinite(windowed[0][0, :, 4:]).all()


@pytest.mark.gpu
def test_gpu_segment_windows_not_taken_where_beta_grows_the_state(gpu_device: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # beta = 2.2 with ||k|| = 1: each token's factor may grow a state by 1.2, 2^0.26, more than gates of -0.005 a
    # token take off: no window, the same bits as without (and transitions of about e^-20, not 0 in fp32).
    _needs_register_state_passes(gpu_device)
    inputs = list(make_inputs(1, 16384, 2, 8, 128, 128, torch.bfloat16, device=gpu_device))
    inputs[3] = torch.full_like(inputs[3], -0.005)
    inputs[4] = torch.full_like(inputs[4], 2.2)
    (windowed, kept), (whole, full) = _windowed_and_whole(monkeypatch, inputs, 4)
    assert torch.equal(kept[:3], full[:3]) and bool(full[:3].abs().amax() > 0)
    assert torch.equal(windowed[0], whole[0]) and torch.equal(windowed[1], whole[1])


def _holds_as_the_lead_form(monkeypatch: pytest.MonkeyPatch, public, first, replayed, registered: list,
                            dependents: list[bool], inputs, h0, cu, segments: int | None) -> None:
    """The lead form's common checks: its launch program (the counters zeroed, then four launches, which of
    them programmatic dependents), the same bits from the Python path, the replayed program and a CUDA graph,
    and the fp64 recurrence no further from it than from the passes without the form."""
    from polykernels import _programs
    from polykernels._programs import Zero
    from polykernels.gated_delta_rule import launch

    if _programs.enabled():
        (steps,) = registered
        assert isinstance(steps[0], Zero) and len(steps) == 5
        assert [steps[i].launcher.described(steps[i].spec_key).dependent for i in range(1, 5)] == dependents
    captured = _replayed_from_a_graph(public)
    for got in (replayed, captured):
        assert torch.equal(got[0], first[0]) and torch.equal(got[1], first[1])
    key_dim = inputs[0].shape[-1]
    monkeypatch.setattr(launch, "HOPPER_LEAD_SEGMENT", {})
    without = launch_chunk_gated_delta_rule(*inputs, key_dim**-0.5, h0, True, cu, False, segments)
    _no_further_from_the_recurrence(first, without, inputs, key_dim**-0.5, h0, cu, factor=1.5)


@pytest.mark.gpu
@pytest.mark.parametrize(("lengths", "segments", "initial", "key_dim", "value_dim"), [
    ([1500, 0, 1, 700, 3000], 3, True, 128, 128), ([6144, 2048], None, False, 128, 128),
    ([37, 2963], 4, True, 64, 100)],
    ids=["mixed-3seg-initial", "6144+2048-planned", "K64-V100-4seg-initial"])
def test_gpu_packed_sequences_lead_segment(gpu_device: str, monkeypatch: pytest.MonkeyPatch, lengths: list[int],
                                           segments: int | None, initial: bool, key_dim: int, value_dim: int) -> None:
    # Packed sequences in the lead form (launch.HOPPER_LEAD_SEGMENT): each sequence's first segment through the
    # lead at its first slot, the passes after it numbering only the segments after each first. Sequences of one
    # segment (the lead stores their final state: 1 token, 0 tokens, 37 tokens), of two (no segment state) and
    # more, with 64-column V tiles (two packed sequences: three would take 32-column ones at V = 100); against the
    # fp64 recurrence no further from it than the passes without the form; the Python path, the replayed launch
    # program and a CUDA graph give the same bits. "planned": the plan's own segments (15 chunks on 132 SMs).
    _needs_register_state_passes(gpu_device)
    from polykernels import platform
    from polykernels.gated_delta_rule import launch

    monkeypatch.setattr(launch, "HOPPER_LEAD_SEGMENT", {64: 1})  # segments of any length
    monkeypatch.setattr(launch, "SEGMENT_WINDOWS", False)  # the lead form's plan
    inputs = make_inputs(1, sum(lengths), 2, 8, key_dim, value_dim, torch.bfloat16, device=gpu_device)
    cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=gpu_device)
    h0 = torch.randn(len(lengths), 8, key_dim, value_dim, device=gpu_device) if initial else None
    registered = _registered_programs(monkeypatch)

    def public():
        return chunk_gated_delta_rule(*inputs, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                                      num_segments=segments)

    first, replayed = public(), public()
    recipe = launch._recipe(inputs[0].shape, inputs[2].shape, torch.bfloat16, torch.int32, len(lengths), initial,
                            True, False, segments, inputs[0].device, platform.current(),
                            *_tables_here(key_dim))
    assert recipe.lead and not recipe.beside_prepare and recipe.lead_meta["VARLEN"]
    # The counters zeroed, then prepare, lead, segment states (dependent), outputs.
    _holds_as_the_lead_form(monkeypatch, public, first, replayed, registered, [False, False, True, False], inputs,
                            h0, cu, segments)
    if h0 is not None and 0 in lengths:  # an empty sequence's final state is its initial state
        assert torch.equal(first[1][lengths.index(0)], h0[lengths.index(0)])


@pytest.mark.gpu
def test_gpu_passes_run_one_after_the_other_when_the_device_serializes_launches(gpu_device: str) -> None:
    # CUDA_LAUNCH_BLOCKING=1 runs every launch to its end before the next: the sequential pass, which
    # waits for the flags of the prepare pass launched after it, would wait for ever. The plan keeps
    # the passes apart there (the call finishes, with the bits of the serial plan), in a shape that
    # runs them side by side otherwise.
    if torch.cuda.get_device_capability(gpu_device) != (9, 0):
        pytest.skip("the passes run side by side on sm_90 only")
    import os
    import subprocess
    import sys

    script = (
        "import torch\n"
        "from polykernels.gated_delta_rule import launch\n"
        "from polykernels.gated_delta_rule.launch import launch_chunk_gated_delta_rule\n"
        "from tests.unit.gated_delta_rule.test_chunk import make_inputs, ran_side_by_side\n"
        "inputs = make_inputs(1, 8192, 8, 32, 128, 128, torch.bfloat16, device='cuda')\n"
        "def call():\n"
        "    return launch_chunk_gated_delta_rule(*inputs, 128**-0.5, None, True, None, False)\n"
        "got = call()\n"
        "side_by_side = ran_side_by_side(launch)\n"
        "launch.HOPPER_CONCURRENT = {}\n"
        "want = call()\n"
        "print('side by side', side_by_side, 'equal', all(torch.equal(a, b) for a, b in zip(got, want)))\n"
    )
    env = {**os.environ, "CUDA_LAUNCH_BLOCKING": "1"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0 and "side by side False equal True" in done.stdout, (done.stdout,
                                                                                     done.stderr[-2000:])


@pytest.mark.gpu
@pytest.mark.parametrize(("tokens", "key_dim", "value_dim", "lengths", "dtype", "l2norm"), [
    (3000, 128, 128, None, torch.bfloat16, True),
    (2000, 64, 100, [700, 0, 1, 1299], torch.bfloat16, False),
    (2000, 128, 256, [64, 1000, 936], torch.float16, True),
    (1500, 128, 32, None, torch.bfloat16, False),
    (1000, 128, 128, None, torch.bfloat16, None)],
    ids=["K128-l2norm", "K64-V100-packed", "K128-V256-fp16-packed", "K128-V32", "K128-v-mid-row"])
def test_gpu_hopper_prepare_matches_the_triton_prepare(gpu_device: str, monkeypatch: pytest.MonkeyPatch, tokens: int,
                                                       key_dim: int, value_dim: int, lengths, dtype: torch.dtype,
                                                       l2norm: bool | None) -> None:
    # The Gluon prepare pass (sm_90) against the Triton one, the same sequential pass after both:
    # rows past each sequence's end, V narrower than its tile (100, 32) and two V tiles (256),
    # fp16, l2norm in the kernel, v starting off a 16-byte boundary (l2norm None: off, v moved).
    # Every other GPU test runs it too where it is the default.
    if torch.cuda.get_device_capability(gpu_device) != (9, 0):
        pytest.skip("the Gluon prepare pass runs on sm_90 only; the other GPU tests cover this GPU's pass")
    inputs = make_inputs(1, tokens, 2, 4, key_dim, value_dim, dtype, device=gpu_device, l2norm_outside=not l2norm)
    if l2norm is None:
        inputs, l2norm = (*inputs[:2], _starting_mid_row(inputs[2]), *inputs[3:]), False
    cu = None if lengths is None else boundaries(lengths, gpu_device)
    num_seqs = 1 if lengths is None else len(lengths)
    h0 = torch.randn(num_seqs, 4, key_dim, value_dim, device=gpu_device)

    def run():
        return launch_chunk_gated_delta_rule(*inputs, key_dim**-0.5, h0, True, cu, l2norm)

    # The Gluon pass scales the products where the Triton one scales (and rounds) their inputs: it
    # is held to the Triton pass's error against the fp64 recurrence, not to its bits.
    exact = naive_recurrent_gated_delta_rule(*(t.double() for t in inputs), key_dim**-0.5, h0.double(), True, cu,
                                             l2norm)
    _matches_with_the_pass_off(monkeypatch, run, "_hopper_prepare_launcher", "HOPPER_PREPARE", 1.1, exact)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("segments", [None, 2], ids=["whole", "2-segments"])
def test_gpu_nan_never_reaches_earlier_tokens(gpu_device: str, segments, dtype: torch.dtype) -> None:
    _nan_causality(lambda *a: launch_chunk_gated_delta_rule(*a, 0.2, None, True, None, False, segments), gpu_device,
                   range(130), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("beside_prepare", [False, True], ids=["after-prepare", "beside-prepare"])
def test_gpu_nan_never_reaches_earlier_tokens_across_a_lead_segment(gpu_device: str, monkeypatch: pytest.MonkeyPatch,
                                                                    beside_prepare: bool) -> None:
    # Three segments of six chunks (64-column tiles: a sequence of 18 chunks is cut anyway), the first
    # through the lead (launch.HOPPER_LEAD_SEGMENT, sm_90): a non-finite input in the first reaches the
    # later ones through the lead's end state, one in the second through the output programs' scan.
    # beside_prepare: the lead beside the prepare pass, its first segment the longer one (rates as in
    # test_gpu_lead_segment_beside_the_segment_states), each side of every boundary.
    _needs_register_state_passes(gpu_device)
    from polykernels import _programs, platform
    from polykernels.gated_delta_rule import launch

    monkeypatch.setattr(launch, "HOPPER_LEAD_SEGMENT", {64: 1})
    monkeypatch.setattr(launch, "SEGMENT_WINDOWS", False)  # the lead form's plan
    monkeypatch.setattr(launch, "HOPPER_LEAD_BESIDE_PREPARE", {64: HEAD_START} if beside_prepare else {})
    registered = _registered_programs(monkeypatch)
    inputs = make_inputs(1, 1100, 1, 1, 64, 64, torch.bfloat16, device=gpu_device)
    chunk_gated_delta_rule(*inputs, output_final_state=True, num_segments=3)
    if _programs.enabled():  # the counters zeroed and four launches: the lead form
        assert len(registered[0]) == 5
    recipe = launch._recipe(inputs[0].shape, inputs[2].shape, torch.bfloat16, None, 1, False, True, False, 3,
                            inputs[0].device, platform.current(), *_tables_here(64))
    rest = recipe.segment_tokens
    first = 18 * 64 - 2 * rest if beside_prepare else rest  # 1100 tokens: 18 chunks
    assert recipe.beside_prepare is beside_prepare and (first > rest) is beside_prepare
    _nan_causality(lambda *a: launch_chunk_gated_delta_rule(*a, 0.2, None, True, None, False, 3), gpu_device,
                   [0, 100, first - 1, first, first + rest - 1, first + rest, 1099], torch.bfloat16, dim=64,
                   tokens=1100)


@pytest.mark.gpu
def test_gpu_nan_never_reaches_earlier_tokens_across_a_packed_lead_segment(gpu_device: str,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # The same sequence given as packed (cu_seqlens): the lead at its first slot, the passes after it numbering
    # the segments after the first, three segments of six chunks; each side of every boundary.
    _needs_register_state_passes(gpu_device)
    from polykernels import platform
    from polykernels.gated_delta_rule import launch

    monkeypatch.setattr(launch, "HOPPER_LEAD_SEGMENT", {64: 1})
    monkeypatch.setattr(launch, "SEGMENT_WINDOWS", False)  # the lead form's plan
    cu = torch.tensor([0, 1100], dtype=torch.int32, device=gpu_device)
    recipe = launch._recipe(torch.Size([1, 1100, 1, 64]), torch.Size([1, 1100, 1, 64]), torch.bfloat16, torch.int32,
                            1, False, True, False, 3, torch.device(gpu_device), platform.current(),
                            *_tables_here(64))
    rest = recipe.segment_tokens
    assert recipe.lead and recipe.lead_meta["VARLEN"] and rest == 6 * 64
    _nan_causality(lambda *a: launch_chunk_gated_delta_rule(*a, 0.2, None, True, cu, False, 3), gpu_device,
                   [0, 100, rest - 1, rest, 2 * rest - 1, 2 * rest, 1099], torch.bfloat16, dim=64, tokens=1100)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_gpu_nan_never_reaches_earlier_tokens_where_pairs_form_v_new(gpu_device: str, monkeypatch: pytest.MonkeyPatch,
                                                                   dtype: torch.dtype) -> None:
    # K = V = 128 on a GPU of one SM: the register-state pairs (launch.HOPPER_PAIRS_FROM_V on sm_90), where
    # the sequential pass reads v itself and a non-finite v row takes the checked rerun.
    from polykernels import platform

    monkeypatch.setattr(platform, "sm_count", lambda device: 1)
    _nan_causality(lambda *a: launch_chunk_gated_delta_rule(*a, 0.2, None, True, None, False, None), gpu_device,
                   NAN_POSITIONS, dtype, dim=128)


@pytest.mark.gpu
@pytest.mark.parametrize("packed", [False, True], ids=["batched", "cu_seqlens"])
def test_gpu_capturable_in_a_cuda_graph(gpu_device: str, packed: bool) -> None:
    # No host-built tables and no host synchronization: a CUDA graph replays the op.
    inputs = make_inputs(1, 4096, 2, 8, 128, 128, torch.bfloat16, device=gpu_device)
    cu = torch.tensor([0, 1000, 4096], device=gpu_device) if packed else None
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        chunk_gated_delta_rule(*inputs, cu_seqlens=cu, output_final_state=True)  # compile outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = chunk_gated_delta_rule(*inputs, cu_seqlens=cu, output_final_state=True)
    inputs[2].mul_(2)  # new values, same buffers
    graph.replay()
    want = chunk_gated_delta_rule(*inputs, cu_seqlens=cu, output_final_state=True)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.gpu
def test_gpu_eager_calls_with_one_cu_seqlens_synchronize_once(gpu_device: str) -> None:
    # The first call reads cu_seqlens' values (and compiles); later calls with the same tensor do not
    # wait for the GPU: torch raises on any synchronizing operation in this mode.
    inputs = make_inputs(1, 4096, 2, 8, 128, 128, torch.bfloat16, device=gpu_device)
    cu = torch.tensor([0, 1000, 4096], device=gpu_device)
    want = chunk_gated_delta_rule(*inputs, cu_seqlens=cu, output_final_state=True)
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = chunk_gated_delta_rule(*inputs, cu_seqlens=cu, output_final_state=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_offsets_past_2_pow_31_elements(gpu_device: str) -> None:
    # HV = 32, K = V = 128: q, k, v and o pass 2^31 elements beyond 524,288 tokens, on the whole,
    # segmented (context-parallel), wide-tile and planned paths (on an sm_90 of 132 SMs the planned one cuts
    # the sequence into windowed pairs), as planned for 100 SMs (on sm_90 the pairs beside the prepare pass), and as
    # one packed sequence planned for 200 SMs (on sm_90 the packed sequences' windowed pairs). The oracle needs no
    # dense reference: the same sequence in pieces chained through final_state -> initial_state must give the same
    # output and state. It runs in a process of its own: a fault there (an offset that wraps) would leave this
    # worker's CUDA context unusable for every test after it.
    import json
    import subprocess
    import sys
    from pathlib import Path

    # (python -m puts the repository root, its working directory, on the path for `benchmarks`.)
    run = subprocess.run([sys.executable, "-m", "benchmarks.gdn_large_index"], check=False,
                         cwd=Path(__file__).resolve().parents[3], capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["elements"] > 2**31 and result["segments"] > 1
    assert result["o_error"] < 5e-3 and result["state_error"] < 5e-3, result


@pytest.mark.slow
@pytest.mark.parametrize("target", ["hip:gfx942", "hip:gfx950"])
def test_kernels_compile_for_amd(target: str) -> None:
    # MI300X / MI355X code objects from this CPU: every kernel of the op but the Gluon passes for
    # sm_90 (wgmma), which the guard keeps off AMD targets.
    from polykernels.kernel_registry import kernels, probe

    family = [name for name in kernels() if name.startswith("gdn_")]
    names = [name for name in family if kernels()[name].allowed_on(target)]
    assert set(family) - set(names) == {"gdn_recurrence_hopper", "gdn_segment_state_hopper", "gdn_prepare_hopper",
                                        "gdn_recurrence_hopper_wide", "gdn_segment_state_hopper_wide",
                                        "gdn_recurrence_hopper_rs", "gdn_recurrence_hopper_rs_pair",
                                        "gdn_prepare_hopper_concurrent", "gdn_prepare_hopper_concurrent_warp",
                                        "gdn_recurrence_hopper_rs_concurrent", "gdn_segment_state_hopper_rs",
                                        "gdn_prepare_hopper_t", "gdn_prepare_hopper_t_concurrent",
                                        "gdn_recurrence_hopper_rs_pair_from_v",
                                        "gdn_recurrence_hopper_rs_pair_from_v_concurrent",
                                        "gdn_prepare_hopper_t_concurrent_packed",
                                        "gdn_recurrence_hopper_rs_pair_from_v_concurrent_packed",
                                        "gdn_prepare_hopper_t_scores", "gdn_recurrence_hopper_rs_pair_from_v_scores",
                                        "gdn_recurrence_hopper_rs_lead",
                                        "gdn_segment_state_hopper_rs_after_lead",
                                        "gdn_recurrence_hopper_rs_after_lead",
                                        "gdn_recurrence_hopper_rs_lead_beside_prepare",
                                        "gdn_segment_state_hopper_rs_after_lead_beside_prepare",
                                        "gdn_recurrence_hopper_rs_after_lead_beside_prepare",
                                        "gdn_recurrence_hopper_rs_lead_packed",
                                        "gdn_segment_state_hopper_rs_after_lead_packed",
                                        "gdn_recurrence_hopper_rs_after_lead_packed",
                                        "gdn_prepare_hopper_growth", "gdn_segment_state_hopper_rs_window",
                                        "gdn_recurrence_hopper_rs_after_windows",
                                        "gdn_recurrence_hopper_rs_after_windows_packed",
                                        "gdn_prepare_hopper_t_scores_growth",
                                        "gdn_segment_state_hopper_rs_pair_from_v_window",
                                        "gdn_recurrence_hopper_rs_pair_from_v_scores_after_windows",
                                        "gdn_prepare_hopper_t_scores_growth_packed",
                                        "gdn_segment_state_hopper_rs_pair_from_v_window_packed",
                                        "gdn_recurrence_hopper_rs_pair_from_v_scores_after_windows_packed",
                                        "gdn_recurrence_hopper_rs_pair_from_v_scores_tma",
                                        "gdn_recurrence_hopper_rs_pair_from_v_scores_after_windows_tma",
                                        "gdn_recurrence_hopper_rs_pair_from_v_scores_after_windows_packed_tma"}
    assert set(names) == {"gdn_prepare", "gdn_recurrence", "gdn_segment_state", "gdn_recurrence_wide",
                          "gdn_segment_state_wide", "gdn_combine", "gdn_recurrence_fp32", "gdn_prepare_fp32",
                          "gdn_prepare_growth", "gdn_segment_state_window"}
    for kernel in names:
        result = probe(kernel, target)
        assert result.compiled and result.consistent, result.detail
        # What Triton checks at launch, read here: gfx942 gives a program 64 KiB of shared memory.
        assert result.resources["shared_bytes"] <= result.resources["shared_limit"], result.detail
        if kernel == "gdn_recurrence" and target == "hip:gfx942":
            # The H200's three stages of chunk tiles need 120 KiB: the launch keeps what fits.
            assert result.resources["num_stages"] < kernels()[kernel].options_on(target)["num_stages"], \
                result.detail


@pytest.mark.parametrize(
    ("backend", "arch", "expected"),
    [("cuda", "sm_90", "tf32"), ("rocm", "gfx942", "tf32"), ("rocm", "gfx950", "bf16x3"), ("cpu", None, "tf32")],
)
def test_dot_precision_follows_the_platform(backend: str, arch: str | None, expected: str) -> None:
    # gfx950 has no TF32 dots in Triton: asking for them fails the first compile on MI355X.
    from polykernels import platform
    from polykernels.gated_delta_rule.guards import dot_precision

    seen = platform.Platform(backend=backend, arch=arch, device_name=None, warp_size=32, runtime_version=None)
    with platform.use(seen):
        assert dot_precision(fp32_inputs=False) == expected
        assert dot_precision(fp32_inputs=True) == "ieee"


def test_inverse_products_round_to_bf16_for_16_bit_inputs_only(monkeypatch: pytest.MonkeyPatch) -> None:
    # fp32 inputs keep IEEE products (the spec's 1e-4 bound); the interpreter cannot multiply bf16.
    from polykernels.gated_delta_rule.guards import inverse_precision

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert inverse_precision(fp32_inputs=False) == "bf16"
    assert inverse_precision(fp32_inputs=True) == "ieee"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert inverse_precision(fp32_inputs=False) == "ieee"


@pytest.mark.parametrize(("backend", "arch", "expected"), [
    ("cuda", "sm_80", ("tf32x3", "tf32x3")), ("cuda", "sm_90", ("tf32x3", "tf32x3")),
    ("cuda", "sm_100", ("tf32x3", "tf32x3")), ("cuda", "sm_120", ("ieee", "tf32x3")),
    ("cuda", "sm_89", ("ieee", "tf32x3")), ("rocm", "gfx942", ("ieee", "ieee")), ("rocm", "gfx950", ("ieee", "ieee")),
    ("cpu", None, ("ieee", "ieee"))])
def test_prepare_products_of_fp32_inputs_in_three_tf32_passes_where_they_fit(
        monkeypatch: pytest.MonkeyPatch, backend: str, arch: str | None, expected: tuple[str, str]) -> None:
    # IEEE products in the prepare pass compile for minutes on NVIDIA (unrolled FMA dots); three
    # TF32 passes with K columns need 128 KiB of shared memory per program, which 99 KiB parts
    # lack (there the inverse's 64-column products alone take them).
    from polykernels import platform
    from polykernels.gated_delta_rule.guards import dot_precision, inverse_precision, prepare_precision

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    seen = platform.Platform(backend=backend, arch=arch, device_name=None, warp_size=32, runtime_version=None)
    with platform.use(seen):
        assert prepare_precision(fp32_inputs=True) == expected
        assert prepare_precision(fp32_inputs=False) == (dot_precision(fp32_inputs=False),
                                                        inverse_precision(fp32_inputs=False))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with platform.use(seen):
        assert prepare_precision(fp32_inputs=True) == ("ieee", "ieee")


def _compile_failure(name: str, constexprs: dict[str, int], target: str) -> str:
    """Compiles the registry's ``name`` with ``constexprs`` (merged over its own and its platform's) for
    ``target`` in a process of its own, as the compile matrix does (these tests run Triton's
    interpreter); asserts that it fails and returns its stderr."""
    import os
    import subprocess
    import sys

    code = (
        "import dataclasses; from polykernels import kernel_registry as r\n"
        f"spec = r.kernels()[{name!r}]; given = {constexprs!r}\n"
        "platform_given = lambda: {**(spec.platform_constexprs() if spec.platform_constexprs else {}), **given}\n"
        "changed = dataclasses.replace(spec, name='changed', constexprs={**spec.constexprs, **given},\n"
        "                              platform_constexprs=platform_given)\n"
        f"r.register(changed); r.compile_here('changed', {target!r})\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600,
                          check=False)
    assert done.returncode != 0, done.stdout[-2000:]
    return done.stderr


@pytest.mark.slow
def test_compile_matrix_fails_a_kernel_that_no_stage_count_fits() -> None:
    # fp32 state and value tiles of 256 x 128 need 128 KiB of shared memory with one stage: no
    # MI300X program (64 KiB) can launch it, and the matrix must say so on this CPU.
    stderr = _compile_failure("gdn_recurrence_fp32", {"K": 256, "BK": 256, "V": 256, "BV": 128, "NV": 2},
                              "hip:gfx942")
    assert ("needs 131072 bytes of shared memory per program even with one pipeline stage; hip:gfx942 has 65536"
            in stderr), stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gdn_recurrence_hopper_wide", "gdn_recurrence_hopper_rs"])
def test_hopper_passes_refuse_one_copy_stage(name: str) -> None:
    # With one stage the copies of the next chunk would land in the tiles the chunk's products are
    # reading: on the H200 the outputs went wrong (an inf against the two-stage pass) with no error.
    # A launch table set to 1 must fail to compile instead.
    stderr = _compile_failure(name, {"STAGES": 1}, "cuda:90")
    assert "STAGES must be at least 2" in stderr, stderr[-2000:]
