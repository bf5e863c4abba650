"""The suites' report: typed, versioned, written atomically (temporary file + os.replace)."""

from __future__ import annotations

import json
import os
import platform as py_platform
import tempfile
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

REPORT_SCHEMA = 1
Status = Literal["passed", "failed", "absent"]


@dataclass(kw_only=True)
class CaseResult:
    name: str
    passed: bool
    detail: str = ""
    seconds: float = 0.0
    metrics: dict[str, Any] = field(default_factory=dict)


@dataclass(kw_only=True)
class SuiteResult:
    name: str
    status: Status
    reason: str = ""
    seconds: float = 0.0
    cases: list[CaseResult] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_cases(cls, name: str, cases: list[CaseResult], seconds: float, **metrics: Any) -> SuiteResult:
        failed = [c.name for c in cases if not c.passed]
        if not cases:
            return cls(name=name, status="failed", reason="no case ran", seconds=seconds, metrics=metrics)
        return cls(
            name=name,
            status="failed" if failed else "passed",
            reason=f"{len(failed)} of {len(cases)} cases failed: {', '.join(failed[:5])}" if failed else "",
            seconds=seconds,
            cases=cases,
            metrics=metrics,
        )


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": py_platform.python_version()}
    for name in ("polykernels", "torch", "triton", "transformers", "diffusers", "numpy"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


@dataclass(kw_only=True)
class Report:
    schema: int = REPORT_SCHEMA
    passed: bool
    platform: dict[str, Any]
    device: str
    versions: dict[str, str | None]
    build_info: dict[str, Any] | None
    package_path: str
    suites: list[SuiteResult]
    started_at: str
    seconds: float

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=False)


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
