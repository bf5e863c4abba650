"""Attestations in the release: the wheel's build provenance and its gate verdict, checked with
`gh attestation verify` against this repository and the release workflow.

The gate runner checks the wheel it downloaded was built by our workflow (its digest carries our
provenance) before it runs anything; publish trusts no report file, only the gate predicate whose
signature and subject (the wheel's sha256) `gh` verified.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from polykernels_build import gate
from polykernels_build.dist import GateReport, Wheel, arrived, write_atomically
from polykernels_build.errors import GateError, PublishError
from polykernels_build.settings import Settings
from polykernels_build.targets import Matrix, Target
from polykernels_build.tools import run
from polykernels_build.workflow_matrix import GATE_PREDICATE_TYPE, WORKFLOW

SLSA_PROVENANCE = "https://slsa.dev/provenance/v1"


def verify_command(wheel: Path, repo: str, predicate_type: str) -> list[str]:
    """What a user types too (README): signed by this repository's release workflow, for these bytes."""
    return ["gh", "attestation", "verify", str(wheel), "--repo", repo, "--signer-workflow", f"{repo}/{WORKFLOW}",
            "--predicate-type", predicate_type, "--format", "json"]


def verified_statements(settings: Settings, wheel: Wheel, repo: str, predicate_type: str, log: Path) -> list[dict]:
    """The in-toto statements gh verified for ``wheel`` (its sha256 is the subject gh matched)."""
    out = run(verify_command(wheel.path, repo, predicate_type), log=log, env=settings.tool_env,
              hint="gh (GitHub CLI) with GH_TOKEN set; the wheel must come from this repository's release workflow")
    start = out.find("[")
    results = json.loads(out[start:]) if start >= 0 else []
    statements = [r.get("verificationResult", {}).get("statement", {}) for r in results]
    good = [s for s in statements if s.get("predicateType") == predicate_type
            and any(sub.get("digest", {}).get("sha256") == wheel.sha256 for sub in s.get("subject", []))]
    if not good:
        raise GateError(f"{wheel.name}: no verified {predicate_type} attestation for sha256 {wheel.sha256[:16]}...",
                        log=log)
    return good


def verify_wheel(settings: Settings, target: Target, repo: str, log: Path) -> Wheel:
    """Gate runner, before anything runs: the downloaded wheel is the one our build job attested."""
    wheel = arrived(settings.dist_dir / target.name, target.name)
    verified_statements(settings, wheel, repo, SLSA_PROVENANCE, log)
    return wheel


def gate_predicate(settings: Settings, target: Target) -> Path:
    """The gate report for the exact wheel, as the predicate `actions/attest` signs against its digest."""
    wheel = arrived(settings.dist_dir / target.name, target.name)
    report = settings.reports.load(wheel.sha256)
    if report is None:
        raise GateError(f"{target.name}: no gate report for {wheel.name} (sha256 {wheel.sha256[:16]}...)",
                        hint=f"nox -s gate -- --wheel {wheel.path}")
    if report.target != target.name or report.wheel_sha256 != wheel.sha256:
        raise GateError(f"{target.name}: the gate report is for {report.target} {report.wheel_sha256[:16]}...")
    path = settings.build_dir / "attest" / target.name / "gate-report.json"
    write_atomically(path, json.dumps(asdict(report), indent=2))
    return path


def verified_gate_report(settings: Settings, matrix: Matrix, wheel: Wheel, repo: str, log: Path) -> GateReport:
    """The gate verdict from the attestation alone; kept in the report store only if it holds up."""
    reports = []
    for statement in verified_statements(settings, wheel, repo, GATE_PREDICATE_TYPE, log):
        report = GateReport.from_json(json.dumps(statement.get("predicate", {})), f"{wheel.name} attestation")
        if report.wheel_sha256 == wheel.sha256 and report.passed:
            reports.append(report)
    if not reports:
        raise PublishError(f"{wheel.name}: its verified gate attestations carry no passing report for these bytes")
    source = settings.build_dir / "attest" / "verified" / f"{reports[-1].wheel_sha256}.json"
    write_atomically(source, json.dumps(asdict(reports[-1]), indent=2))
    # gh verified the attestation's sigstore signature and its workflow identity: that is the signature
    # of this report, so it is kept with that basis recorded instead of an SSH signature.
    return gate.import_report(settings, matrix, source,
                              trust_unsigned=f"gate attestation of {repo}'s release workflow, verified by gh")
