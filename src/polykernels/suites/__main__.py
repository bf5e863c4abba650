"""python -m polykernels.suites [--only NAME ...] [--report FILE] [--device auto|cpu|cuda]."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from polykernels.suites.report import write_atomically
from polykernels.suites.runner import SUITE_MODULES, resolve_device, run_suites


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m polykernels.suites", description=__doc__)
    parser.add_argument("--only", action="append", choices=sorted(SUITE_MODULES), help="run only this suite")
    parser.add_argument("--report", type=Path, help="write the JSON report here")
    parser.add_argument("--device", default="auto", help="auto (GPU when present), cpu, cuda or cuda:N")
    args = parser.parse_args(argv)
    try:
        device = resolve_device(args.device)
    except (ValueError, RuntimeError) as exc:
        parser.error(str(exc))
    report = run_suites(args.only or list(SUITE_MODULES), device)
    for suite in report.suites:
        cases = f"{sum(c.passed for c in suite.cases)}/{len(suite.cases)} cases" if suite.cases else ""
        print(f"{suite.name:16} {suite.status:7} {suite.seconds:7.1f}s  {cases}  {suite.reason}".rstrip())
    print(f"device {report.device}; polykernels at {report.package_path}")
    if args.report:
        write_atomically(args.report, report.to_json())
        print(f"report: {args.report}")
    print("suites passed" if report.passed else "suites FAILED")
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
