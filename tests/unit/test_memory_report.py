"""benchmarks.memory_report reads Nsight Compute's --csv --metrics export (one row per launch and metric)."""

from __future__ import annotations

import csv
import io

import pytest
from benchmarks.memory_report import METRICS, parse, table

_HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
           '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')
_VALUES = {"gpu__time_duration.sum": ("ns", "393,536"),
           "dram__throughput.avg.pct_of_peak_sustained_elapsed": ("%", "79.34"),
           "lts__throughput.avg.pct_of_peak_sustained_elapsed": ("%", "95.78"),
           "l1tex__m_xbar2l1tex_read_bytes.sum": ("byte", "2,282,749,952"),
           "lts__t_sector_hit_rate.pct": ("%", "37.63"),
           "dram__bytes_read.sum": ("Gbyte", "1.23"),
           "dram__bytes_write.sum": ("Mbyte", "275.03")}


def _rows(launch: str, kernel: str, skip: str = "") -> list[str]:
    return [f'"{launch}","713","python3","host","{kernel}","1","7","(256, 1, 1)","(1, 8, 32)","0","9.0",'
            f'"Command line profiler metrics","{name}","{unit}","{value}"'
            for name, (unit, value) in _VALUES.items() if name != skip]


def _parse(lines: list[str]):
    return parse(csv.reader(io.StringIO("\n".join(lines))))


def test_one_row_per_launch_in_us_and_gb() -> None:
    lines = ["==PROF== Connected to process 713", _HEADER, *_rows("0", "gdn_prepare_hopper_kernel"),
             *_rows("1", "gdn_recurrence_hopper_rs_kernel")]
    prepare, recurrence = _parse(lines)
    assert (prepare.launch, prepare.kernel, recurrence.kernel) == ("0", "gdn_prepare_hopper_kernel",
                                                                   "gdn_recurrence_hopper_rs_kernel")
    assert recurrence.us == pytest.approx(393.536)
    assert (recurrence.dram_percent, recurrence.l2_percent, recurrence.l2_hit_percent) == (79.34, 95.78, 37.63)
    assert recurrence.l2_to_sm_gb == pytest.approx(2.282749952)
    assert recurrence.dram_gb == pytest.approx(1.23 + 0.27503)
    assert "| 1 | gdn_recurrence_hopper_rs_kernel | 393.5 | 79.3 | 95.8 | 2.28 | 37.6 | 1.51 |" in table([recurrence])


def test_a_launch_missing_a_metric_is_named() -> None:
    with pytest.raises(ValueError, match=r"launch 3 \(gdn_prepare_hopper_kernel\): no lts__t_sector_hit_rate.pct"):
        _parse([_HEADER, *_rows("3", "gdn_prepare_hopper_kernel", skip="lts__t_sector_hit_rate.pct")])


def test_an_export_without_metrics_is_refused() -> None:
    with pytest.raises(ValueError, match="Metric Name"):
        _parse(['"Kernel Name","gdn_prepare_kernel",', '"Address","Source"'])


def test_the_metrics_to_collect_cover_every_column() -> None:
    assert len(set(METRICS)) == 7 and all(name in _VALUES for name in METRICS)
