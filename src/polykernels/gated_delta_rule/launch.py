"""Launching the gated-delta-rule Triton kernels: the launch tables, the segment plan and one
cached recipe per class of call (what chunk.py's public op runs on GPUs).

The public op and its argument checks are in chunk.py; the kernels in kernels.py and
recurrence_kernels.py.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import types
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import NamedTuple

import torch

from polykernels import _programs, platform
from polykernels._programs import OutputPart, Scalar, Step, Zero
from polykernels._workspace import Layout
from polykernels.gated_delta_rule import guards

CHUNK = 64
MAX_HEAD_DIM = 256
# Offsets inside one chunk are int32 in the kernels (kernels._tile): a chunk of every head must
# span fewer than 2^31 elements, CHUNK x heads x max(K, V, CHUNK) (far above any model's heads).
MAX_VALUE_HEADS = (2**31 - 1) // (CHUNK * MAX_HEAD_DIM)

# Context parallelism (plan_segments): a sequence is cut when its sequential programs (N x HV x V
# tiles) fill at most half the SMs, into SMs // programs segments (one wave) of at least
# MIN_SEGMENT_CHUNKS chunks (each segment but the last also costs a pass over K transition columns).
# From the H200 sweeps (BENCHMARKS.md, "segments"): the best split gave about one program per SM.
MIN_SEGMENT_CHUNKS = 8
# The two passes side by side (plan_segments' concurrent_tiles) for sequences of at least this many
# chunks; shorter ones were not measured (their prepare pass may fit one wave on every SM).
CONCURRENT_MIN_CHUNKS = 128
# The same for the pairs beside the prepare pass (plan_segments' concurrent_pairs). Against the form after the
# prepare pass (one-tile programs or pairs) on an H100: B8 T1024 2/8 -7.4%, B8 T2048 -14.3%, B8 T4096 -18.1%
# (the same under slowly decaying gates), B8 T6144 2/8 -18.8%, B4 T2048 4/16 -14.1%, B2 T4096 8/32 -17.8%,
# B16 T1024 2/4 -12.5% (BENCHMARKS.md, "forty-first set"). From 8 chunks (B8 T512 2/8, B4 T512 4/16): +17% on an
# H200 (forty-second set).
CONCURRENT_PAIRS_MIN_CHUNKS = 16
WHOLE_SEQUENCE = 2**34  # chunks per segment when a sequence is not cut: more than any sequence has


def _block(dim: int) -> int:
    return max(16, 1 << (dim - 1).bit_length())


@dataclass(frozen=True, kw_only=True)
class SegmentPlan:
    """How each sequence is cut for context parallelism (``segments == 1``: not cut), and the V tile."""

    segments: int  # per sequence of average length (those that run: ceil(chunks / segment_chunks))
    segment_chunks: int  # chunks per segment
    block_v: int  # V columns per sequential program (per warpgroup where ``warpgroups`` is 2)
    reason: str
    warpgroups: int = 1  # 2: the register-state pass takes two neighbouring V tiles per program
    concurrent: bool = False  # the sequential pass runs beside the prepare pass, on SMs of its own
    lead: bool = False  # each sequence's first segment runs its output pass beside the others' segment states
    beside_prepare: bool = False  # ... and, launched first, beside the prepare pass too (HOPPER_LEAD_BESIDE_PREPARE)
    first_chunks: int = 0  # beside_prepare: the first segment's chunks, more than segment_chunks (0: not so)


def plan_segments(
    num_seqs: int, total_tokens: int, value_heads: int, sm_count: int, num_segments: int | None = None,
    *, key_dim: int = 128, value_dim: int = 128, register_tiles: Collection[int] = (),
    register_pairs: Collection[int] = (), concurrent_tiles: Mapping[int, int] | None = None,
    lead_tiles: Mapping[int, int] | None = None, lead_rates: LeadRates | None = None, packed: bool = False,
    block_vs: tuple[int, int] | None = None, concurrent_pairs: Collection[int] = (),
    windowed_pairs: Mapping[int, int] | None = None,
) -> SegmentPlan:
    """The V tile and the segments per sequence, from (N, HV, T, K, V, SMs).

    Wide V tiles (fewer programs re-reading each chunk's q, k, w) when the programs still fill
    the GPU twice over, or when even narrow ones would leave it half empty and the sequences are
    long enough to be cut anyway (there, on the H200, wide tiles with more segments beat narrow
    ones with fewer: 0.66 vs 0.75 ms at 1 x 32768 tokens x 8 value heads, BENCHMARKS.md); narrow
    ones otherwise. Then segments while the programs fill at most half the SMs.

    ``register_tiles``: the V tiles at which the device runs the sequential pass with the state in
    registers (sm_90, ``hopper_register_kernels``), which takes each chunk of 64 columns in about
    1.3x the time the narrow pass takes for 32: wide tiles then whenever narrow ones would need
    more waves of programs (BENCHMARKS.md, "thirteenth set"). ``register_pairs``: the V tiles at which
    that pass can also take two neighbouring tiles per program (two warpgroups, each chunk's tiles
    copied once for both), done for uncut sequences where the pairs still fill every SM.
    ``concurrent_tiles``: the V tiles at which that pass can run beside the prepare pass, waiting for
    each chunk's ready flag (batch rows; packed sequences with HOPPER_CONCURRENT_PACKED), each with the
    tiles one program takes there: taken for uncut sequences of at least CONCURRENT_MIN_CHUNKS chunks
    whose wide-tile programs leave at least half the SMs to the prepare pass (B1 T32768 with 32 value
    heads: 64 programs where 32-column tiles made 128 that ran after the prepare pass).
    ``concurrent_pairs``: the V tiles at which two neighbouring tiles per program (two warpgroups) can run
    beside the prepare pass, taken where one tile per program would leave it fewer than half the SMs and
    the pairs do not (1 x 8192 with 64 value heads: 64 pair programs where there were 128).
    ``lead_tiles``: the V tiles at which the device can run a cut sequence's first segment (whose
    initial state is known) as an output pass beside the segment-state pass of its other segments
    (``lead``), each with the least chunks per segment it is taken for: the output pass after them then
    holds one segment fewer, so each sequence takes one segment more in the same wave, each shorter (the
    form is taken only where it buys that segment, or where ``num_segments`` forces the count). With
    K = V the segment-state pass holds as many SMs as before (its two programs per SM, one value and one
    transition tile per output program). ``packed``: the sequences are packed (``cu_seqlens``), of
    lengths the plan does not know: the lead form's segments are then the shortest whose later
    segments fill one wave whatever the lengths (``_packed_lead_chunks``).
    ``lead_rates``: where the lead form can also start beside the prepare pass (HOPPER_LEAD_BESIDE_PREPARE):
    taken where those rates estimate it at least LEAD_BESIDE_GAIN shorter (``_lead_beside_prepare``), with
    the first segment the longer one. ``block_vs``: the (wide, narrow) V tiles of the device's arch
    (``triton_pass_launches``; default: RECURRENCE_BLOCK_V's). ``windowed_pairs``: the V tiles at which
    sequences can be cut into segments of pairs whose states take the gates' windows, each with its least chunks
    per segment (HOPPER_WINDOWED_PAIRS, HOPPER_WINDOWED_PACKED_PAIRS): taken, where no count is forced, where one
    wave of pairs makes at least WINDOWED_PAIRS_MIN_SEGMENTS segments of those chunks per sequence (packed ones:
    of the average length, in the shortest segments whose slots make one wave whatever the lengths), shorter
    than the one-tile programs' segments would be.
    """
    chunks = max(1, -(-total_tokens // num_seqs // CHUNK))
    wide, narrow = block_vs or RECURRENCE_BLOCK_V[_block(key_dim)]
    wide, narrow = min(wide, _block(value_dim)), min(narrow, _block(value_dim))
    wide_programs = num_seqs * value_heads * -(-value_dim // wide)
    narrow_programs = num_seqs * value_heads * -(-value_dim // narrow)
    cut_anyway = 2 * narrow_programs <= sm_count and chunks >= 2 * MIN_SEGMENT_CHUNKS
    wide_anyway = wide_programs >= 2 * sm_count or cut_anyway
    wide_waves, narrow_waves = -(-wide_programs // sm_count), -(-narrow_programs // sm_count)
    fewer_waves = wide in register_tiles and wide_waves < narrow_waves
    block_v = wide if wide_anyway or fewer_waves else narrow
    programs = num_seqs * value_heads * -(-value_dim // block_v)
    pair_least = (windowed_pairs or {}).get(wide)
    if pair_least and wide in register_pairs and num_segments is None and value_dim > wide:
        per_segment = value_heads * -(-value_dim // (2 * wide))  # pair programs
        if packed:
            windowed = _packed_windowed_pairs(num_seqs, total_tokens, per_segment, sm_count, pair_least) or 0
            count = chunks // windowed if windowed else 0  # whole segments of an average sequence
        else:
            count = min(sm_count // (num_seqs * per_segment), chunks // pair_least)
            windowed = -(-chunks // count) if count else 0
        # ... where the one-tile programs (below, the windows' plan) would run longer segments: where they are as
        # short, their chains are the faster (B1 T4096 2/8: eight of 8 chunks either way, the pairs +15%).
        one_tile = 1 if 2 * programs > sm_count else max(1, min(sm_count // programs, chunks // MIN_SEGMENT_CHUNKS))
        if count >= WINDOWED_PAIRS_MIN_SEGMENTS and windowed < -(-chunks // one_tile):
            count = -(-chunks // windowed)
            how = (f"{per_segment} sequential programs of two {wide}-column tiles (HV x V/{2 * wide}) per segment "
                   f"for {sm_count} SMs: packed sequences in segments of {windowed} chunks, their slots one wave "
                   "whatever the lengths" if packed else
                   f"{num_seqs * per_segment} sequential programs of two {wide}-column tiles (N x HV x V/{2 * wide}) "
                   f"for {sm_count} SMs: {count} segments of {windowed} chunks per sequence")
            return SegmentPlan(segments=count, segment_chunks=windowed, block_v=wide, warpgroups=2, reason=how)
    least = (lead_tiles or {}).get(block_v)  # the lead form's least chunks per segment at this tile
    one_more = False  # the lead form takes the first segment out of the second wave: one segment more
    packed_chunks = 0  # packed sequences in the lead form: chunks per segment (_packed_lead_chunks)
    if num_segments is not None:
        segments, why = num_segments, f"{num_segments} segments per sequence requested"
    elif 2 * programs > sm_count:
        segments, why = 1, f"{programs} sequential programs (N x HV x V/{block_v}) for {sm_count} SMs: no split"
    else:
        # At most one wave: 9 segments of 16 programs (144 for 132 SMs) ran 18% slower than 8.
        segments = max(1, min(sm_count // programs, chunks // MIN_SEGMENT_CHUNKS))
        one_more = (least is not None and segments >= 2 and not packed
                    and -(-chunks // (segments + 1)) >= max(least, MIN_SEGMENT_CHUNKS))
        segments += int(one_more)
        why = (f"{programs} sequential programs (N x HV x V/{block_v}) for {sm_count} SMs: {segments} segments "
               f"of >= {MIN_SEGMENT_CHUNKS} chunks per sequence")
        if packed and least is not None and segments >= 2:
            # Packed sequences: their average length does not say how many segments run. Where the lead form's
            # bound gives shorter segments than the plan without it, the form buys them.
            shorter = _packed_lead_chunks(num_seqs, total_tokens, programs, sm_count, max(least, MIN_SEGMENT_CHUNKS))
            one_more = shorter is not None and shorter < -(-chunks // segments)
            if one_more:
                packed_chunks, segments = shorter, -(-chunks // shorter)
                why = (f"{programs} sequential programs (N x HV x V/{block_v}) for {sm_count} SMs: packed sequences "
                       f"in segments of {shorter} chunks, those after each sequence's first in one wave whatever the "
                       "lengths")
    if fewer_waves and not wide_anyway:
        why += (f"; {wide}-column V tiles: {wide_waves} wave(s) of register-state programs where {narrow}-column "
                f"ones take {narrow_waves}")
    segments = max(1, min(segments, chunks))
    group = min((concurrent_tiles or {}).get(wide, 0), -(-value_dim // wide))  # tiles per program
    beside_programs = num_seqs * value_heads * -(-value_dim // (wide * group)) if group else 0
    least_chunks = CONCURRENT_MIN_CHUNKS
    if not (group and 2 * beside_programs <= sm_count) and wide in concurrent_pairs and value_dim > wide:
        group, least_chunks = 2, CONCURRENT_PAIRS_MIN_CHUNKS
        beside_programs = num_seqs * value_heads * -(-value_dim // (2 * wide))
    if (segments == 1 and num_segments is None and group and 2 * beside_programs <= sm_count
            and chunks >= least_chunks):
        return SegmentPlan(segments=1, segment_chunks=chunks, block_v=wide, concurrent=True, warpgroups=group,
                           reason=(f"{beside_programs} sequential programs (N x HV x V/{wide * group}) on SMs of "
                                   f"their own beside the prepare pass on the other {sm_count - beside_programs}: "
                                   "no split"))
    pairs = num_seqs * value_heads * -(-value_dim // (2 * block_v))
    warpgroups = 1
    if (segments == 1 and block_v in register_tiles and block_v in register_pairs and value_dim > block_v
            and pairs >= sm_count):
        warpgroups = 2
        why += (f"; two {block_v}-column tiles per register-state program: {pairs} programs, each chunk's tiles "
                "copied once for both")
    segment_chunks = packed_chunks or -(-chunks // segments)
    count = -(-chunks // segment_chunks)  # what runs: fewer where whole chunks cannot make ``segments``
    if count != segments:
        why += f"; {count} segments of {segment_chunks} chunks run"
    # Only where it buys that segment (or a count is forced): with the count unchanged it was slower on the
    # H200 (1x2048 2/8, four segments of 8 chunks: +3%, BENCHMARKS.md "twenty-ninth set").
    lead = (least is not None and segment_chunks >= least and count >= 3 and (one_more or num_segments is not None))
    if not lead:
        return SegmentPlan(segments=count, segment_chunks=segment_chunks, block_v=block_v, reason=why,
                           warpgroups=warpgroups)
    beside = (_lead_beside_prepare(chunks, count, segment_chunks, num_seqs * chunks * value_heads, programs, sm_count,
                                   lead_rates) if lead_rates else None)
    if beside is None:
        why += "; the first segment's output pass beside the others' segment-state pass"
        return SegmentPlan(segments=count, segment_chunks=segment_chunks, block_v=block_v, reason=why,
                           warpgroups=warpgroups, lead=True)
    rest, estimate = beside
    first = chunks - (count - 1) * rest
    why += (f"; the first segment ({first} chunks) through its output pass beside the prepare pass, then beside the "
            f"others' segment-state pass ({count - 1} of {rest} chunks; {estimate})")
    return SegmentPlan(segments=count, segment_chunks=rest, block_v=block_v, reason=why, warpgroups=warpgroups,
                       lead=True, beside_prepare=True, first_chunks=first)


def _packed_windowed_pairs(num_seqs: int, total_tokens: int, per_segment: int, sm_count: int,
                           least_chunks: int) -> int | None:
    """Chunks per segment of packed sequences cut into windowed pairs: the fewest, at least ``least_chunks``,
    whose segment slots (at most ceil(tokens / segment tokens) + N, kernels._sequence_of) give one wave of
    ``per_segment`` programs each whatever the lengths; None where even one slot per sequence does not."""
    room = sm_count // per_segment - num_seqs  # slots beyond each sequence's first
    if room < 1:
        return None
    return max(least_chunks, -(-total_tokens // (CHUNK * room)))  # ceil(tokens / (CHUNK L)) <= room


def _packed_lead_chunks(num_seqs: int, total_tokens: int, programs: int, sm_count: int, least: int) -> int | None:
    """The lead form's chunks per segment for packed sequences of unknown lengths: the fewest (at least
    ``least``) whose segments after each sequence's first fit one wave of the output pass however the
    ``total_tokens`` are split (None where that would need segments longer than any sequence's).

    A sequence of l tokens takes ceil(l / s) segments of s tokens, so those after the first number at most
    (total_tokens - num_seqs) // s over all sequences; each takes programs // num_seqs programs (HV x V
    tiles). The segment-state pass beside the lead takes as many SMs (K = V: its two programs per SM, one
    value and one transition tile per output program)."""
    per_segment = max(1, programs // num_seqs)
    fits = sm_count // per_segment  # segments after the first, all sequences together, in one wave
    if fits < 1:
        return None
    # The least s with (total_tokens - num_seqs) // (CHUNK s) <= fits.
    chunks = max(least, (total_tokens - num_seqs) // (CHUNK * (fits + 1)) + 1)
    return chunks if chunks * CHUNK < total_tokens else None


class LeadRates(NamedTuple):
    """What HOPPER_LEAD_BESIDE_PREPARE's estimate reads, measured per K on one GPU (us, or us x SMs)."""

    prepare: float  # the prepare pass alone: us x SMs per (chunk, value head) program
    prepare_beside: float  # the same beside the lead (ready flags raised, the lead's copies beside it)
    first_ready: float  # us from the prepare pass's start until its first chunk is stored
    lead_beside: float  # us per chunk of the lead's chain beside the prepare pass (each chunk's flag awaited)
    lead: float  # us per chunk of the lead's chain beside the segment-state pass, and of the output pass's
    state: float  # us per chunk of the segment-state chain beside the lead


