"""A built wheel and its gate reports: made once by the build, handed to the gate and to publish.

``Wheel`` is the wheel's identity (path, sha256 computed once, manifest, target). The build
writes it beside the file (``<wheel>.json``), so a later `publish` or `gate --import-report`
reads what the build recorded instead of rediscovering wheels and hashing them again.
``ReportStore`` keeps one gate report per sha256 under build/reports, written atomically, with
its SSH signature beside it (``<sha256>.json.sig``) or, for a report an operator chose to trust
without one, the recorded trust (``<sha256>.trust.json``).

Everything read from disk here is input: a malformed record, report or wheel name is a
``FatalError`` naming the file, never a traceback.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import tempfile
import zipfile
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from polykernels_build.errors import ConfigError, GateError
from polykernels_build.signing import Keyring

PROJECT = "polykernels"
MANIFEST_MEMBER = "polykernels/_build_info.json"
SHA256 = re.compile(r"^[0-9a-f]{64}$")
GATE_SCHEMA = 1
REQUIRED_SUITES = ("qwen_generation", "flux_warmup", "int4_parity")


def write_atomically(path: Path, text: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode() if isinstance(text, str) else text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def wheel_version(name: str, source: str = "") -> Version:
    """The version a polykernels wheel's file name carries (its local label is the variant)."""
    try:
        project, version, _, _ = parse_wheel_filename(name)
    except InvalidWheelFilename as exc:
        raise GateError(f"{source or name}: {name!r} is not a wheel file name ({exc})") from None
    if project != canonicalize_name(PROJECT):
        raise GateError(f"{source or name}: {name!r} is a wheel of {project!r}, not of {PROJECT}")
    return version


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
    def version(self) -> Version:
        return wheel_version(self.name, str(self.path))

    @property
    def label(self) -> str | None:
        """The local version label of the file name (``cu130`` in ``0.1.0+cu130``)."""
        return self.version.local

    @property
    def size(self) -> int:
        return self.path.stat().st_size

    @property
    def record(self) -> Path:
        return self.path.with_name(self.path.name + ".json")

    @classmethod
    def open(cls, path: Path) -> Wheel:
        """Reads the manifest and hashes the file: the one time a wheel's bytes are read for its identity."""
        wheel_version(path.name, str(path))
        try:
            with zipfile.ZipFile(path) as archive:
                manifest = json.loads(archive.read(MANIFEST_MEMBER))
        except (KeyError, zipfile.BadZipFile, FileNotFoundError, ValueError, OSError) as exc:
            raise GateError(f"{path} is not a polykernels wheel with a build manifest ({exc})") from None
        if not isinstance(manifest, dict) or not isinstance(manifest.get("target"), str):
            raise GateError(f"{path}: its build manifest names no target")
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
        try:
            data = json.loads(record.read_text())
            name, sha, manifest = data["name"], data["sha256"], data["manifest"]
        except (ValueError, KeyError, TypeError, OSError) as exc:
            raise GateError(f"{record} is not a build record ({type(exc).__name__}: {exc})",
                            hint="rebuild the target (nox -s wheel), or remove the file") from None
        if not (isinstance(name, str) and isinstance(sha, str) and SHA256.match(sha) and isinstance(manifest, dict)
                and isinstance(manifest.get("target"), str) and record.name == f"{name}.json"):
            raise GateError(f"{record} is not a build record of its wheel (name, sha256 or manifest is wrong)",
                            hint="rebuild the target (nox -s wheel), or remove the file")
        wheel_version(name, str(record))
        wheel = Wheel(path=record.with_name(name), sha256=sha, manifest=manifest)
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


