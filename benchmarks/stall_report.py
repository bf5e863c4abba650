"""python -m benchmarks.stall_report SOURCE.csv [--top N] [--context N] [--spans PERCENT]: where warps wait (ncu).

Profile before tuning: Nsight Compute samples each warp's stall reason per instruction. Export
its source page as CSV and this prints, per kernel, the share of every stall reason and the
instructions with the most samples (with the reason that dominates each). Reading the SASS
around the top instruction names the load or product the kernel waits on: ``--context N``
prints the N instructions before each (a load stalled on the long scoreboard right after a
burst of ``LDGSTS`` copies waits on those copies, not on its own data). ``--spans`` prints the
samples between one wait and the next (a thread barrier, a wait for tensor-core products, for
``cp.async`` groups or for an mbarrier), in program order: which stretch of a loop the time goes
to, where the hottest instructions alone name one line each. For the gated delta rule at the
bench's largest 32-head shape:

    ncu --clock-control none -k regex:gdn_ --launch-skip 2 --launch-count 2 --set full \\
        --import-source yes -o gdn python -m benchmarks.profile_target gdn 1 32768 32 32
    ncu --import gdn.ncu-rep --page source --csv --print-source sass > gdn_source.csv
    python -m benchmarks.stall_report gdn_source.csv --context 8
"""

from __future__ import annotations

import argparse
import csv
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_SAMPLES = "Warp Stall Sampling (All Samples)"


# Instructions a warp waits at for other warps or for asynchronous work: each ends a span (``--spans``).
_WAITS = ("BAR.SYNC", "WARPGROUP.DEPBAR", "DEPBAR", "SYNCS.PHASECHK")


@dataclass(frozen=True)
class Span:
    """The instructions from just after one wait up to and including the next (or the kernel's end)."""

    first: str  # the span's first instruction
    wait: str  # the instruction that ends it
    instructions: int
    samples: int
    reasons: tuple[tuple[str, int], ...]  # its largest stall reasons, largest first (up to three)


@dataclass(frozen=True)
class KernelStalls:
    kernel: str
    reasons: dict[str, float]  # stall reason -> share of all samples, largest first
    hottest: list[tuple[int, str, str]]  # (samples, dominant reason, instruction), most samples first
    before: list[tuple[str, ...]]  # the instructions just before each of ``hottest`` (``context`` of them)
    spans: list[Span]  # the whole kernel cut at each wait, in program order


def _int(text: str) -> int:
    try:
        return int(text.replace(",", "") or 0)
    except ValueError:
        return 0


def parse(rows: Iterable[list[str]], top: int = 10, context: int = 0) -> list[KernelStalls]:
    """Per kernel of an ncu source-page CSV export: stall shares, the hottest instructions and the
    ``context`` instructions before each (the export lists a kernel's SASS in program order)."""
    sections: list[tuple[str, list[list[str]]]] = []
    for row in rows:
        if row and row[0] == "Kernel Name":
            sections.append((row[1], []))
        elif sections:
            sections[-1][1].append(row)
    found = []
    for kernel, body in sections:
        if not body or _SAMPLES not in body[0]:
            raise ValueError(f"{kernel}: no '{_SAMPLES}' column; export with --page source --csv from a "
                             "report taken with --set full (or the SourceCounters section)")
        header, lines = body[0], [line for line in body[1:] if len(line) == len(body[0])]
        column = {name: i for i, name in enumerate(header)}
        reasons = [name for name in header if name.startswith("stall_") and "(Not Issued)" not in name]
        totals = _reason_counts(lines, column, reasons)
        samples = sum(totals.values()) or 1
        ranked = sorted(range(len(lines)), key=lambda i: -_int(lines[i][column[_SAMPLES]]))[:top]
        hottest = [(_int(lines[i][column[_SAMPLES]]), max(reasons, key=lambda r: _int(lines[i][column[r]])),
                    lines[i][column["Source"]].strip()) for i in ranked]
        before = [tuple(line[column["Source"]].strip() for line in lines[max(0, i - context):i]) if context else ()
                  for i in ranked]
        spans = _spans(lines, column, reasons)
        found.append(KernelStalls(kernel, {r: v / samples for r, v in totals.most_common() if v}, hottest, before,
                                  spans))
    return found


def _reason_counts(lines: list[list[str]], column: dict[str, int], reasons: list[str]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for line in lines:
        for reason in reasons:
            counts[reason] += _int(line[column[reason]])
    return counts


def _spans(lines: list[list[str]], column: dict[str, int], reasons: list[str]) -> list[Span]:
    spans: list[Span] = []
    start = 0
    for i, line in enumerate(lines):
        source = line[column["Source"]].strip()
        opcode = source.split()[1] if source.startswith("@") and len(source.split()) > 1 else source.split(" ")[0]
        if i == len(lines) - 1 or opcode.startswith(_WAITS):
            part = lines[start:i + 1]
            counts = _reason_counts(part, column, reasons)
            spans.append(Span(part[0][column["Source"]].strip(), source, len(part),
                              sum(_int(row[column[_SAMPLES]]) for row in part),
                              tuple((r, v) for r, v in counts.most_common(3) if v)))
            start = i + 1
    return spans


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stall_report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source_csv", type=Path, help="ncu --page source --csv --print-source sass output")
    parser.add_argument("--top", type=int, default=15, help="instructions to list per kernel")
    parser.add_argument("--context", type=int, default=0, help="instructions to show before each listed one")
    parser.add_argument("--spans", type=float, default=None, metavar="PERCENT",
                        help="also the stretches between waits holding at least PERCENT of the samples")
    args = parser.parse_args(argv)
    if args.top < 1 or args.context < 0:
        parser.error(f"--top must be at least 1 and --context at least 0, got {args.top} and {args.context}")
    if args.spans is not None and not 0 <= args.spans <= 100:
        parser.error(f"--spans takes a percentage from 0 to 100, got {args.spans}")
    with args.source_csv.open(newline="") as handle:
        report = parse(csv.reader(handle), args.top, args.context)
    for kernel in report:
        print(f"== {kernel.kernel}")
        for reason, share in list(kernel.reasons.items())[:10]:
            print(f"  {reason:24} {100 * share:5.1f}%")
        for (samples, reason, source), before in zip(kernel.hottest, kernel.before, strict=True):
            for earlier in before:
                print(f"  {'':8}  {'':16} | {earlier[:98]}")
            print(f"  {samples:8d}  {reason:16} {source[:100]}")
        if args.spans is not None:
            print_spans(kernel, args.spans)


def print_spans(kernel: KernelStalls, least_percent: float) -> None:
    total = sum(span.samples for span in kernel.spans) or 1
    print(f"  spans between waits with at least {least_percent:g}% of the samples (program order):")
    for span in kernel.spans:
        if 100 * span.samples / total >= least_percent:
            reasons = ", ".join(f"{reason.removeprefix('stall_')} {count}" for reason, count in span.reasons)
            print(f"  {100 * span.samples / total:5.1f}% {span.instructions:4d} instructions, from {span.first[:40]!r}"
                  f" to {span.wait[:40]!r}: {reasons}")


if __name__ == "__main__":
    main()