def _lead_beside_prepare(chunks: int, count: int, segment_chunks: int, prepare_programs: int, lead_programs: int,
                         sm_count: int, rates: LeadRates) -> tuple[int, str] | None:
    """The other segments' chunks where the lead form's first segment starts beside the prepare pass, and the
    estimate that says so (None where it is not estimated at least LEAD_BESIDE_GAIN shorter than the lead
    after the prepare pass).

    Three phases: the prepare pass (on the SMs the lead programs leave, where the lead runs each chunk once it
    is prepared), the lead's remaining chunks beside the other segments' states, the output pass of those.
    The first segment takes what the others leave."""
    if lead_programs >= sm_count:
        return None
    alone = prepare_programs * rates.prepare / sm_count  # the prepare pass on every SM, then the lead
    beside = prepare_programs * rates.prepare_beside / (sm_count - lead_programs)
    ahead = max(0.0, (beside - rates.first_ready) / rates.lead_beside)  # chunks the lead runs meanwhile
    before = alone + (max(rates.lead, rates.state) + rates.lead) * segment_chunks

    def estimate(rest: int) -> float:
        first = chunks - (count - 1) * rest
        return beside + max(rates.lead * (first - ahead), rates.state * rest) + rates.lead * rest

    best = min(range(1, segment_chunks + 1), key=estimate)
    if estimate(best) > (1 - LEAD_BESIDE_GAIN) * before:
        return None
    return best, f"estimated {estimate(best):.0f} us where the lead after the prepare pass takes {before:.0f}"


# Gluon is Triton's experimental layer: its API changes between releases. The Gluon kernels run
# with the Triton releases they were built and measured with; any other keeps the Triton kernels.
GLUON_TRITON_RELEASES = ("3.6",)


def hopper_pass(seen: platform.Platform, dtype: torch.dtype, key_dim: int) -> bool:
    """The sequential passes run hopper_kernels' Gluon kernel: sm_90 (wgmma), 16-bit inputs (fp32
    keeps the Triton pass's IEEE products), K of 64 or 128 (wgmma's 64-row products take the
    state's K rows whole), a Triton release of GLUON_TRITON_RELEASES, and the Gluon passes not turned
    off (gluon_allowed)."""
    return _gluon_built_for(seen, dtype, key_dim) and gluon_allowed()


def _gluon_built_for(seen: platform.Platform, dtype: torch.dtype, key_dim: int) -> bool:
    """hopper_pass without the switch (which _recipe takes as an argument, its cache key)."""
    return (seen.arch == "sm_90" and dtype in (torch.bfloat16, torch.float16) and key_dim in (64, 128)
            and _triton_release() in GLUON_TRITON_RELEASES)


def gluon_allowed() -> bool:
    """POLYKERNELS_GDN_GLUON=0: the Triton passes on sm_90 too, the ones every other target runs (to time
    them on a GPU at hand, or to step around a Gluon pass). Read per call: launch_tables passes it into
    the recipe, as part of its cache key."""
    return os.environ.get("POLYKERNELS_GDN_GLUON", "1") != "0"


@functools.cache
def _triton_release() -> str:
    """major.minor of the installed Triton ("" without one)."""
    try:
        import triton
    except ImportError:
        return ""
    return ".".join(triton.__version__.split(".")[:2])


@functools.cache
def _launchers() -> SimpleNamespace:
    from polykernels._launch import Launcher
    from polykernels.gated_delta_rule import kernels, recurrence_kernels

    return SimpleNamespace(
        prepare=Launcher(recurrence_kernels.gdn_prepare_kernel),
        recurrence=Launcher(recurrence_kernels.gdn_recurrence_kernel),
        combine=Launcher(kernels.gdn_combine_kernel),
    )


@functools.cache
def _hopper_launcher() -> object:
    """The Gluon sequential pass, imported on first use on sm_90 only (other Triton builds need not
    carry Gluon's NVIDIA modules)."""
    from polykernels._launch import Launcher
    from polykernels.gated_delta_rule import hopper_kernels

    return Launcher(hopper_kernels.gdn_recurrence_hopper_kernel)


