"""publish: a wheel goes out only with a passing, signed gate report for its exact bytes, run on its
hardware class, or, for a target that has no report at all, with an explicit waiver that is
recorded in the index, the release notes and the upload record.

The rules, in the order ``decide`` applies them:
- the file name's label (``+cu130``) must be the variant of the manifest inside and of its target;
- a report must verify (signed by an allowed signer, or trusted on import with a recorded reason),
  pass every suite, and have run on hardware that can gate the target;
- a waiver covers only a target whose wheel has no report: a report that failed, or ran on the
  wrong hardware, is a verdict, and no waiver overrides it;
- each wheel is copied once into a stage and the copy's sha256 must equal the gated one (index.py).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from polykernels_build import backends, index
from polykernels_build.dist import Wheel, built, judge, write_atomically
from polykernels_build.errors import ConfigError, FatalError, PublishError
from polykernels_build.settings import Settings
from polykernels_build.targets import Matrix
from polykernels_build.tools import run

MIN_WAIVER_REASON = 10


@dataclass(frozen=True, kw_only=True)
class Decision:
    wheel: Wheel
    target: str
    variant: str
    publish: bool
    basis: str  # "gate report <sha> ...", "WAIVED: <reason>", or why it is blocked
    waived: bool = False


def check_waivers(matrix: Matrix, waivers: dict[str, str]) -> None:
    unknown = set(waivers) - set(matrix.targets)
    if unknown:
        raise ConfigError(f"--waive names unknown targets {sorted(unknown)}; targets: {', '.join(matrix.targets)}")
    for target, reason in waivers.items():
        if len(reason.strip()) < MIN_WAIVER_REASON:
            raise ConfigError(f"--waive {target}: the reason must say why in words (at least {MIN_WAIVER_REASON} "
                              "characters); it is published with the release")


def _label_problem(wheel: Wheel, variant: str) -> str | None:
    """The file name's label, the manifest's variant and the target's variant must be one."""
    label, declared = wheel.label, wheel.manifest.get("variant")
    if label != declared or declared != variant:
        return (f"{wheel.name} is labelled +{label}, its manifest says variant {declared!r}, its target "
                f"{wheel.target} publishes {variant!r}: a renamed or mislabelled artifact")
    return None


def _decide_one(settings: Settings, matrix: Matrix, wheel: Wheel, waivers: dict[str, str]) -> Decision:
    target = matrix.target(wheel.target)

    def decision(publish: bool, basis: str, waived: bool = False) -> Decision:
        return Decision(wheel=wheel, target=target.name, variant=target.variant, publish=publish, basis=basis,
                        waived=waived)

    problem = _label_problem(wheel, target.variant)
    if problem:
        return decision(False, problem)
    sha = wheel.sha256
    try:
        trusted = settings.reports.trusted(sha)
    except FatalError as exc:  # a report is there but cannot be believed: a verdict no waiver overrides
        return decision(False, f"report for these bytes refused: {exc}")
    if trusted is None:
        if target.name in waivers:
            return decision(True, f"WAIVED: {waivers[target.name]} (no gate report for these bytes)", waived=True)
        return decision(False, "no gate report for these bytes")
    report = trusted.report
    try:
        passed, reason = judge(report.suites, str(settings.reports.path(sha)))
    except FatalError as exc:
        return decision(False, str(exc))
    if report.target != target.name:
        return decision(False, f"the report is for target {report.target}, the wheel for {target.name}")
    if not (passed and report.passed):
        blocked = report.reason if not report.passed else reason
    elif not backends.get(target.backend).can_gate(target.hardware, backends.Host.that_ran(report.hardware_class)):
        blocked = f"report ran on {report.hardware_class}, {target.name} needs {target.hardware}"
    else:
        return decision(True, f"gate report {sha[:12]} ({report.hardware_class}, {report.created_at}, "
                              f"{trusted.basis})")
    if target.name in waivers:
        blocked += "; a waiver covers only a target with no report, never a gate that ran and failed"
    return decision(False, blocked)


