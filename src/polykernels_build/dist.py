"""A built wheel and its gate reports: made once by the build, handed to the gate and to publish.

``Wheel`` is the wheel's identity (path, sha256 computed once, manifest, target). The build
writes it beside the file (``<wheel>.json``), so a later `publish` or `gate --import-report`
reads what the build recorded instead of rediscovering wheels and hashing them again.
``ReportStore`` keeps one gate report per sha256 under build/reports, written atomically.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from polykernels_build.errors import ConfigError, GateError

MANIFEST_MEMBER = "polykernels/_build_info.json"
GATE_SCHEMA = 1
REQUIRED_SUITES = ("qwen_generation", "flux_warmup", "int4_parity")


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


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True, kw_only=True)
class Wheel:
    path: Path
    sha256: str
    manifest: dict[str, Any]

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def target(self) -> str:
        return str(self.manifest["target"])

    @property
    def size(self) -> int:
        return self.path.stat().st_size

    @property
    def record(self) -> Path:
        return self.path.with_name(self.path.name + ".json")

    @classmethod
    def open(cls, path: Path) -> Wheel:
        """Reads the manifest and hashes the file: the one time a wheel's bytes are read for its identity."""
        try:
            with zipfile.ZipFile(path) as archive:
                manifest = json.loads(archive.read(MANIFEST_MEMBER))
        except (KeyError, zipfile.BadZipFile, FileNotFoundError) as exc:
            raise GateError(f"{path} is not a polykernels wheel with a build manifest ({exc})") from None
        return cls(path=path, sha256=sha256_of(path), manifest=manifest)

    def save(self) -> Wheel:
        """Records the identity beside the file, for verbs that run after the build."""
        write_atomically(self.record, json.dumps({"name": self.name, "sha256": self.sha256,
                                                  "manifest": self.manifest}, indent=2))
        return self

    def unchanged(self) -> bool:
        """Whether the file still has the bytes it was built (and gated) with: checked once, at publish."""
        return self.path.is_file() and sha256_of(self.path) == self.sha256


def built(dist_dir: Path) -> dict[str, Wheel]:
    """sha256 -> Wheel, for every wheel the build recorded under ``dist_dir``."""
    wheels = {}
    for record in sorted(dist_dir.glob("*/*.whl.json")):
        data = json.loads(record.read_text())
        wheel = Wheel(path=record.with_name(data["name"]), sha256=data["sha256"], manifest=data["manifest"])
        wheels[wheel.sha256] = wheel
    return wheels


def arrived(directory: Path, target: str) -> Wheel:
    """The one wheel a release job received for ``target`` under ``directory`` (a downloaded artifact).

    Opened from its bytes, not from the record that travelled with it: the digest a job attests or
    verifies is of the file it holds. Recorded again, for the verbs that run after it in the job.
    """
    found = sorted(directory.glob("*.whl"))
    if len(found) != 1:
        raise ConfigError(f"{target}: expected exactly one wheel under {directory}, found "
                        f"{[p.name for p in found] or 'none'}", hint=f'nox -s "wheel({target})"')
    wheel = Wheel.open(found[0])
    if wheel.target != target:
        raise GateError(f"{wheel.name} was built for {wheel.target}, not {target}")
    return wheel.save()


def judge(suites: dict[str, Any]) -> tuple[bool, str]:
    """The verdict on a suites report: every required suite passed."""
    by_name = {s["name"]: s for s in suites.get("suites", [])}
    problems = [f"{name}: {by_name[name]['status'] if name in by_name else 'not run'}"
                for name in REQUIRED_SUITES if by_name.get(name, {}).get("status") != "passed"]
    return not problems, "; ".join(problems) or "all suites passed"


@dataclass(kw_only=True)
class GateReport:
    schema: int = GATE_SCHEMA
    wheel_sha256: str
    wheel_name: str
    target: str
    variant: str
    hardware_class: str  # nvidia | gfx942 | gfx950 | cpu
    runtime: str
    host: str
    passed: bool
    reason: str
    seconds: float
    created_at: str
    suites: dict[str, Any] = field(default_factory=dict)  # the report `python -m polykernels.suites` wrote

    @classmethod
    def from_json(cls, text: str, source: str) -> GateReport:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise GateError(f"{source} is not JSON: {exc}") from None
        if not isinstance(data, dict) or data.get("schema") != GATE_SCHEMA:
            raise GateError(f"{source} is not a polykernels gate report (schema {GATE_SCHEMA})")
        known = {f.name for f in dataclasses.fields(cls)}
        missing = known - set(data) - {"suites"}
        if missing:
            raise GateError(f"{source} lacks {sorted(missing)}")
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class ReportStore:
    directory: Path

    def path(self, sha256: str) -> Path:
        return self.directory / f"{sha256}.json"

    def store(self, report: GateReport) -> Path:
        path = self.path(report.wheel_sha256)
        write_atomically(path, json.dumps(asdict(report), indent=2))
        return path

    def load(self, sha256: str) -> GateReport | None:
        path = self.path(sha256)
        return GateReport.from_json(path.read_text(), str(path)) if path.exists() else None