@functools.cache
def _hopper_register_launcher() -> object:
    """The Gluon sequential pass with the state in registers, imported on first use on sm_90 only."""
    from polykernels._launch import Launcher
    from polykernels.gated_delta_rule import hopper_register_kernels

    return Launcher(hopper_register_kernels.gdn_recurrence_hopper_rs_kernel)


@functools.cache
def _hopper_prepare_launcher() -> object:
    """The Gluon prepare pass, imported on first use on sm_90 only."""
    from polykernels._launch import Launcher
    from polykernels.gated_delta_rule import hopper_prepare_kernels

    return Launcher(hopper_prepare_kernels.gdn_prepare_hopper_kernel)


def forget_launchers() -> None:
    """Drops every launcher and the kernels and launches each keeps (their choice of launch, Triton's
    or the extension's, is made once per class of call): the norms' ``forget_plans`` for this op."""
    for factory in (_launchers, _hopper_launcher, _hopper_register_launcher, _hopper_prepare_launcher):
        factory.cache_clear()


@functools.cache
def _unused_offsets(device: torch.device) -> torch.Tensor:
    """Stands for the offset tables of packed sequences in launches that do not read them."""
    return torch.zeros(1, dtype=torch.int64, device=device)


# The launch tables below are read-only: a sweep or a test replaces one (``launch.TABLE = {...}``),
# which moves ``configuration_version`` (the launch programs of this op are keyed by it).
configuration_version = 0


class _Configurable(types.ModuleType):
    """This module: every assignment to one of its attributes (a launch table replaced, a plan constant or a
    launcher factory patched) moves ``configuration_version``, so a launch program recorded before it is
    not replayed after it, and drops the cached recipes: the plan reads its constants (the least chunks of
    each form) from the module, not from the recipe's arguments."""

    def __setattr__(self, name: str, value: object) -> None:
        super().__setattr__(name, value)
        if name != "configuration_version":
            super().__setattr__("configuration_version", self.configuration_version + 1)
            clear = getattr(self.__dict__.get("_recipe"), "cache_clear", None)
            if clear is not None:
                clear()


sys.modules[__name__].__class__ = _Configurable

# The recurrence kernel per padded K: (wide, narrow) V tiles (plan_segments picks one), and
# (num_warps, num_stages): a K x BV fp32 state in registers, three stages of the chunk's q, k, w,
# u and scores in shared memory. The prepare kernel: its V tile and warps. Whole 64-row tiles
# (4 warps of 16 rows) compile without spills up to K = 128 on sm_90; K = 256 needs 8 warps.
# Chosen on the H200 (BENCHMARKS.md, "the two-pass design" and "whole-chunk prepare").
RECURRENCE_BLOCK_V: Mapping[int, tuple[int, int]] = types.MappingProxyType(
    {16: (64, 32), 32: (64, 32), 64: (64, 32), 128: (64, 32), 256: (32, 16)})
RECURRENCE_LAUNCH: Mapping[int, tuple[int, int]] = types.MappingProxyType(
    {16: (4, 3), 32: (4, 3), 64: (4, 3), 128: (4, 3), 256: (8, 1)})
PREPARE_LAUNCH: Mapping[int, tuple[int, int]] = types.MappingProxyType({64: (64, 4), 128: (128, 4), 256: (64, 8)})
# The same three tables per (GPU arch, K tile), where the entries above spill registers inside the Triton
# passes' chunk loop on that arch: such a spill is paid every chunk (on the H200 one took a pass from 386
# to 649 us, thirteenth set). No GPU of these kinds was here to time them. Each entry is the launch that
# compiles there with no spill instruction inside a loop, from a build-host sweep of 4, 8 and 16 warps,
# 1 to 3 stages and both V tiles (BENCHMARKS.md, "Launches per architecture"; one compile:
# `python -m polykernels.kernel_registry compile gdn_recurrence cuda:80`). Three stages are asked for;
# the launcher drops what shared memory cannot hold (the output pass on sm_86, sm_89 and sm_120).
# - At K = 128, 64-column V tiles spill in the output pass's loop at every launch tried on sm_80, sm_86,
#   sm_89 and sm_120, so those archs run the narrow tile only. The worst case was sm_80 at 4 warps and 3
#   stages: ptxas fell back to 32 registers and 6.3 KiB of stack per thread, 3,149 spill instructions in
#   the loop.
# - At K = 256, 32-column tiles spill in the loop on those archs at 8 and 16 warps: 16 columns there.
# - sm_121 compiles to the registers and spills of sm_120 at every launch swept (the cuobjdump Triton
#   ships cannot read its code to place the spills) and takes its entries; sm_103 matches sm_100.
# - sm_100 and sm_103 have none: their defaults spill outside loops only. (Entries of theirs, 8 warps and
#   64-column prepare tiles, came from a count that took sm_100's mbarrier wait stubs for loops; BENCHMARKS.md,
#   "(I + A)^-1 by block doubling".)
# The segment-state pass shares the output pass's launch.
_NARROW_ONLY = ("sm_80", "sm_86", "sm_89", "sm_120", "sm_121")
ARCH_RECURRENCE_BLOCK_V: Mapping[tuple[str, int], tuple[int, int]] = types.MappingProxyType(
    {**{(arch, 128): (32, 32) for arch in _NARROW_ONLY}, **{(arch, 256): (16, 16) for arch in _NARROW_ONLY}})
ARCH_RECURRENCE_LAUNCH: Mapping[tuple[str, int], tuple[int, int]] = types.MappingProxyType(
    {**{(arch, 64): (8, 3) for arch in _NARROW_ONLY}, **{(arch, 128): (8, 3) for arch in _NARROW_ONLY},
     **{(arch, 256): (8, 2) for arch in _NARROW_ONLY}})
ARCH_PREPARE_LAUNCH: Mapping[tuple[str, int], tuple[int, int]] = types.MappingProxyType({})
# The sequential passes' (num_warps, num_stages) for fp32 inputs per (GPU arch, K tile), where the entry above
# spills inside their chunk loop with fp32 tiles: on gfx950 (160 KiB of LDS) two stages of them fit at K = 128
# and both V tiles reload 9 and 66 values a chunk from scratch, at K = 64 three stages reload 2; one and two
# stages reload none (build host, `polykernels.loop_spills`; BENCHMARKS.md, "AMD spills inside loops").
# gfx942's 64 KiB hold one stage at K = 128 anyway. No such GPU was here to time them.
ARCH_FP32_RECURRENCE_LAUNCH: Mapping[tuple[str, int], tuple[int, int]] = types.MappingProxyType(
    {("gfx950", 64): (4, 2), ("gfx950", 128): (4, 1)})


def triton_pass_launches(arch: str | None, block_k: int, fp32_inputs: bool = False,
                         ) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    """(V tiles (wide, narrow), (num_warps, num_stages) of the sequential passes, (V tile, num_warps) of the
    prepare pass) of the Triton passes at K tile ``block_k`` on GPU arch ``arch``: the per-arch tables' entry
    where there is one (for fp32 inputs, ARCH_FP32_RECURRENCE_LAUNCH's first), else the default's."""
    prepare_k = max(block_k, PREPARE_MIN_BLOCK)
    key = (arch or "", block_k)
    sequential = ARCH_RECURRENCE_LAUNCH.get(key, RECURRENCE_LAUNCH[block_k])
    return (ARCH_RECURRENCE_BLOCK_V.get(key, RECURRENCE_BLOCK_V[block_k]),
            ARCH_FP32_RECURRENCE_LAUNCH.get(key, sequential) if fp32_inputs else sequential,
            ARCH_PREPARE_LAUNCH.get((arch or "", prepare_k), PREPARE_LAUNCH[prepare_k]))


