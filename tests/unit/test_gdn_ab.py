from __future__ import annotations

import pytest
import torch
from benchmarks.gdn_ab import largest_difference, main, shapes
from benchmarks.registry import GDN_SHAPES, gdn_shape


def test_largest_difference_is_zero_only_for_the_same_values() -> None:
    saved = torch.tensor([[1.0, -2.0], [float("nan"), 4.0]])
    assert largest_difference(saved.clone(), saved) == 0.0  # NaN where both are NaN is the same
    changed = saved.clone()
    changed[0, 1] = -2.5
    assert largest_difference(changed, saved) == pytest.approx(0.5)


def test_a_nan_on_one_side_only_is_an_infinite_difference() -> None:
    saved = torch.tensor([1.0, 2.0])
    assert largest_difference(torch.tensor([1.0, float("nan")]), saved) == float("inf")
    assert largest_difference(saved, torch.tensor([float("nan"), 2.0])) == float("inf")


def test_a_run_either_saves_or_compares(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["base"])
    assert "one of the arguments --save --compare is required" in capsys.readouterr().err


def test_an_unknown_gate_family_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["base", "--save", "out", "--gates", "none"])
    assert "argument --gates: invalid choice: 'none'" in capsys.readouterr().err


def test_shapes_outside_the_bench_are_parsed_by_their_spec() -> None:
    assert gdn_shape("2,16384,16,32") == ("B2 T16384 H16/32", 2, 16384, 16, 32, None)
    assert gdn_shape("7168+0+1024,2,8") == ("varlen 7168+0+1024 H2/8", 1, 8192, 2, 8, [7168, 0, 1024])
    for bad in ("2,16384,16", "2,x,16,32", "0,16,2,8", "2,16,3,8", "1024+-1,2,8", "1024,2,8"):
        with pytest.raises(ValueError, match="GDN shape"):
            gdn_shape(bad)


def test_a_run_times_the_cases_asked_for_then_the_extra_shapes(capsys: pytest.CaptureFixture[str]) -> None:
    assert shapes(None) == GDN_SHAPES  # neither: every bench shape
    assert [name for name, *_ in shapes(["varlen"])] == ["varlen 6144+2048 H2/8", "varlen 8x1024 H2/8"]
    assert [name for name, *_ in shapes(None, ["2,64,2,8"])] == ["B2 T64 H2/8"]  # only the extra
    assert [name for name, *_ in shapes(["8x1024"], ["2,64,2,8"])] == ["varlen 8x1024 H2/8", "B2 T64 H2/8"]
    with pytest.raises(SystemExit):
        main(["base", "--save", "out", "--shape", "1,2"])
    assert "got '1,2'" in capsys.readouterr().err
