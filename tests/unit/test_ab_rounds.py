"""benchmarks.ab_rounds: the summary of an A/B run's rows (gdn_ab's JSON rows, as a GPU run writes them)."""

from __future__ import annotations

import pytest
from benchmarks.ab_rounds import main, summarize, table


def _row(label: str, ms: float, moved: float = 0.0) -> dict:
    return {"label": label, "device": "GPU", "B1 T32768 H32/32 max|do|": moved,
            "B1 T32768 H32/32 max|dstate|": moved / 2, "B1 T32768 H32/32 GPU ms": ms,
            "B1 T32768 H32/32 eager ms": ms + 0.01, "varlen 8x1024 H2/8 GPU ms": ms / 10, "seconds": 10.0,
            "B1 T32768 H32/32 gdn_prepare_kernel us": ms * 550, f"B1 T32768 H32/32 {label[:4]}_only_kernel us": 7.0}


def test_the_summary_compares_each_trees_best_and_keeps_the_spread() -> None:
    rows = [_row("base-1", 1.613), _row("change-1", 1.423, 0.0078), _row("base-2", 1.615), _row("change-2", 1.424)]
    first, second = summarize(rows)
    assert first.shape == "B1 T32768 H32/32"
    assert first.base_ms == (1.613, 1.615) and first.change_ms == (1.423, 1.424)
    assert first.change_percent == pytest.approx(100 * (1.423 / 1.613 - 1))
    assert first.largest_output_difference == pytest.approx(0.0078)
    assert second.shape == "varlen 8x1024 H2/8" and second.largest_output_difference == 0.0
    assert first.kernel_us == {"base_only_kernel": (7.0, None), "chan_only_kernel": (None, 7.0),
                               "gdn_prepare_kernel": (pytest.approx(1.613 * 550), pytest.approx(1.423 * 550))}
    assert second.kernel_us == {}
    text = table([first, second])
    assert ("| B1 T32768 H32/32 | 1.613-1.615 | 1.423-1.424 | -11.8% | 0.0078 | base_only_kernel 7 -> -, "
            "chan_only_kernel - -> 7, gdn_prepare_kernel 887 -> 783 |") in text


def test_a_slower_change_shows_a_positive_change() -> None:
    (result, _) = summarize([_row("base-1", 1.0), _row("change-1", 1.25)])
    assert result.change_percent == pytest.approx(25.0)


def test_missing_rows_are_named() -> None:
    with pytest.raises(ValueError, match="no rows labelled change"):
        summarize([_row("base-1", 1.0)])
    without_shape = _row("change-1", 1.0)
    del without_shape["varlen 8x1024 H2/8 GPU ms"]
    with pytest.raises(ValueError, match="same --case"):
        summarize([_row("base-1", 1.0), without_shape])


def test_rounds_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["HEAD", "--rounds", "0"])
    assert "--rounds must be at least 1, got 0" in capsys.readouterr().err


@pytest.mark.cpu_only
def test_a_tree_whose_run_fails_is_reported_with_its_error(tmp_path) -> None:
    # On a host without a GPU gdn_ab itself fails (it times CUDA calls): the failure must surface.
    from benchmarks.ab_rounds import REPOSITORY, run_tree

    with pytest.raises(RuntimeError, match=r"base-1: benchmarks.gdn_ab failed \(exit [1-9]"):
        run_tree("base-1", REPOSITORY / "src", tmp_path / "outputs", True, ["T32768"])


def test_each_run_times_the_gates_and_initial_state_asked_for(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    from benchmarks.ab_rounds import REPOSITORY, run_tree

    commands = []

    def record(command, **kwargs):
        commands.append(command)
        return subprocess.CompletedProcess(command, 0, stdout='{"label": "base-1"}\n', stderr="")

    monkeypatch.setattr(subprocess, "run", record)
    run_tree("base-1", REPOSITORY / "src", tmp_path, True, ["T32768"], "mixed")
    run_tree("base-2", REPOSITORY / "src", tmp_path, False, [])
    run_tree("base-3", REPOSITORY / "src", tmp_path, False, [], initial=True)
    assert commands[0][-2:] == ["--gates", "mixed"] and "--gates" not in commands[1]
    assert "--initial" not in commands[0] + commands[1] and commands[2][-1] == "--initial"
    run_tree("base-4", REPOSITORY / "src", tmp_path, False, [], extra=["2,16384,16,32", "7168+1024,2,8"])
    assert commands[3][-4:] == ["--shape", "2,16384,16,32", "--shape", "7168+1024,2,8"]
    assert "--shape" not in commands[0] + commands[1] + commands[2]


def test_a_bad_shape_is_refused_before_any_run(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.ab_rounds import main

    with pytest.raises(SystemExit):
        main(["HEAD", "--shape", "2,16384,16", "--out", str(tmp_path)])
    assert "a GDN shape is B,T,H,HV or L1+L2+...,H,HV (packed lengths), got '2,16384,16'" in capsys.readouterr().err
    assert not (tmp_path / "base-tree").exists()


def test_a_folder_holding_a_tree_is_the_base_as_it_is(tmp_path) -> None:
    from benchmarks.ab_rounds import base_source

    (tmp_path / "tree" / "src" / "polykernels").mkdir(parents=True)
    assert base_source(str(tmp_path / "tree"), tmp_path / "unused") == (tmp_path / "tree" / "src").resolve()
    assert not (tmp_path / "unused").exists()


def test_a_folder_that_is_not_a_tree_is_refused(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--out", str(tmp_path / "out")])
    assert "without src/polykernels" in capsys.readouterr().err


def test_another_tree_is_summarized_by_its_label() -> None:
    rows = [_row("base-1", 1.0), _row("change-1", 0.9), _row("order.v2-1", 0.8), _row("base-2", 1.0),
            _row("change-2", 0.95), _row("order.v2-2", 0.85)]
    (result, _) = summarize(rows, "order.v2")
    assert result.change_ms == (0.8, 0.85)
    assert result.change_percent == pytest.approx(-20.0)
    (working_tree, _) = summarize(rows)
    assert working_tree.change_ms == (0.9, 0.95)


def test_other_trees_take_a_new_plain_label_and_a_tree() -> None:
    from benchmarks.ab_rounds import other_trees

    assert other_trees(["order=var-d", "both.v2=build/both"]) == [("order", "var-d"), ("both.v2", "build/both")]
    for entry, complaint in (("var-d", "LABEL=TREE"), ("order=", "LABEL=TREE"), ("a-b=HEAD", "letters, digits"),
                             ("base=HEAD", "is taken"), ("change=HEAD", "is taken")):
        with pytest.raises(ValueError, match=complaint):
            other_trees([entry])
    with pytest.raises(ValueError, match="'order' is taken"):
        other_trees(["order=HEAD", "order=HEAD~1"])


def test_a_bad_other_tree_is_refused_before_any_run(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "tree" / "src" / "polykernels").mkdir(parents=True)
    with pytest.raises(SystemExit):
        main([str(tmp_path / "tree"), "--also", f"x={tmp_path}", "--out", str(tmp_path / "out")])
    assert "--also x" in capsys.readouterr().err and not (tmp_path / "out" / "rows.jsonl").exists()