# The sequential pass on sm_90 (hopper_kernels, 16-bit inputs, K of 64 or 128): cp.async stages per
# V tile, what fits 227 KiB of shared memory beside the state's tiles (two stages at the narrow tile
# measured 6-10% slower than three on the H200). An empty table turns the pass off.
HOPPER_STAGES: Mapping[int, int] = types.MappingProxyType({32: 3, 64: 2})
# The sequential pass on sm_90 with the state in registers (hopper_register_kernels; transposed,
# so its V tile is wgmma's 64 rows): cp.async stages per V tile. A V tile in this table runs it
# instead of hopper_kernels' pass.
HOPPER_REGISTER_STAGES: Mapping[int, int] = types.MappingProxyType({64: 3})
# Cut sequences too: their output pass runs the register-state pass where every segment has at least
# this many chunks, per V tile of HOPPER_REGISTER_STAGES (and their segment-state pass, where
# HOPPER_REGISTER_SEGMENT_STAGES holds the tile). On the H200 the output pass went 120 -> 101 us at
# 1x32768 2/8 (64 chunks per segment), the op -2.8 to -3.9% at 64 and 128 chunks per segment and +1.9% at
# 16 (varlen 6144+2048), BENCHMARKS.md "twenty-third set".
HOPPER_REGISTER_CUT: Mapping[int, int] = types.MappingProxyType({64: 64})
# Where the output pass of cut sequences runs the register-state pass, their segment-state pass does too,
# per V tile, with these cp.async stages (two: 81 KiB, two programs per SM as hopper_kernels' pass runs
# it); a tile not in this table keeps hopper_kernels' segment-state pass. On the H200 that pass went 101 ->
# 93.5 us at 1x32768 2/8, the op -1.5 to -2.3% more, the same bits (BENCHMARKS.md "twenty-third set").
HOPPER_REGISTER_SEGMENT_STAGES: Mapping[int, int] = types.MappingProxyType({64: 2})
# The same pass with two warpgroups per program, each holding one of two neighbouring V tiles' state:
# the chunk's q, k, w and P tiles are copied once for both (at B8 T4096 32/32 the one-warpgroup pass
# had L2 at 96% of its peak, ncu). Per V tile of HOPPER_REGISTER_STAGES: the stages the pair fits in
# shared memory. Taken where the pairs still fill every SM (plan_segments).
HOPPER_REGISTER_PAIRS: Mapping[int, int] = types.MappingProxyType({64: 2})
# The two passes side by side on sm_90 (plan_segments' concurrent_tiles): the register-state programs
# launched first, the Gluon prepare pass as their programmatic dependent on the SMs they leave, each
# chunk's ready flag between them (ready_flags). Per K of HOPPER_PREPARE it is done at (measured at
# 128): the register-state pass's 64-column tiles per program (one warpgroup each) and its cp.async
# stages there. An empty table turns it off. With several batch rows the prepare programs take every row's
# chunk c before any row's chunk c + 1 (kernels._ready_slot): on an H100 B2 T32768 16/16 1.468 -> 0.985 ms,
# B4 T8192 16/16 0.634 -> 0.386, the pairs at B2 T16384 16/32 1.123 -> 0.782 (BENCHMARKS.md, "thirty-eighth set").
HOPPER_CONCURRENT: Mapping[int, tuple[int, int]] = types.MappingProxyType({128: (1, 3)})
# Where one tile per program would leave the prepare pass fewer than half the SMs and two tiles per program
# would not (plan_segments' concurrent_pairs), per K: the register-state pass's stages with two 64-column
# tiles per program (two warpgroups) beside the prepare pass, in FlashInfer's order of the chain where
# HOPPER_PAIRS_FROM_V (only there). On an H100 at 1x8192 16/64: 0.448 -> 0.380 ms, both passes ending together
# (BENCHMARKS.md, "thirty-sixth set"); after the prepare pass the same pairs were 9.5% slower. An empty table
# turns it off.
HOPPER_CONCURRENT_PAIRS: Mapping[int, int] = types.MappingProxyType({128: 2})
# Where the register-state pass takes two tiles per program (uncut sequences whose pairs fill every SM)
# at K = 128: the prepare pass stores T = (I + A)^-1 diag(beta) and k's per-token factor in w's and u's
# places (no v read, no w or u formed) and the pass forms v_new = T (v - diag(factor) k h) itself,
# FlashInfer's order of the chain. On the H200 at B8 T4096 32/32: 0.854 -> 0.761 ms (prepare 462 -> 342
# us, sequential 366 -> 409); the one-warpgroup form lost (1x8192 16/64 +7%, 8x1024 +8%), BENCHMARKS.md
# "twenty-sixth set".
HOPPER_PAIRS_FROM_V = True
# Where those pairs run after the prepare pass (not beside it), they also form each chunk's scores P = q k^T
# (gated, scaled, causal) from the q and k tiles they copy anyway, from two exponents per token the prepare
# pass stores in P's place; the prepare pass forms no P and stores none (nor reads q, without the l2norm in
# the kernel). On an H100 at B8 T4096 32/32: 0.797 -> 0.761 ms (-4.5%; prepare 321 -> 255 us, pairs 478 ->
# 517), the same output bits. Beside the prepare pass (1x8192 16/64) the pairs' chain is the limit and P's
# bytes bought nothing even for free (a timing-only bound: +0.9%), so not there (BENCHMARKS.md,
# "thirty-seventh set").
HOPPER_PAIRS_SCORES = True
# ... and copy their tiles of T, k, q and v by TMA (hopper_register_kernels' TMA), where they copied them with
# cp.async, whose burst of 14 instructions a thread held up the loads on the state's path in the shared-memory queue.
# On an H100 against the cp.async form, two runs of two rounds: B1 T32768 32/32 -3.2% and -3.6%, B8 T4096 -1.1% and
# -0.8%, the same bits; the GPU tests of the pairs and the >2^31-element check pass with it (BENCHMARKS.md,
# "forty-fourth set"). Their scales come in one cp.async (hopper_register_kernels' ONE_COPY): on top of the three
# copies, B1 T32768 32/32 -0.8%, B8 T4096 -3.1%, the same bits ("forty-fifth set"); the >2^31-element check and 69
# of the pairs' GPU tests passed on it on an H200 ("forty-sixth set"). Each program's descriptors live in the workspace
# (TMA_SCRATCH_BYTES a program, handed to the kernel as Triton's global scratch by the launches and the launch
# programs).
HOPPER_PAIRS_TMA = True
# The global scratch a TMA program's descriptors take: 128 bytes each, four for a run of the chunk loop and four
# more for the checked rerun's.
TMA_SCRATCH_BYTES = 8 * 128
# Batch rows cut into one wave of the pairs (two 64-column tiles per program), on sm_90 where the pairs take
# HOPPER_PAIRS_FROM_V and HOPPER_PAIRS_SCORES and the segment states SEGMENT_WINDOWS with HOPPER_SCAN_WINDOWS: per
# V tile, the least chunks per segment (FlashQLA's context parallelism in our passes). The prepare pass runs alone
# on every SM storing T; the windowed segment states run in the same order of the chain (hopper_register_kernels'
# FROM_V without outputs); then the pairs, each scanning back to the last window and forming P. At B1 T32768 32/32
# that is 128 pair programs of 128 chunks where the one-tile programs beside the prepare pass ran 64 of 512. On an
# H100 against that form: B1 T32768 32/32 -41.6%, 16/32 -15.4%, B1 T131072 32/32 -43.9%; against the one-tile
# windows: 1x32768 2/8 -12.2%, 1x65536 2/8 -15.7%, 1x32768 4/16 -15.5%; under mixed gates (a quarter of the heads
# never forget) -26.3% and -7.0% (BENCHMARKS.md, "thirty-ninth set"). The least was 32 chunks there, which cut
# B1 T8192 2/8 into four segments where the one-tile windows ran eight: 16, and the pairs only where their
# segments are the shorter (plan_segments), measured against 32 and the one-tile windows under three families of
# gates: B1 T8192 2/8 keeps the one-tile windows (-45.2%, -40.6%, -46.3% against 32: fast, slow, mixed), B1 T16384
# 2/8 takes sixteen segments of 16 (-24.0%, -17.5%, -16.4%; the one-tile windows -14.8%, -13.8%, -18.3%),
# BENCHMARKS.md "fortieth set". An empty table turns it off.
HOPPER_WINDOWED_PAIRS: Mapping[int, int] = types.MappingProxyType({64: 16})
# ... where one wave of pairs makes this many segments or more: at 1x8192 16/64 two segments of 64 chunks were
# 12.1% slower than the pairs beside the prepare pass (H100); four and more were faster everywhere measured, three
# was not measured.
WINDOWED_PAIRS_MIN_SEGMENTS = 4
# Packed sequences (cu_seqlens) in the same form, per V tile the least chunks per segment. The plan cannot see
# the lengths, so the segments are the shortest whose slots make one wave of pairs whatever the lengths
# (_packed_windowed_pairs), taken where a sequence of the average length makes WINDOWED_PAIRS_MIN_SEGMENTS and
# they are shorter than the one-tile windows'. On an H100 against those (2/8 heads): 12288+4096 tokens in
# segments of 19 chunks -8.8% under the bench's gates, -7.0% slow, +1.1% mixed. A least of 8 took varlen
# 6144+2048 in segments of 10 where the one-tile windows run 16: -8.0% under the bench's gates but +27.0% slow
# and +10.2% mixed (segments shorter than a window), so 16, and that row keeps the one-tile windows
# (BENCHMARKS.md, "fortieth set"). An empty table turns it off.
HOPPER_WINDOWED_PACKED_PAIRS: Mapping[int, int] = types.MappingProxyType({64: 16})
# Packed sequences (cu_seqlens) beside the prepare pass too, by the batch rows' rules with their average length
# (plan_segments' chunks). Off: the plan cannot see how long the longest is, and that chain then bounds the op
# at the pairs' pace beside (about 2.9 us a chunk, where the one-tile pass after the prepare pass takes 1.55).
# On an H100 (with the pairs' least at 16 chunks): varlen 8x1024 2/8 -0.9%, 7168 + 7 x 128 tokens +64%
# (BENCHMARKS.md, "thirty-eighth set").
HOPPER_CONCURRENT_PACKED = False
# Cut sequences on sm_90, per V tile of HOPPER_REGISTER_STAGES and
# HOPPER_REGISTER_SEGMENT_STAGES, for segments of at least this many chunks: each sequence's first
# segment runs its output pass (the register-state pass) beside the segment-state pass of its other
# segments, as that launch's leader, and the sequence takes one segment more (plan_segments'
# lead_tiles); all three sequential passes are then the register-state pass's. On the H200 (2/8 heads)
# against the form without it: 1x32768 -3.8% (9 segments of 57 chunks), 1x16384 -7.0% (9 of 29), 1x8192
# -1.0% (9 of 15), 1x4096 +3% (9 of 8), BENCHMARKS.md "twenty-eighth set". Since the twenty-ninth set the
# output programs run the scan over segments themselves (no combine pass): 1x32768 2/8 -3.1% more,
# 1x65536 2/8 -2.5%, 1x32768 4/16 -2.0%; against the form without the lead, 1x8192 -9.8% (segments of
# 15 chunks), 1x6144 -11.6% (11), 1x4096 -7.0% (8), so from 8 chunks, MIN_SEGMENT_CHUNKS, where the form
# buys a segment. Since the thirty-first set packed sequences too (plan_segments' packed bound, the passes after
# the lead numbering only the segments after each sequence's first): varlen 6144+2048 2/8 -8.4% (segments of 15
# chunks where the form without it runs 16, and no combine pass). An empty table turns it off.
HOPPER_LEAD_SEGMENT: Mapping[int, int] = types.MappingProxyType({64: 8})
# Where launches may run side by side (concurrent_passes_allowed) and the prepare pass is the Gluon one, per
# K: the lead form's first segments start beside the prepare pass (their output pass launched first, waiting
# for each chunk's ready flag; the prepare pass its programmatic dependent on the other SMs; the segment-state
# pass the prepare pass's), the first segment the longer one, taken where these rates estimate it at least
# LEAD_BESIDE_GAIN shorter (plan_segments). Measured on the H200 at 2/8 heads (BENCHMARKS.md, "thirtieth
# set": the prepare pass 113 us for 4096 programs on 132 SMs alone, about 141 on the 116 the lead leaves; the
# lead 1.83 us per chunk beside it, 1.58 after it). There the form measured +0.6% at 1x32768 2/8 (estimated
# +0.8%: not taken), -0.3% at 1x65536 2/8 and -3.0% at 1x32768 4/16 (estimated -2%: taken). An empty table
# turns it off.
HOPPER_LEAD_BESIDE_PREPARE: Mapping[int, LeadRates] = types.MappingProxyType(
    {128: LeadRates(prepare=3.64, prepare_beside=4.0, first_ready=11.0, lead_beside=1.83, lead=1.58, state=1.63)})
LEAD_BESIDE_GAIN = 0.01

