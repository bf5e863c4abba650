from __future__ import annotations

import pytest
import torch
from benchmarks.gdn_ab import largest_difference, main


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
