"""benchmarks.sustained: what the nvidia-smi samples taken beside a back-to-back replay say."""

from __future__ import annotations

from benchmarks.sustained import summarize


def test_samples_give_the_clock_range_and_the_power_capped_ones() -> None:
    lines = ["1980, 566.2, 0x0000000000000000", "1365, 709.1, 0x0000000000000004",
             "1500, 702.0, 0x0000000000000005", "not a sample"]
    assert summarize(lines) == {"samples": 3, "sm_clock_mhz_min": 1365, "sm_clock_mhz_max": 1980,
                                "power_w_max": 709.1, "power_capped_samples": 2}


def test_no_samples_say_so() -> None:
    assert summarize([]) == {"samples": 0}
