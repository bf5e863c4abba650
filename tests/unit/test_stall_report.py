"""benchmarks.stall_report reads Nsight Compute's source-page CSV export (columns as ncu 2025 writes them)."""

from __future__ import annotations

import csv
import io

import pytest
from benchmarks.stall_report import parse

_HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","stall_barrier","stall_long_sb","stall_wait",'
           '"stall_long_sb (Not Issued)"')


def _rows(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


def test_shares_and_hottest_instructions_per_kernel() -> None:
    text = "\n".join([
        '"Kernel Name","gdn_prepare_kernel",', _HEADER,
        '"0x10","LDG.E R1, desc[UR6][R2.64]","5","0","5","0","5"',
        '"0x20","FMUL R4, R4, R1","30","0","27","3","20"',
        '"0x30","WARPGROUP.DEPBAR.LE gsb0, 0x0","15","15","0","0","0"',
        '"Kernel Name","gdn_recurrence_kernel",', _HEADER,
        '"0x40","HGMMA.64x32x16.F32.BF16 R24, gdesc[UR8], RZ","1,000","0","0","1,000","0"',
    ])
    prepare, recurrence = parse(_rows(text), top=2)
    assert prepare.kernel == "gdn_prepare_kernel"
    assert prepare.reasons == pytest.approx({"stall_long_sb": 32 / 50, "stall_barrier": 15 / 50, "stall_wait": 3 / 50})
    assert prepare.hottest == [(30, "stall_long_sb", "FMUL R4, R4, R1"),
                               (15, "stall_barrier", "WARPGROUP.DEPBAR.LE gsb0, 0x0")]
    assert recurrence.reasons == {"stall_wait": 1.0}
    assert recurrence.hottest[0][0] == 1000
    assert prepare.before == [(), ()]  # no context asked for


def test_context_lists_the_instructions_before_each_hottest_one() -> None:
    text = "\n".join([
        '"Kernel Name","gdn_prepare_kernel",', _HEADER,
        '"0x10","LDGSTS.E.BYPASS.128 [R114], desc[UR48][R4.64], !P6","1","0","1","0","0"',
        '"0x20","LDGSTS.E.BYPASS.128 [R114+0x400], desc[UR48][R6.64], !P5","1","0","1","0","0"',
        '"0x30","@!P0 LDG.E R117, desc[UR48][R6.64]","90","0","90","0","0"',
        '"0x40","FMUL R4, R4, R1","3","0","3","0","0"',
    ])
    (prepare,) = parse(_rows(text), top=2, context=2)
    assert prepare.hottest[0][2] == "@!P0 LDG.E R117, desc[UR48][R6.64]"
    assert prepare.before[0] == ("LDGSTS.E.BYPASS.128 [R114], desc[UR48][R4.64], !P6",
                                 "LDGSTS.E.BYPASS.128 [R114+0x400], desc[UR48][R6.64], !P5")
    assert prepare.before[1] == ("LDGSTS.E.BYPASS.128 [R114+0x400], desc[UR48][R6.64], !P5",
                                 "@!P0 LDG.E R117, desc[UR48][R6.64]")
    (first_line,) = parse(_rows(text), top=1, context=5)[0].before[:1]
    assert len(first_line) == 2  # the kernel's first instructions have fewer before them


def test_an_export_without_stall_samples_says_how_to_take_one() -> None:
    text = '"Kernel Name","k",\n"Address","Source","Instructions Executed"\n"0x10","NOP","4"'
    with pytest.raises(ValueError, match="--set full"):
        parse(_rows(text))


def test_spans_cut_the_kernel_at_each_wait_in_program_order() -> None:
    text = "\n".join([
        '"Kernel Name","gdn_recurrence_kernel",', _HEADER,
        '"0x10","LDGSTS.E.BYPASS.128 [R114], desc[UR48][R4.64], !P6","2","0","2","0","0"',
        '"0x20","BAR.SYNC.DEFER_BLOCKING 0x0","8","8","0","0","0"',
        '"0x30","LDS.64 R134, [R6+0x28220]","40","0","40","0","0"',
        '"0x40","@P1 WARPGROUP.DEPBAR.LE gsb0, 0x0","10","0","0","10","0"',
        '"0x50","FMUL R4, R4, R1","3","0","1","2","0"',
    ])
    (kernel,) = parse(_rows(text))
    assert [(span.first, span.wait, span.instructions, span.samples) for span in kernel.spans] == [
        ("LDGSTS.E.BYPASS.128 [R114], desc[UR48][R4.64], !P6", "BAR.SYNC.DEFER_BLOCKING 0x0", 2, 10),
        ("LDS.64 R134, [R6+0x28220]", "@P1 WARPGROUP.DEPBAR.LE gsb0, 0x0", 2, 50),
        ("FMUL R4, R4, R1", "FMUL R4, R4, R1", 1, 3),  # the kernel's end closes the last span
    ]
    assert kernel.spans[1].reasons == (("stall_long_sb", 40), ("stall_wait", 10))
