"""benchmarks.run --render: one table from the row logs of runs split by a time limit (no GPU needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmarks.run import bench_command, main, render, to_markdown


def _about(date: str, copy: float, device: str = "NVIDIA H200", triton: str = "3.6.0") -> dict:
    return {"run": {"date": date, "device": device, "versions": {"torch": "2.11.0", "triton": triton},
                    "copy_gb_per_s": copy, "launch_floor_host_us": 8.0, "command": "nox -s bench -- --only gdn"}}


def _row(case: str, impl: str, copy: float) -> dict:
    return {"family": "chunk_gated_delta_rule", "case": case, "impl": impl, "eager_ms": 1.4, "graph_ms": 1.37,
            "host_us": 60.0, "gb_per_s": 786.3, "pct_of_copy": 18.6, "tflop_per_s": 200.1,
            "polykernels_speedup_eager": 1.0, "polykernels_speedup_graph": 1.0, "copy_gb_per_s": copy,
            "launch_floor_host_us": 8.0, "date": "2026-12-02T01:14:56+00:00"}


def _log(folder: Path, *lines: dict) -> Path:
    folder.mkdir(parents=True)
    (folder / "rows.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return folder / "rows.jsonl"


def test_rows_of_two_runs_make_one_table_that_names_both_runs(tmp_path: Path) -> None:
    first = _log(tmp_path / "a", _about("2026-12-02T01:10:00+00:00", 4221.7), _row("B1 T32768", "polykernels", 4221.7),
                 _row("B1 T32768", "FLA", 4221.7))
    second = _log(tmp_path / "b", _about("2026-12-02T01:20:00+00:00", 4230.0), _row("varlen 8x1024", "polykernels",
                                                                                     4230.0))
    result = render([first, second])
    assert [(row["case"], row["impl"]) for row in result["rows"]] == [
        ("B1 T32768", "polykernels"), ("B1 T32768", "FLA"), ("varlen 8x1024", "polykernels")]
    assert result["date"] == "2026-12-02T01:20:00+00:00" and result["copy_gb_per_s"] == 4230.0
    text = to_markdown(result)
    assert text.startswith("Rows from 2 runs on one device")
    assert "2026-12-02T01:10:00+00:00 (copy 4221.7 GB/s" in text and "| varlen 8x1024 | polykernels |" in text


@pytest.mark.parametrize(("field", "other"), [("device", {"device": "NVIDIA H100"}), ("versions", {"triton": "3.7.0"})])
def test_runs_on_another_device_or_release_are_refused(tmp_path: Path, field: str, other: dict) -> None:
    first = _log(tmp_path / "a", _about("2026-12-02T01:10:00+00:00", 4221.7), _row("B1", "polykernels", 4221.7))
    second = _log(tmp_path / "b", _about("2026-12-02T01:20:00+00:00", 4230.0, **other), _row("B8", "polykernels", 1.0))
    with pytest.raises(ValueError, match=f"different {field}"):
        render([first, second])


def test_a_log_without_its_run_line_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _log(tmp_path / "old", _row("B1", "polykernels", 4221.7))
    with pytest.raises(SystemExit):
        main(["--render", str(tmp_path / "old")])
    assert "not a rows log of benchmarks.run" in capsys.readouterr().err


def test_render_writes_the_table_without_a_gpu(tmp_path: Path) -> None:
    _log(tmp_path / "a", _about("2026-12-02T01:10:00+00:00", 4221.7), _row("B1 T32768", "polykernels", 4221.7))
    assert main(["--render", str(tmp_path / "a"), "--out", str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "results.json").read_text())["rows"][0]["case"] == "B1 T32768"
    assert "| B1 T32768 | polykernels |" in (tmp_path / "out" / "results.md").read_text()


@pytest.mark.parametrize(("argv", "command"), [
    (["--out", "/some/host/folder", "--only", "gdn"], "nox -s bench -- --only gdn"),
    (["--only", "gdn", "--out=/some/host/folder", "--case", "varlen"], "nox -s bench -- --only gdn --case varlen"),
    (["--out", "/some/host/folder"], "nox -s bench"),
    ([], "nox -s bench"),
])
def test_a_runs_command_names_what_ran_not_where_its_rows_went(argv: list[str], command: str) -> None:
    assert bench_command(argv) == command
