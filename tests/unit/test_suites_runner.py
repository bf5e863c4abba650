from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from polykernels.suites import runner


def test_absent_suite_is_reported_absent_not_passed(monkeypatch) -> None:
    monkeypatch.setitem(runner.SUITE_MODULES, "future_suite", "polykernels.suites.does_not_exist")
    report = runner.run_suites(["future_suite"], torch.device("cpu"))
    assert report.suites[0].status == "absent"
    assert report.passed is False


def test_suite_crash_is_a_failure_with_reason(monkeypatch) -> None:
    monkeypatch.setitem(runner.SUITE_MODULES, "broken", "polykernels.suites.report")  # has no run()
    report = runner.run_suites(["broken"], torch.device("cpu"))
    assert report.suites[0].status == "failed"
    assert "AttributeError" in report.suites[0].reason


def test_cli_writes_report_and_exit_status(tmp_path: Path) -> None:
    report_path = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, "-m", "polykernels.suites", "--only", "int4_parity", "--report", str(report_path)],
        capture_output=True, text=True, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(report_path.read_text())
    assert report["passed"] is True
    suite = report["suites"][0]
    assert suite["name"] == "int4_parity" and len(suite["cases"]) == 144
    assert report["platform"]["backend"] in ("cpu", "cuda", "rocm")


def test_cli_rejects_unknown_suite() -> None:
    proc = subprocess.run([sys.executable, "-m", "polykernels.suites", "--only", "nope"], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 2 and "invalid choice" in proc.stderr