# The prepare pass on sm_90 (hopper_prepare_kernels; the inputs hopper_pass takes): per K, its register
# cap (Triton's maxnreg; None: uncapped). At K = 128, 168 registers (24 bytes spilled) give three
# programs per SM where 255 would give two (the kernel's first form took 1055 us uncapped and 968 capped
# at B1 T32768 32/32 on the H200, BENCHMARKS.md "eleventh set"); 128 (four per SM, 240 bytes spilled)
# took 721 us against 168's 551 ("twelfth set"). K = 64 compiles to 246 registers uncapped (two programs
# per SM) and to 168 with 8 bytes spilled; capped it was not measured. An empty table turns the pass off.
HOPPER_PREPARE: Mapping[int, int | None] = types.MappingProxyType({64: None, 128: 168})
# ... in HOPPER_PREPARE's place where the pass stores T and the score exponents (the pairs after it form P:
# HOPPER_PAIRS_SCORES), per K. At K = 128 that form spills 56 bytes at 128 registers, none in a loop: four
# programs per SM. On the H200 against 168: the pass 258 -> 242 us at B8 T4096 32/32 (the op -0.4%), 118 -> 115
# at 1x65536 2/8 (-0.5%), 265 -> 262 at B1 T32768 32/32 (-0.0%), the same bits (BENCHMARKS.md, "forty-sixth set").
HOPPER_PREPARE_SCORES: Mapping[int, int | None] = types.MappingProxyType({128: 128})
# The Gluon prepare pass's inverse: its levels joining blocks of 1 to 8 rows inside each warp
# (hopper_inverse_kernels) where it runs alone, B8 T4096 -2.5% on an H100 and -3.2% on an H200 (BENCHMARKS.md,
# "the inverse's first four levels inside each warp", "thirty-third set").
HOPPER_WARP_BLOCK_INVERSE = True
# Cut sequences: each segment-state program finds the last chunks of its segment over which the gates have
# decayed what came before below 2^-30 (kernels._window: at most WINDOW_CHUNKS of them; a token whose beta
# ||k||^2 lies outside [0, 2] counts its growth against the decay), runs those alone and drops the segment's
# transition; where a gate does not decay (g = 0) the segment runs whole. The Triton passes take them wherever
# the plan cuts. On sm_90 (K = V = 128) the plan then cuts without the lead form, one wave of segments, both
# sequential passes the register-state ones whatever the segments' length: with windows the segment-state pass
# takes a few chunks, not a segment's, so there is no long pass for a lead to hide. On an H100 against the lead
# form: 1x32768 2/8 -22.6%, 1x65536 2/8 -24.6%, 1x32768 4/16 -23.8% under the bench's gates, -18.4 to -23.6%
# under slow gates, -0.1 to -3.6% under mixed (a quarter of the heads never forget); the Triton passes -27.4%
# at 1x32768 2/8 (BENCHMARKS.md, "segment windows against the lead form").
SEGMENT_WINDOWS = True
# Where the Gluon passes take the windows: no combine pass; each output program finds the last segment before its
# own whose window dropped its past and scans the segment states from there, from the initial state where none
# did (hopper_scan_kernels._state_after_windows; under the bench's gates, one copy of a segment state). On an
# H100 against the combine pass: 1x32768 2/8 -6.1%, 1x65536 2/8 -2.4%, 1x32768 4/16 -1.9% (the same bits);
# slow gates -2.2 to -6.2%; mixed -1.6% to +0.5%; from an initial state -7.3% (BENCHMARKS.md, "the output pass
# scans the windows").
HOPPER_SCAN_WINDOWS = True
# SEGMENT_WINDOWS for packed sequences in the Gluon passes too, where the output pass scans them
# (HOPPER_SCAN_WINDOWS); elsewhere packed sequences keep the lead form's plan. Against the lead form at
# varlen 6144+2048 2/8 on an H100: -20.6% under the bench's gates, -6.3% slow, -5.4% mixed, -22.6% from an
# initial state (same section); with the combine pass the windows lost there (+10.6% slow, +9.5% mixed, "segment
# windows against the lead form").
HOPPER_PACKED_WINDOWS = True
# Beside the sequential pass (concurrent_warp_blocks) the faster prepare pass runs further ahead of the
# sequential programs that read what it stores, and the two passes' shared traffic decides: on an H200
# (4.8 TB/s) the per-warp levels made the op 8.5% shorter at B1 T32768 32/32 (9.1% at T131072), on an H100
# (3.35 TB/s) 13.1% longer (18.2%); with half the qk heads (16/32) 5.4% and 3.9% shorter ("thirty-third set").
# So they run there from this DRAM bandwidth (GB/s, between the two GPUs measured), or with fewer qk heads
# than value heads; elsewhere the levels stay whole.
HOPPER_CONCURRENT_WARP_BLOCKS_GBPS = 4000.0
# The combine pass (the scan over segments, cut sequences only): its V tile, the widest padded K whose
# K x K transition it takes as one operator (wider K goes in 32-column blocks through the stored
# state), warps and pipeline stages (the transitions load a segment ahead of the product).
COMBINE_LAUNCH: Mapping[str, int] = types.MappingProxyType({"block_v": 16, "whole_k": 128, "num_warps": 4,
                                                            "num_stages": 2})


# What a tool that injects itself into the CUDA runtime leaves in its target's environment: CUDA's
# own variable, and those Nsight Compute and compute-sanitizer set (their 2025.3 releases set only
# theirs: under Nsight Compute the passes side by side waited for a replay that never came, and the
# flag's timeout ended the launch).
INJECTED_TOOL_VARIABLES = ("CUDA_INJECTION64_PATH", "NV_NSIGHT_INJECTION_TRANSPORT_TYPE",
                           "NV_SANITIZER_INJECTION_TRANSPORT_TYPE")


def concurrent_passes_allowed() -> bool:
    """Whether this process may run the two passes side by side: the sequential pass waits for the
    prepare pass, launched after it, so a process whose launches run one after the other would wait
    for ever (ready_flags traps after a timeout instead). CUDA_LAUNCH_BLOCKING=1 does that, and so do
    the tools that inject themselves into the CUDA runtime to replay or check kernels one at a time
    (Nsight Compute, compute-sanitizer: INJECTED_TOOL_VARIABLES). Under an MPS share of the SMs
    (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) the device's SM count overstates what the programs get, and
    the prepare pass would start only once every sequential program has. POLYKERNELS_GDN_CONCURRENT=0
    turns it off."""
    environ = os.environ
    return (environ.get("CUDA_LAUNCH_BLOCKING", "0") in ("", "0")
            and not any(environ.get(variable) for variable in INJECTED_TOOL_VARIABLES)
            and not environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
            and environ.get("POLYKERNELS_GDN_CONCURRENT", "1") != "0")


def combine_operator_block(block_k: int, whole_k: int) -> int:
    """The combine kernel's KB: the whole K x K transition as one operator up to ``whole_k``
    (COMBINE_LAUNCH), else 32-column blocks."""
    return block_k if block_k <= whole_k else 32


# The prepare kernel's K and V tiles are at least this wide (narrower heads are masked): its
# products (I + A)^-1 x (32 columns) of 16-bit inputs came out wrong, or faulted, on the H200
# (Triton 3.6, sm_90 wgmma with the left operand in registers); 64 columns are right.
PREPARE_MIN_BLOCK = 64


