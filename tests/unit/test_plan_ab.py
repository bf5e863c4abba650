"""benchmarks.plan_ab's arguments: what it would time, checked before anything is timed (no GPU)."""

from __future__ import annotations

import argparse

import pytest
from benchmarks import plan_ab


def test_a_constant_takes_its_values_as_python_literals() -> None:
    assert plan_ab.parse_values("CONCURRENT_PAIRS_MIN_CHUNKS=128,16") == ("CONCURRENT_PAIRS_MIN_CHUNKS", [128, 16])
    assert plan_ab.parse_values("HOPPER_CONCURRENT_PACKED=False,True") == ("HOPPER_CONCURRENT_PACKED", [False, True])
    for bad in ("=1,2", "NAME", "NAME=", "NAME=1,two", "2NAME=1"):
        with pytest.raises(argparse.ArgumentTypeError, match="--set"):
            plan_ab.parse_values(bad)


def test_segment_counts_name_the_plans_own_as_default() -> None:
    assert plan_ab.parse_segments("default,2,3") == [None, 2, 3]
    for bad in ("0", "-1", "two", "default,"):
        with pytest.raises(argparse.ArgumentTypeError, match="--segments"):
            plan_ab.parse_segments(bad)


def test_the_first_variant_is_the_reference_and_a_constant_forces_no_count() -> None:
    runs = list(plan_ab.variants(("CONCURRENT_PAIRS_MIN_CHUNKS", [128, 16]), [None]))
    assert runs == [{"constant": "CONCURRENT_PAIRS_MIN_CHUNKS", "value": 128, "num_segments": None},
                    {"constant": "CONCURRENT_PAIRS_MIN_CHUNKS", "value": 16, "num_segments": None}]
    assert list(plan_ab.variants(None, [None, 2])) == [{"num_segments": None}, {"num_segments": 2}]


def test_bad_arguments_fail_before_anything_is_timed(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--shape", "8,1024,2,8"],  # neither --set nor --segments
                 ["--set", "A=1", "--segments", "2", "--shape", "8,1024,2,8"],
                 ["--segments", "2", "--shape", "8,1024,2,8", "--gates", "warm"]):
        with pytest.raises(SystemExit):
            plan_ab.main(argv)
    with pytest.raises(ValueError, match="8,1024"):
        plan_ab.main(["--segments", "2", "--shape", "8,1024"])