def decide(settings: Settings, matrix: Matrix, wheels: list[Wheel], waivers: dict[str, str]) -> list[Decision]:
    return [_decide_one(settings, matrix, wheel, waivers) for wheel in wheels]


def release_notes(decisions: list[Decision]) -> str:
    lines = ["# polykernels release", "", f"Published {datetime.now(timezone.utc).isoformat(timespec='seconds')}.", ""]
    for d in decisions:
        lines.append(f"- `{d.wheel.name}` ({d.target}): {d.basis}")
    waived = [d for d in decisions if d.waived]
    if waived:
        lines += ["", "## Waivers", "", *[f"- {d.target}: published WITHOUT a passing gate: {d.basis}" for d in waived]]
    return "\n".join(lines) + "\n"


def release_record(decisions: list[Decision], destination: str) -> dict[str, Any]:
    return {"published_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "destination": destination,
            "files": [{"filename": d.wheel.name, "sha256": d.wheel.sha256, "target": d.target, "basis": d.basis,
                       "waived": d.waived} for d in decisions]}


def publish(settings: Settings, matrix: Matrix, *, wheels: list[Wheel] | None = None, index_root: Path | None,
            repository_url: str | None, waivers: dict[str, str], partial: bool, log: Path,
            lock_timeout: float = index.DEFAULT_LOCK_TIMEOUT) -> list[Decision]:
    """Publishes ``wheels`` (what `release` built), or every wheel the build recorded under build/dist."""
    check_waivers(matrix, waivers)
    if wheels is None:
        wheels = list(built(settings.dist_dir).values())
    if not wheels:
        raise PublishError(f"no wheels under {settings.dist_dir}", hint="run `nox -s wheel` first")
    root = index_root or settings.build_dir / "index"
    if repository_url:
        return _upload(settings, matrix, wheels, waivers, partial, repository_url, log)
    with index.publish_lock(root, lock_timeout):  # decide and swap under one lock: no verdict goes stale
        decisions = _checked(decide(settings, matrix, wheels, waivers), partial)
        going = [d for d in decisions if d.publish]
        for variant in sorted({d.variant for d in going}):
            mine = [d for d in going if d.variant == variant]
            index.publish_variant(root, variant, [d.wheel for d in mine], release_record(mine, f"index {variant}"),
                                  release_notes(mine))
    return decisions


def _checked(decisions: list[Decision], partial: bool) -> list[Decision]:
    blocked = [d for d in decisions if not d.publish]
    if blocked and not partial:
        raise PublishError("refusing to publish: " + "; ".join(f"{d.target}: {d.basis}" for d in blocked),
                           hint="gate the wheels (nox -s gate), waive a target that has no report with "
                                "--waive T REASON, or publish the others with --partial")
    return decisions


def _upload(settings: Settings, matrix: Matrix, wheels: list[Wheel], waivers: dict[str, str], partial: bool,
            url: str, log: Path) -> list[Decision]:
    """twine upload of staged, re-hashed copies; the decisions and waivers are recorded under
    build/uploads before anything is sent (a repository keeps no notes of ours)."""
    decisions = _checked(decide(settings, matrix, wheels, waivers), partial)
    going = [d for d in decisions if d.publish]
    host = urlparse(url).hostname or ""
    if host.endswith("pypi.org"):
        local = [d.wheel.name for d in going if d.wheel.label]
        if local:
            raise PublishError(f"PyPI refuses local version labels: {local}",
                               hint="PyPI takes one default variant built without a label; publish the "
                                    "labelled variants to your own index (--index or a private --repository-url)")
    records = settings.build_dir / "uploads"
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    write_atomically(records / f"{stamp}.json", json.dumps(release_record(going, url), indent=2))
    write_atomically(records / f"{stamp}.md", release_notes(going))
    stage = Path(tempfile.mkdtemp(prefix=".upload-", dir=settings.build_dir))
    try:
        copies = [index.stage_copy(d.wheel, stage) for d in going]
        run(["twine", "upload", "--non-interactive", "--repository-url", url, *map(str, copies)], log=log,
            env=settings.twine_env, hint=f"the upload record is {records / (stamp + '.json')}")
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return decisions
