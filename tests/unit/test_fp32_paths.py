"""benchmarks.fp32_paths: which path each form points fp32 inputs at (no GPU), and a small run of every form on
a GPU (its rows' errors within the spec's bound for fp32 inputs)."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchmarks import fp32_paths

from polykernels.gated_delta_rule import guards


@pytest.fixture
def guards_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """apply() sets guards' attributes for its whole process: put them back after the test."""
    monkeypatch.setattr(guards, "FP32_TRITON_MAX_KEY_DIM", guards.FP32_TRITON_MAX_KEY_DIM)
    monkeypatch.setattr(guards, "dot_precision", guards.dot_precision)


@pytest.mark.usefixtures("guards_restored")
def test_each_form_points_fp32_inputs_at_its_path() -> None:
    fp32_paths.apply("ieee")
    assert guards.choose("cuda", True, 128).path == "triton" and guards.dot_precision(True) == "ieee"
    fp32_paths.apply("tf32x3")
    assert guards.choose("cuda", True, 128).path == "triton" and guards.dot_precision(True) == "tf32x3"
    assert guards.dot_precision(False) != "tf32x3"  # 16-bit inputs keep their own
    fp32_paths.apply("torch")
    assert guards.choose("cuda", True, 64).path == "torch"
    assert guards.choose("cuda", False, 128).path == "triton"  # 16-bit inputs keep the Triton passes


@pytest.mark.usefixtures("guards_restored")
def test_bad_arguments_fail_before_anything_is_timed() -> None:
    with pytest.raises(ValueError, match="form must be one of"):
        fp32_paths.apply("tf32")
    with pytest.raises(ValueError, match="8,1024"):
        fp32_paths.main(["--shape", "8,1024"])
    with pytest.raises(SystemExit):
        fp32_paths.main(["--forms", "bf16"])


def test_a_form_whose_process_fails_says_so_and_the_others_still_run(capsys: pytest.CaptureFixture[str]) -> None:
    # K = 100 is no choice of the command line: each form's own process stops at its arguments (exit 2), on any host.
    assert fp32_paths.run(["ieee", "torch"], ["1,64,1,1"], 100, 0, None) == []
    captured = capsys.readouterr()
    assert "ieee: exit 2" in captured.err and "torch: exit 2" in captured.err and "--dim" in captured.err
    assert captured.out.startswith("| shape | form | ms |")


@pytest.mark.gpu
def test_every_form_runs_and_stays_within_the_fp32_bound(tmp_path: Path) -> None:
    rows = fp32_paths.run(fp32_paths.FORMS, ["2,256,2,4", "100+156,2,4"], 64, 1024, tmp_path / "rows.jsonl")
    assert sorted((row["form"], row["shape"]) for row in rows) == sorted(
        (form, shape) for form in fp32_paths.FORMS
        for shape in ("B2 T256 H2/4 K=V=64 fp32", "varlen 100+156 H2/4 K=V=64 fp32"))
    for row in rows:
        assert row["ms"] > 0 and row["o error"] < 1e-4 and row["state error"] < 1e-4, row
    assert (tmp_path / "rows.jsonl").read_text().count("\n") == len(rows)
