"""python -m benchmarks.memory_report METRICS.csv: where a kernel's bytes go, from ncu's metrics.

Before moving bytes around, see which level is full: a pass whose L2 runs near its peak gains from
fewer duplicate tile reads (the register-state pass at B8 T4096 did: BENCHMARKS.md, seventeenth set),
one at half of it waits on something else. Collect the metrics below for a kernel's launches and
print one row per launch (time, DRAM and L2 as % of peak, what the SMs read from L2, the L2 hit rate):

    ncu --clock-control none -k regex:gdn_ --launch-skip 2 --launch-count 2 --csv \\
        --metrics "$(python -m benchmarks.memory_report --metrics)" \\
        python -m benchmarks.profile_target gdn 1 32768 32 32 > gdn_metrics.csv
    python -m benchmarks.memory_report gdn_metrics.csv
"""

from __future__ import annotations

import argparse
import csv
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

DURATION = "gpu__time_duration.sum"
DRAM_PERCENT = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
L2_PERCENT = "lts__throughput.avg.pct_of_peak_sustained_elapsed"
L2_TO_SM = "l1tex__m_xbar2l1tex_read_bytes.sum"
L2_HIT = "lts__t_sector_hit_rate.pct"
DRAM_READ = "dram__bytes_read.sum"
DRAM_WRITE = "dram__bytes_write.sum"
METRICS = (DURATION, DRAM_PERCENT, L2_PERCENT, L2_TO_SM, L2_HIT, DRAM_READ, DRAM_WRITE)
_SCALE = {"ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3,
          "byte": 1e-9, "Kbyte": 1e-6, "Mbyte": 1e-3, "Gbyte": 1.0}  # to us and GB


@dataclass(frozen=True)
class LaunchBytes:
    launch: str  # ncu's launch ID
    kernel: str
    us: float
    dram_percent: float
    l2_percent: float
    l2_to_sm_gb: float
    l2_hit_percent: float
    dram_gb: float  # read and written


def _number(value: str, unit: str) -> float:
    return float(value.replace(",", "")) * _SCALE.get(unit, 1.0)


def parse(rows: Iterable[list[str]]) -> list[LaunchBytes]:
    """One entry per launch of an ncu ``--csv --metrics`` export (one row per launch and metric),
    in launch order; a launch missing one of METRICS is an error naming it."""
    rows = iter(rows)
    header = next((row for row in rows if "Metric Name" in row), None)
    if header is None:
        raise ValueError("no 'Metric Name' column: export with ncu --csv --metrics ...")
    column = {name: i for i, name in enumerate(header)}
    values: dict[str, dict[str, float]] = {}
    names: dict[str, str] = {}
    for row in rows:
        if len(row) != len(header):
            continue
        launch = row[column["ID"]]
        names[launch] = row[column["Kernel Name"]]
        values.setdefault(launch, {})[row[column["Metric Name"]]] = _number(row[column["Metric Value"]],
                                                                             row[column["Metric Unit"]])
    found = []
    for launch, metric in values.items():
        missing = [name for name in METRICS if name not in metric]
        if missing:
            raise ValueError(f"launch {launch} ({names[launch]}): no {', '.join(missing)}; collect --metrics "
                             f"{','.join(METRICS)}")
        found.append(LaunchBytes(launch, names[launch], metric[DURATION], metric[DRAM_PERCENT], metric[L2_PERCENT],
                                 metric[L2_TO_SM], metric[L2_HIT], metric[DRAM_READ] + metric[DRAM_WRITE]))
    return found


def table(launches: Iterable[LaunchBytes]) -> str:
    lines = ["| launch | kernel | us | DRAM % | L2 % | L2 to SM GB | L2 hit % | DRAM GB |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {b.launch} | {b.kernel} | {b.us:.1f} | {b.dram_percent:.1f} | {b.l2_percent:.1f} | "
              f"{b.l2_to_sm_gb:.2f} | {b.l2_hit_percent:.1f} | {b.dram_gb:.2f} |" for b in launches]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory_report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("metrics_csv", type=Path, nargs="?", help="ncu --csv --metrics output")
    parser.add_argument("--metrics", action="store_true", help="print the metrics to collect, for ncu --metrics")
    args = parser.parse_args(argv)
    if args.metrics:
        print(",".join(METRICS))
        return
    if args.metrics_csv is None:
        parser.error("give the ncu CSV to read, or --metrics")
    with args.metrics_csv.open(newline="") as handle:
        print(table(parse(csv.reader(handle))))


if __name__ == "__main__":
    main()