def judge(suites: Any, source: str = "the suites report") -> tuple[bool, str]:
    """The verdict on a suites report: every required suite passed, each reported exactly once.

    A suite listed twice (failed, then passed) is refused: no report gets to pick its verdict."""
    entries = suites.get("suites") if isinstance(suites, dict) else None
    if not isinstance(entries, list) or not all(
            isinstance(e, dict) and isinstance(e.get("name"), str) and isinstance(e.get("status"), str)
            for e in entries):
        raise GateError(f"{source}: `suites` must be a list of {{name, status}} entries")
    names = [e["name"] for e in entries]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise GateError(f"{source}: suites reported more than once: {duplicated}")
    by_name = {e["name"]: e for e in entries}
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
        wrong = [f"{name} ({expected})" for name, expected, ok in (
            ("wheel_sha256", "64 hex digits", isinstance(data["wheel_sha256"], str)
             and SHA256.match(data["wheel_sha256"])),
            ("passed", "true or false", isinstance(data["passed"], bool)),
            ("seconds", "a number",
             isinstance(data["seconds"], (int, float)) and not isinstance(data["seconds"], bool)),
            ("suites", "an object", isinstance(data.get("suites", {}), dict)),
            *((name, "a string", isinstance(data[name], str)) for name in (
                "wheel_name", "target", "variant", "hardware_class", "runtime", "host", "reason", "created_at")),
        ) if not ok]
        if wrong:
            raise GateError(f"{source}: malformed fields: {', '.join(wrong)}")
        report = cls(**{k: v for k, v in data.items() if k in known})
        wheel_version(report.wheel_name, source)
        return report


@dataclass(frozen=True, kw_only=True)
class TrustedReport:
    """A stored report and why publish may believe it: who signed it, or who chose to trust it unsigned."""

    report: GateReport
    signer: str | None
    trust: dict[str, Any] | None = None

    @property
    def basis(self) -> str:
        if self.signer:
            return f"signed by {self.signer}"
        return f"UNSIGNED, trusted on import: {self.trust.get('reason') if self.trust else '?'}"


@dataclass(frozen=True)
class ReportStore:
    directory: Path
    keyring: Keyring

    def path(self, sha256: str) -> Path:
        return self.directory / f"{sha256}.json"

    def signature_path(self, sha256: str) -> Path:
        return self.directory / f"{sha256}.json.sig"

    def trust_path(self, sha256: str) -> Path:
        return self.directory / f"{sha256}.trust.json"

    def store(self, report: GateReport) -> Path:
        """A report this host's gate made: written and signed with this host's gate key."""
        text = json.dumps(asdict(report), indent=2)
        return self.keep(report, text.encode(), self.keyring.sign(text.encode()), trust=None)

    def keep(self, report: GateReport, data: bytes, signature: bytes | None, trust: dict[str, Any] | None) -> Path:
        """Keeps a report's exact bytes with its signature, or with the operator's recorded trust."""
        sha = report.wheel_sha256
        self.trust_path(sha).unlink(missing_ok=True)
        self.signature_path(sha).unlink(missing_ok=True)
        if signature is not None:
            write_atomically(self.signature_path(sha), signature)
        if trust is not None:
            record = {**trust, "recorded_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
            write_atomically(self.trust_path(sha), json.dumps(record, indent=2))
        path = self.path(sha)
        write_atomically(path, data)
        return path

    def exists(self, sha256: str) -> bool:
        return self.path(sha256).exists()

    def load(self, sha256: str) -> GateReport | None:
        """The report as stored, not yet believed: publish uses ``trusted``."""
        path = self.path(sha256)
        return GateReport.from_json(path.read_text(), str(path)) if path.exists() else None

    def trusted(self, sha256: str) -> TrustedReport | None:
        """The report for ``sha256`` with the basis for believing it, or a GateError saying why not."""
        path = self.path(sha256)
        if not path.exists():
            return None
        data = path.read_bytes()
        report = GateReport.from_json(data.decode(errors="replace"), str(path))
        if report.wheel_sha256 != sha256:
            raise GateError(f"{path} is a report for sha256 {report.wheel_sha256[:16]}..., not for its file name")
        trust_file = self.trust_path(sha256)
        if trust_file.exists():
            try:
                trust = json.loads(trust_file.read_text())
            except ValueError:
                raise GateError(f"{trust_file} is not JSON") from None
            if not isinstance(trust, dict) or trust.get("sha256_of_report") != sha256_of(path):
                raise GateError(f"{trust_file} does not record trust in {path} as it is now")
            return TrustedReport(report=report, signer=None, trust=trust)
        signature = self.signature_path(sha256)
        signer = self.keyring.verify(data, signature.read_bytes() if signature.exists() else None, str(path))
        return TrustedReport(report=report, signer=signer)