def launch_chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    cu_seqlens: torch.Tensor | None,
    use_qk_l2norm_in_kernel: bool,
    num_segments: int | None = None,
    replay: tuple[list, list] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Runs the Triton kernels. No host synchronization and no host-built tables: capturable in a CUDA graph.

    The parallel prepare pass, then the sequential pass (context-parallel when the plan cuts the
    sequences into segments). Everything but the tensors follows from the call's class and is
    worked out once per class (``_recipe``). ``replay``: the (tensors, flags) of the call's class,
    under which its launches are then registered as a launch program (``polykernels._programs``).
    """
    device = q.device
    if device.type == "cuda" and device.index != torch._C._cuda_getDevice():
        # A model split over GPUs in one process: compile, launch and record on q's GPU, not the current one.
        with torch.cuda.device(device):
            return launch_chunk_gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state,
                                                 cu_seqlens, use_qk_l2norm_in_kernel, num_segments, replay)
    batch, tokens, _, key_dim = q.shape
    value_heads, value_dim = v.shape[2], v.shape[3]
    num_seqs = cu_seqlens.shape[0] - 1 if cu_seqlens is not None else batch
    o = torch.empty_like(v)
    final = torch.empty(num_seqs, value_heads, key_dim, value_dim, dtype=torch.float32, device=device)
    if batch * tokens == 0 or num_seqs == 0:
        if output_final_state:
            final.copy_(initial_state if initial_state is not None else torch.zeros_like(final))
        return o, final if output_final_state else None

    seen = platform.current()
    recipe = _recipe(q.shape, v.shape, q.dtype, None if cu_seqlens is None else cu_seqlens.dtype, num_seqs,
                     initial_state is not None, output_final_state, use_qk_l2norm_in_kernel, num_segments, device,
                     seen, *launch_tables(_block(key_dim), seen.arch, q.dtype == torch.float32))
    run = _launchers()
    cu = cu_seqlens if cu_seqlens is not None else _unused_offsets(device)
    initial = initial_state.float().contiguous() if initial_state is not None else final
    # A launch program replays the call's own tensors: a copy made here (below too) is not one of them.
    copied = initial is not initial_state and initial is not final
    if (recipe.hopper or recipe.hopper_prepare) and (q.data_ptr() | k.data_ptr()) & 15:
        # The Gluon passes copy q and k in 16-byte pieces (cp.async; an unaligned base does not
        # compile): a view that starts off a 16-byte boundary is copied first (fresh and
        # contiguous tensors are aligned).
        q, k, copied = q.clone(), k.clone(), True
    if recipe.hopper_prepare and v.data_ptr() & 15:
        v, copied = v.clone(), True  # the Gluon prepare pass copies v's tile the same way
    # The launchers' spec_key: the recipe's (every integer argument and constexpr, the dtypes), then
    # each caller tensor's 16-byte alignment (the workspace's parts are aligned).
    spec = (recipe.spec, q.data_ptr() & 15, k.data_ptr() & 15, v.data_ptr() & 15, g.dtype, g.data_ptr() & 15,
            beta.dtype, beta.data_ptr() & 15, initial.data_ptr() & 15, cu.data_ptr() & 15)

    def arguments(scratch: _Scratch, scale: object = scale) -> _Arguments:
        """Each launch's arguments, the workspace's parts as addresses or (Triton's own launch) as views
        (or, for a launch program, markers of the workspace's parts and of the scale)."""
        # Packed sequences' chunks and segments are found from cu_seqlens in the kernels (kernels._sequence_of).
        prepared = scratch[:6]
        segments = (cu, tokens, num_seqs, recipe.segments_per_seq, recipe.segment_tokens)
        h_init = scratch.h_init if recipe.segment_chunks and not recipe.after_windows else initial
        # from_v: T (in w's part) and v where w and u go, and k's factor (in u's part) as the register-state
        # passes' last pointer (WS_ptr; unused elsewhere).
        read, factor = ((scratch.w, v, *prepared[2:]), scratch.u) if recipe.from_v else (prepared, final)
        # lead: the output pass scans the segment states itself (no combine pass), from the first segments'
        # end states, which the lead pass leaves in h_local's slots of those segments.
        # after_windows: the same, back to the last segment whose window dropped its past.
        scans = recipe.lead or recipe.after_windows
        read_segments = (scratch.h_local, scratch.transitions) if scans else (final, final)
        return _Arguments(
            prepare=(q, k, v, g, beta, *prepared, cu, tokens, num_seqs, recipe.chunks_per_seq, scale,
                     *((scratch.flags, recipe.sequential_programs) if recipe.hopper_prepare else ())),
            # Each sequence's first segment (grid (NV, N, HV)): its end state goes to h_local's slot of that
            # segment, which the segment-state pass leaves unused.
            lead=(q, k, *prepared, initial, final, o, scratch.h_local, final, *segments, scratch.flags, final),
            segment_state=(q, k, *read, final, final, o, scratch.h_local, scratch.transitions, *segments,
                           *((scratch.flags, factor) if recipe.segment_registers else ())),
            combine=(initial, scratch.h_local, scratch.transitions, scratch.h_init, cu, num_seqs,
                     recipe.segments_per_seq, recipe.segment_tokens),
            recurrence=(q, k, *read, h_init, final, o, *read_segments, *segments,
                        *((scratch.flags, factor) if recipe.hopper_registers else ())),
        )

    # Every intermediate lives in one allocation passed as addresses: one torch.empty, not up to nine.
    workspace = recipe.workspace.allocate(device)
    args = arguments(_Scratch(*recipe.workspace.addresses(workspace)))

    def views() -> _Arguments:
        return arguments(_Scratch(*recipe.workspace.views(workspace)))

    launches = _launches(recipe, run, spec)
    flags = recipe.workspace.parts[_Scratch._fields.index("flags")]
    flag_bytes = math.prod(flags.shape) * flags.dtype.itemsize
    if recipe.concurrent or recipe.lead:  # the ready flags and done counters start at zero
        workspace[flags.offset:flags.offset + flag_bytes].zero_()
    if recipe.concurrent or recipe.beside_prepare:
        # Every kernel compiled and loaded first: the sequential pass waits for the prepare pass, whose
        # compile or module load must not happen while it spins.
        for launcher, grid, name, meta, key in launches:
            launcher.warm(grid, meta, spec_key=key, tensors=lambda name=name: getattr(views(), name))
    descriptors = recipe.workspace.parts[_Scratch._fields.index("descriptors")]
    for launcher, grid, name, meta, key in launches:
        # TMA: the output pass's descriptors in their part of the workspace (TMA_SCRATCH_BYTES a program).
        scratch = ({"scratch": (workspace.data_ptr() + descriptors.offset, TMA_SCRATCH_BYTES)}
                   if recipe.tma and name == "recurrence" else {})
        launcher(grid, getattr(args, name), meta, spec_key=key, tensors=lambda name=name: getattr(views(), name),
                 **scratch)
    if replay is not None and not copied:
        marked = arguments(_Scratch(*(OutputPart(2, part.offset) for part in recipe.workspace.parts)), Scalar(0))
        steps: list[Step | Zero] = [
            Step(launcher, grid, getattr(marked, name), key,
                 OutputPart(2, descriptors.offset) if recipe.tma and name == "recurrence" else None)
            for launcher, grid, name, meta, key in launches]
        if recipe.concurrent or recipe.lead:
            steps.insert(0, Zero(2, flags.offset, flag_bytes))
        _programs.register(replay[0], replay[1], (o, final, workspace), 2, steps, constants=(_unused_offsets(device),))
    return o, final if output_final_state else None


def launch_tables(block_k: int, arch: str | None, fp32_inputs: bool = False) -> tuple:
    """The launch tables' entries ``_recipe`` reads on GPU arch ``arch`` for inputs of that dtype, in its order
    after the platform (its cache key holds them: a table replaced gets a recipe of its own)."""
    return (*triton_pass_launches(arch, block_k, fp32_inputs),
            tuple(HOPPER_STAGES.items()), tuple(HOPPER_PREPARE.items()), tuple(HOPPER_REGISTER_STAGES.items()),
            tuple(HOPPER_REGISTER_PAIRS.items()), tuple(HOPPER_CONCURRENT.items()), tuple(COMBINE_LAUNCH.items()),
            tuple(HOPPER_REGISTER_CUT.items()), tuple(HOPPER_REGISTER_SEGMENT_STAGES.items()), HOPPER_PAIRS_FROM_V,
            tuple(HOPPER_LEAD_SEGMENT.items()), tuple(HOPPER_LEAD_BESIDE_PREPARE.items()), HOPPER_WARP_BLOCK_INVERSE,
            HOPPER_CONCURRENT_WARP_BLOCKS_GBPS, gluon_allowed(), SEGMENT_WINDOWS,
            HOPPER_PACKED_WINDOWS, HOPPER_SCAN_WINDOWS, tuple(HOPPER_CONCURRENT_PAIRS.items()), HOPPER_PAIRS_SCORES,
            HOPPER_CONCURRENT_PACKED, tuple(HOPPER_WINDOWED_PAIRS.items()),
            tuple(HOPPER_WINDOWED_PACKED_PAIRS.items()), HOPPER_PAIRS_TMA, tuple(HOPPER_PREPARE_SCORES.items()))


def concurrent_warp_blocks(heads: int, value_heads: int, dram_gbps: float | None,
                           least_gbps: float) -> tuple[bool, str]:
    """Whether the prepare pass beside the sequential pass takes its inverse's per-warp levels
    (HOPPER_CONCURRENT_WARP_BLOCKS_GBPS), and why: fewer qk heads than value heads, or DRAM of
    ``least_gbps`` or more (``dram_gbps`` None: not known, the levels stay whole)."""
    if heads < value_heads:
        return True, f"fewer qk heads ({heads}) than value heads ({value_heads})"
    if dram_gbps is None:
        return False, f"the GPU's DRAM bandwidth not known (--dram-gbps gives it; per-warp from {least_gbps:.0f} GB/s)"
    per_warp = dram_gbps >= least_gbps
    return per_warp, f"DRAM {dram_gbps:.0f} GB/s, {'at least' if per_warp else 'under'} {least_gbps:.0f}"


def _launches(recipe: _Recipe, run: SimpleNamespace,
              spec: tuple) -> list[tuple[object, tuple[int, ...], str, dict[str, object], object]]:
    """(launcher, grid, name of its arguments in _Arguments, constexprs and options, spec_key) of each
    launch, in order: the prepare pass, the segment passes (cut sequences; in the lead form the first
    segments' output pass before them, the segment-state pass its programmatic dependent, and no
    combine pass: the output programs scan the segment states themselves), the sequential pass. Where
    the two passes run side by side the sequential pass comes first and the prepare pass is its
    programmatic dependent (ready_flags); where the lead runs beside the prepare pass the lead comes first,
    the prepare pass its programmatic dependent and the segment-state pass the prepare pass's."""
    prepare = _hopper_prepare_launcher() if recipe.hopper_prepare else run.prepare
    sequential = (_hopper_register_launcher() if recipe.hopper_registers else _hopper_launcher() if recipe.hopper
                  else run.recurrence)
    if recipe.concurrent:
        return [(sequential, recipe.recurrence_grid, "recurrence", recipe.recurrence_meta, (spec, False)),
                (prepare, recipe.prepare_grid, "prepare", recipe.prepare_meta, spec)]
    lead = (sequential, recipe.lead_grid, "lead", recipe.lead_meta, (spec, "lead"))
    launches = [(prepare, recipe.prepare_grid, "prepare", recipe.prepare_meta, spec)]
    if recipe.beside_prepare:  # the prepare pass is its programmatic dependent
        launches.insert(0, lead)
    if recipe.segment_chunks:
        segment_state = (_hopper_register_launcher() if recipe.segment_registers else
                         _hopper_launcher() if recipe.hopper_registers else sequential)
        if recipe.lead and not recipe.beside_prepare:  # the segment-state pass is its programmatic dependent
            launches.append(lead)
        launches.append((segment_state, recipe.segment_state_grid, "segment_state", recipe.segment_state_meta,
                         (spec, True)))
        if not (recipe.lead or recipe.after_windows):  # those output passes scan the segment states themselves
            launches.append((run.combine, recipe.combine_grid, "combine", recipe.combine_meta, spec))
    launches.append((sequential, recipe.recurrence_grid, "recurrence", recipe.recurrence_meta, (spec, False)))
    return launches


@dataclass(frozen=True, kw_only=True)
class _Recipe:
    """The launches of one class of call: grids, constexprs and options, and the integer arguments
    that are not shapes. ``spec`` is the class itself, the first part of every launch's spec_key."""

    spec: tuple
    chunks_per_seq: int
    segment_chunks: int  # 0: each sequence is one segment
    segments_per_seq: int
    max_segments: int
    segment_tokens: int
    prepare_grid: tuple[int, ...]
    prepare_meta: dict[str, object]
    segment_state_grid: tuple[int, ...]
    segment_state_meta: dict[str, object]
    combine_grid: tuple[int, ...]
    combine_meta: dict[str, object]
    recurrence_grid: tuple[int, ...]
    recurrence_meta: dict[str, object]
    hopper: bool  # the sequential passes run a Gluon kernel: hopper_kernels' ...
    hopper_registers: bool  # ... or hopper_register_kernels' (the state in registers), for the output pass
    segment_registers: bool  # ... and for the segment-state pass
    hopper_prepare: bool  # the prepare pass runs hopper_prepare_kernels' Gluon kernel
    concurrent: bool  # the sequential pass runs beside the prepare pass, launched first (ready_flags)
    lead: bool  # cut sequences: the first segments' output pass leads the other segments' segment-state pass
    lead_grid: tuple[int, ...]
    lead_meta: dict[str, object]
    beside_prepare: bool  # lead: launched first, the prepare pass beside it (ready flags), the segment states after
    sequential_programs: int  # concurrent: the sequential pass's grid size (ready_flags.end_after_leader)
    workspace: Layout  # every intermediate (_Scratch)
    from_v: bool = False  # HOPPER_PAIRS_FROM_V: the prepare pass stores T, the sequential pass reads v
    segment_windows: bool = False  # SEGMENT_WINDOWS: the prepare pass's GROWTH, the segment states' windows
    after_windows: bool = False  # ... and (Gluon) the output pass scans them itself, no combine pass
    tma: bool = False  # HOPPER_PAIRS_TMA: the output pass copies its tiles by TMA, its descriptors in the workspace
    inverse_beside: str = ""  # concurrent: why the prepare pass's inverse takes its levels whole or per warp
    plan: SegmentPlan | None = None  # what plan_segments chose, and why (plan_report)


# Per class of call: deciding costs more host time than a launch. The key holds the launch-table
# entries the recipe reads, so a sweep or a test that edits a table gets a new recipe.
@functools.lru_cache(maxsize=256)
def _recipe(
    q_shape: torch.Size, v_shape: torch.Size, dtype: torch.dtype, cu_dtype: torch.dtype | None, num_seqs: int,
    has_initial: bool, output_final_state: bool, l2norm: bool, num_segments: int | None, device: torch.device,
    seen: platform.Platform, block_vs: tuple[int, int], launch: tuple[int, int],
    prepare_launch: tuple[int, int], hopper_stages: tuple[tuple[int, int], ...],
    hopper_prepare: tuple[tuple[int, int | None], ...], hopper_register_stages: tuple[tuple[int, int], ...],
    hopper_register_pairs: tuple[tuple[int, int], ...], hopper_concurrent: tuple[tuple[int, tuple[int, int]], ...],
    combine_launch: tuple[tuple[str, int], ...], hopper_register_cut: tuple[tuple[int, int], ...],
    hopper_register_segment_stages: tuple[tuple[int, int], ...], pairs_from_v: bool = False,
    lead_segment: tuple[tuple[int, int], ...] = (),
    lead_beside_prepare: tuple[tuple[int, LeadRates], ...] = (), warp_block_inverse: bool = False,
    concurrent_warp_blocks_gbps: float = math.inf, gluon: bool = True, segment_windows: bool = False,
    packed_windows: bool = False, scan_windows: bool = False,
    concurrent_pairs: tuple[tuple[int, int], ...] = (), pairs_scores: bool = False, concurrent_packed: bool = False,
    windowed_pairs: tuple[tuple[int, int], ...] = (), windowed_packed_pairs: tuple[tuple[int, int], ...] = (),
    pairs_tma: bool = False, prepare_scores_caps: tuple[tuple[int, int | None], ...] = (),
    *,
    sms: int | None = None,
    dram_gbps: float | None = None,
) -> _Recipe:
    """``sms`` and ``dram_gbps``: the SM count and peak DRAM bandwidth (GB/s) to plan for, where not the
    device's (plan_report's preview of a target; ``dram_gbps`` None there: not known). ``gluon``:
    gluon_allowed() as launch_tables read it: the recipe depends on its arguments only."""
    batch, tokens, heads, key_dim = q_shape
    value_heads, value_dim = v_shape[2], v_shape[3]
    varlen, total = cu_dtype is not None, batch * tokens
    on_hopper = gluon and _gluon_built_for(seen, dtype, key_dim)
    caps = dict(hopper_prepare)
    gluon_prepare = key_dim in caps and on_hopper
    form = dict(hopper_concurrent).get(key_dim)  # (tiles per program, stages) beside the prepare pass
    # Two tiles per program beside it where one leaves too few SMs, only in FlashInfer's order of the chain
    pair_stages = (dict(concurrent_pairs).get(key_dim)
                   if pairs_from_v and key_dim == 128 and value_dim % 128 == 0 else None)
    # A sequential pass may wait for the prepare pass launched after it (packed sequences with
    # HOPPER_CONCURRENT_PACKED, uncut: not the lead form beside it).
    overlap = gluon_prepare and (concurrent_packed or not varlen) and concurrent_passes_allowed()
    beside = form if overlap else None
    sm_count = sms or platform.sm_count(device)
    lead_tiles = ({tile: least for tile, least in lead_segment
                   if tile in dict(hopper_register_stages) and tile in dict(hopper_register_segment_stages)}
                  if on_hopper else None)

    def plan_for(lead_tiles: Mapping[int, int] | None, windowed: Mapping[int, int] | None = None) -> SegmentPlan:
        return plan_segments(num_seqs, total, value_heads, sm_count, num_segments, key_dim=key_dim,
                             value_dim=value_dim, register_tiles=dict(hopper_register_stages) if on_hopper else (),
                             register_pairs=dict(hopper_register_pairs) if on_hopper else (),
                             concurrent_tiles={tile: beside[0] for tile in dict(hopper_register_stages)} if beside
                             else None, concurrent_pairs=tuple(dict(hopper_register_pairs)) if beside and pair_stages
                             else (), lead_tiles=lead_tiles,
                             lead_rates=(dict(lead_beside_prepare).get(key_dim) if overlap and lead_tiles
                                         and not varlen else None),
                             packed=varlen, block_vs=block_vs,
                             windowed_pairs=windowed)

    # SEGMENT_WINDOWS: the Gluon passes (K = V = 128) cut without the lead form, their segment states in the
    # register-state pass (whose segment-state programs take the windows) whatever the segments' length, where
    # that pass runs the plan's tile, and packed sequences only with HOPPER_PACKED_WINDOWS where the output pass
    # scans them (HOPPER_SCAN_WINDOWS); the lead form's plan otherwise. The Triton passes (no lead form) take the
    # windows wherever the plan cuts.
    gluon_windows = (segment_windows and gluon_prepare and key_dim == value_dim == 128
                     and (not varlen or (packed_windows and scan_windows)))
    # HOPPER_WINDOWED_PAIRS (batch rows) and HOPPER_WINDOWED_PACKED_PAIRS (packed sequences): cut into pairs in
    # FlashInfer's order, P formed in them, their segment states windowed in the same form and scanned by the output
    # programs.
    pair_least = windowed_packed_pairs if varlen else windowed_pairs
    pair_windows = gluon_windows and scan_windows and pairs_from_v and pairs_scores and bool(pair_least)
    plan = plan_for(None, dict(pair_least) if pair_windows else None) if gluon_windows else plan_for(lead_tiles)
    cut_pairs = pair_windows and plan.segments > 1 and plan.warpgroups == 2
    if gluon_windows and not cut_pairs and not (plan.segments > 1 and not plan.concurrent and plan.warpgroups == 1
                                                and plan.block_v in dict(hopper_register_stages)
                                                and plan.block_v in dict(hopper_register_segment_stages)):
        gluon_windows, plan = False, plan_for(lead_tiles)
    triton_windows = segment_windows and not on_hopper and plan.segments > 1
    windows = gluon_windows or triton_windows
    if windows:
        plan = replace(plan, reason=plan.reason + "; each segment state from its last chunks where the gates have "
                                                  "decayed the rest below 2^-30 (the segments whole where not)")
    segment_chunks = plan.segment_chunks if plan.segments > 1 else 0
    # Beside the prepare pass at two tiles per program where HOPPER_CONCURRENT's own form left it too few SMs.
    pairs_beside = plan.concurrent and plan.warpgroups != beside[0]
    # The Gluon output programs scan back to the last window themselves (hopper_register_kernels.
    # _state_after_windows; from the initial state where no window is found) and no combine pass runs.
    after_windows = gluon_windows and scan_windows
    block_k, block_v = _block(key_dim), plan.block_v * plan.warpgroups
    precision = guards.dot_precision(fp32_inputs=dtype == torch.float32)
    chunks_per_seq = -(-tokens // CHUNK)
    max_chunks = -(-total // CHUNK) + num_seqs if varlen else num_seqs * chunks_per_seq
    if not segment_chunks:  # one segment per sequence (packed ones too: kernels._segments_of)
        segments_per_seq, max_segments, segment_tokens = 1, num_seqs, WHOLE_SEQUENCE * CHUNK
    elif varlen:  # segment slots: at most total // segment_tokens + num_seqs (kernels._sequence_of)
        segments_per_seq, segment_tokens = 1, segment_chunks * CHUNK
        max_segments = -(-total // segment_tokens) + num_seqs
    else:  # the plan's count (beside_prepare: the first segment takes what the others leave, FIRST_TAKES_REST)
        segments_per_seq = plan.segments
        max_segments, segment_tokens = num_seqs * segments_per_seq, segment_chunks * CHUNK
    lead = plan.lead  # cut into three segments or more (packed sequences: on average)
    # lead: the output pass after it takes each sequence's segments after its first, the segment-state pass those
    # before its last too. Packed sequences number them apart (kernels._sequence_of's AFTER_FIRST), at most
    # total // segment_tokens whatever the lengths, the segment states' including each last, which forms nothing.
    packed_after_lead = max(1, total // segment_tokens) if varlen else 0
    outputs_after_lead = packed_after_lead or num_seqs * (segments_per_seq - 1)
    states_after_lead = packed_after_lead or num_seqs * (segments_per_seq - 2)
    beside_prepare = plan.beside_prepare  # the lead launched first, the prepare pass beside it (ready_flags)
    combine = dict(combine_launch)
    combine_bv = min(combine["block_v"], _block(value_dim))
    prep_bv, prep_warps = prepare_launch
    prep_dot, prep_inverse = guards.prepare_precision(fp32_inputs=dtype == torch.float32)
    prep_bv = max(min(prep_bv, _block(value_dim)), PREPARE_MIN_BLOCK)
    # Stages the device cannot hold (fp32 tiles; 64 KiB on gfx942) fall back in the launcher.
    num_warps, num_stages = launch
    shape = {"H": heads, "HV": value_heads, "K": key_dim, "V": value_dim, "BT": CHUNK, "BK": block_k}
    where = {"VARLEN": varlen, "LOG_N": max(1, num_seqs.bit_length()), "DOT_PRECISION": precision}
    value_tiles = -(-value_dim // block_v)
    recurrence = {**shape, "BV": block_v, "NV": value_tiles, **where}
    recurrence_tail = {"num_warps": num_warps, "num_stages": num_stages}
    # The register-state pass: uncut sequences, and the passes over long enough segments
    # (HOPPER_REGISTER_CUT; the segment-state pass falls back on hopper_kernels' at the same tile).
    if cut_pairs:  # both sequential passes the pairs' (the segment states without outputs)
        register_stages = dict(hopper_register_pairs)[plan.block_v]
    elif segment_chunks:
        least = dict(hopper_register_cut).get(block_v)
        segment_pass = block_v in dict(hopper_register_segment_stages) or block_v in dict(hopper_stages)
        register_stages = (dict(hopper_register_stages).get(block_v)
                           if lead or gluon_windows or (least is not None and segment_chunks >= least and segment_pass)
                           else None)
    elif plan.concurrent:
        register_stages = pair_stages if pairs_beside else beside[1]
    elif plan.warpgroups == 2:  # the plan pairs only tiles that table holds
        register_stages = dict(hopper_register_pairs)[plan.block_v]
    else:
        register_stages = dict(hopper_register_stages).get(block_v)
    stages = register_stages or dict(hopper_stages).get(block_v)
    hopper = stages is not None and on_hopper
    hopper_registers = hopper and register_stages is not None
    if hopper:
        recurrence_tail = {"STAGES": stages, "num_warps": 4 * plan.warpgroups}
    segment_tail = recurrence_tail
    segment_stages = None
    if segment_chunks and hopper_registers:
        segment_stages = register_stages if cut_pairs else dict(hopper_register_segment_stages).get(block_v)
    from_v = (pairs_from_v and gluon_prepare and plan.warpgroups == 2 and (not segment_chunks or cut_pairs)
              and (not plan.concurrent or pairs_beside) and key_dim == 128 and value_dim % block_v == 0)
    scores_in_pairs = from_v and pairs_scores and not plan.concurrent  # HOPPER_PAIRS_SCORES
    tma = scores_in_pairs and pairs_tma  # HOPPER_PAIRS_TMA
    if hopper_registers:
        recurrence_tail = {**recurrence_tail, "AWAIT": plan.concurrent, "FROM_V": from_v, "LEAD": False,
                           **({"SCORES": True, "TMA": tma} if scores_in_pairs else {}),
                           "AFTER_LEAD": lead, "FIRST_TAKES_REST": beside_prepare,
                           **({"AFTER_WINDOWS": True} if after_windows else {})}
        if segment_chunks:  # the register-state segment-state pass, or hopper_kernels'
            # lead: the first segments' output pass's programmatic dependent, beside it (beside_prepare: the
            # prepare pass's, each chunk's copies after its flag).
            segment_tail = ({"STAGES": segment_stages, "num_warps": 4 * plan.warpgroups, "AWAIT": beside_prepare,
                             "FROM_V": from_v, "LEAD": False, "AFTER_LEAD": lead, "FIRST_TAKES_REST": beside_prepare,
                             **({"SEGMENT_WINDOW": True} if gluon_windows else {}),
                             # the scales where the pairs after them read them (the prepare pass's SCORE_FACTORS)
                             **({"CHUNK_SCALES": True} if scores_in_pairs and gluon_windows else {}),
                             **({"launch_pdl": True} if lead else {})}
                            if segment_stages
                            else {"STAGES": dict(hopper_stages)[block_v], "num_warps": 4})
    prepare_tail = {"num_warps": prep_warps, "num_stages": 1, **({"GROWTH": True} if triton_windows else {})}
    # Ready flags (one per chunk and value head) then the done counters: the prepare pass's and the sequential
    # pass's beside it; the lead's and the segment states' (ready_flags); the prepare pass's, the lead's and the
    # segment states' where the lead runs beside the prepare pass (hopper_register_kernels).
    flag_count = (max_chunks * value_heads + 2 if plan.concurrent else max_chunks * value_heads + 3 if beside_prepare
                  else 2 if lead else 0)
    inverse_beside, per_warp_beside = "", False
    if gluon_prepare:
        # Beside the sequential pass: its programmatic dependent, started once every sequential program
        # has (ready_flags.launch_dependents), on the SMs they left; its inverse's per-warp levels there
        # where the GPU's DRAM or the heads allow (beside the lead: not measured, whole).
        dependent = plan.concurrent or beside_prepare
        per_warp_beside, inverse_beside = concurrent_warp_blocks(
            heads, value_heads, dram_gbps if sms else platform.dram_gbps(device), concurrent_warp_blocks_gbps
        ) if plan.concurrent else (False, "")
        # Where the pass stores the score exponents it takes their own cap (HOPPER_PREPARE_SCORES).
        cap = dict(prepare_scores_caps).get(key_dim, caps[key_dim]) if scores_in_pairs else caps[key_dim]
        prepare_tail = {"CONCURRENT": dependent, "num_warps": 4, "STORE_T": from_v, "GROWTH": gluon_windows,
                        **({"SCORE_FACTORS": True} if scores_in_pairs else {}),
                        "WARP_BLOCKS": warp_block_inverse and (not dependent or per_warp_beside),
                        **({"maxnreg": cap} if cap else {}),
                        **({"launch_pdl": True} if dependent else {})}
    return _Recipe(
        spec=(q_shape, v_shape, dtype, cu_dtype, num_seqs, has_initial, output_final_state, l2norm, num_segments,
              device, seen, block_vs, launch, prepare_launch, hopper_stages, hopper_prepare, hopper_register_stages,
              hopper_register_pairs, hopper_concurrent, combine_launch, hopper_register_cut,
              hopper_register_segment_stages, pairs_from_v, lead_segment, lead_beside_prepare,
              warp_block_inverse, concurrent_warp_blocks_gbps, gluon, segment_windows, packed_windows, scan_windows,
              concurrent_pairs, pairs_scores, concurrent_packed, windowed_pairs, windowed_packed_pairs, pairs_tma,
              prepare_scores_caps,
              # What the plan read beyond the arguments (the device's SM count and DRAM, the environment): the
              # launchers keep each compiled kernel by this spec, so recipes that differ there only must not share.
              sm_count, overlap, per_warp_beside),
        chunks_per_seq=chunks_per_seq, segment_chunks=segment_chunks,
        segments_per_seq=segments_per_seq, max_segments=max_segments, segment_tokens=segment_tokens,
        # Beside the sequential pass the programs take the slots as num_seqs rows (kernels._ready_slot): packed
        # sequences' grid rounds up to whole rows.
        prepare_grid=(num_seqs * -(-max_chunks // num_seqs) if plan.concurrent or beside_prepare else max_chunks,
                      value_heads),
        prepare_meta={**shape, "BK": max(block_k, PREPARE_MIN_BLOCK), "BV": prep_bv, "NV": -(-value_dim // prep_bv),
                      "L2NORM": l2norm, **where, "DOT_PRECISION": prep_dot, "INVERSE_PRECISION": prep_inverse,
                      **prepare_tail},
        # lead: each sequence's first segment (its output pass), the segment states of those between its
        # first and last, the output pass of those after its first.
        lead_grid=(value_tiles, num_seqs, value_heads),
        # A packed sequence may be one segment: its lead stores its final state too.
        lead_meta={**recurrence, "HAS_INITIAL": has_initial, "SEGMENT_STATE": False,
                   "STORE_FINAL": output_final_state and varlen,
                   **recurrence_tail, "LEAD": True, "AFTER_LEAD": False, "AWAIT": beside_prepare},
        segment_state_grid=(value_tiles + -(-key_dim // block_v),
                            states_after_lead if lead else max_segments, value_heads),
        segment_state_meta={**recurrence, "HAS_INITIAL": False, "SEGMENT_STATE": True, "STORE_FINAL": False,
                            **segment_tail, **({"SEGMENT_WINDOW": True} if triton_windows else {})},
        combine_grid=(-(-value_dim // combine_bv), num_seqs, value_heads),
        combine_meta={"HV": value_heads, "K": key_dim, "V": value_dim, "BK": block_k, "BV": combine_bv,
                      "KB": combine_operator_block(block_k, combine["whole_k"]), "HAS_INITIAL": has_initial,
                      "VARLEN": varlen, "DOT_PRECISION": precision,
                      "num_warps": combine["num_warps"], "num_stages": combine["num_stages"]},
        recurrence_grid=(value_tiles, outputs_after_lead if lead else max_segments, value_heads),
        # A segment's initial state: the combine pass's (h_init), or the sequence's where the output pass scans.
        recurrence_meta={**recurrence, "HAS_INITIAL": has_initial or (bool(segment_chunks) and not after_windows),
                         "SEGMENT_STATE": False,
                         "STORE_FINAL": output_final_state, **recurrence_tail},
        hopper=hopper,
        hopper_registers=hopper_registers,
        segment_registers=segment_stages is not None,
        hopper_prepare=gluon_prepare,
        concurrent=plan.concurrent,
        lead=lead,
        beside_prepare=beside_prepare,
        sequential_programs=value_tiles * max_segments * value_heads if plan.concurrent else 0,
        from_v=from_v,
        segment_windows=windows,
        after_windows=after_windows,
        tma=tma,
        inverse_beside=inverse_beside,
        plan=plan,
        workspace=_workspace(total, value_heads, key_dim, value_dim, dtype, max_segments, bool(segment_chunks),
                             flag_count, from_v,
                             combined=not (lead or after_windows), score_factors=scores_in_pairs,
                             descriptors=value_tiles * max_segments * value_heads * TMA_SCRATCH_BYTES if tma else 0),
    )


class _Scratch(NamedTuple):
    """The workspace's parts (addresses, or views for Triton's own launch), in Layout order; the
    first six are what the prepare pass writes for the sequential pass, in the kernels' order."""

    w: object
    u: object
    scores: object  # P, chunk x chunk per chunk and head (HOPPER_PAIRS_SCORES: two exponents per token)
    q_scale: object
    k_scale: object
    decay: object
    h_local: object  # cut sequences only: each segment's state from a zero start
    transitions: object  # cut sequences only: each segment's K x K state transition
    h_init: object  # cut sequences only: each segment's state at its start (the combine kernel's; empty in the
    # lead form, whose output programs scan the segment states themselves)
    flags: object  # concurrent passes: each (chunk, value head)'s ready flag, then two done counters (lead: those)
    descriptors: object  # TMA (HOPPER_PAIRS_TMA): the output pass's global scratch, TMA_SCRATCH_BYTES a program


class _Arguments(NamedTuple):
    prepare: tuple
    lead: tuple
    segment_state: tuple
    combine: tuple
    recurrence: tuple


def _workspace(total: int, value_heads: int, key_dim: int, value_dim: int, dtype: torch.dtype, max_segments: int,
               segmented: bool, flags: int, from_v: bool = False, combined: bool = True,
               score_factors: bool = False, descriptors: int = 0) -> Layout:
    """The parts of ``_Scratch``; those a class of call does not use are empty (``combined``: a combine
    pass writes each segment's initial state; the lead form's output pass scans the segment states itself;
    ``score_factors``: the pairs form P, from two exponents per token stored in its place with the other
    per-token scales, so the token-major ones are empty; ``descriptors``: the bytes of the output pass's TMA
    descriptors, its global scratch)."""
    segments = max_segments if segmented else 0
    token_scales = 0 if score_factors else total
    return Layout.of([
        ((total, value_heads, key_dim), dtype),
        # from_v: k's per-token factor in w (fp32) in u's place; T takes w's.
        ((token_scales, value_heads), torch.float32) if from_v else ((total, value_heads, value_dim), dtype),
        # score_factors: the chunk's scales (hopper_prepare_kernels.chunk_scales), eight floats a token and head.
        ((total, value_heads, 8), torch.float32) if score_factors else ((total, value_heads, CHUNK), dtype),
        *[((token_scales, value_heads), torch.float32)] * 2,  # the q and k scales
        ((total, value_heads), torch.float32),  # the decays
        ((segments, value_heads, key_dim, value_dim), torch.float32),
        ((segments, value_heads, key_dim, key_dim), torch.float32),
        ((segments if combined else 0, value_heads, key_dim, value_dim), torch.float32),
        ((flags,), torch.int32),
        ((descriptors,), torch.uint8),
    ])
