"""publish: a wheel goes out only with a passing gate report for its exact bytes, run on its
hardware class, or with an explicit waiver that is recorded in the index and release notes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlparse

from polykernels_build import backends, index
from polykernels_build.dist import Wheel, built, judge
from polykernels_build.errors import PublishError
from polykernels_build.settings import Settings
from polykernels_build.targets import Matrix
from polykernels_build.tools import run


@dataclass(frozen=True, kw_only=True)
class Decision:
    wheel: Wheel
    target: str
    variant: str
    publish: bool
    basis: str  # "gate report <sha>", "waiver: <reason>", or why it is blocked


def decide(settings: Settings, matrix: Matrix, wheels: list[Wheel], waivers: dict[str, str]) -> list[Decision]:
    decisions = []
    for wheel in wheels:
        target = matrix.target(wheel.target)
        sha = wheel.sha256
        intact = wheel.unchanged()  # the one re-hash: the bytes going out are the bytes that were gated
        report = settings.reports.load(sha) if intact else None
        if report is not None and report.wheel_sha256 == sha:
            passed, _ = judge(report.suites)
            host = backends.Host.that_ran(report.hardware_class)
            if passed and report.passed and backends.get(target.backend).can_gate(target.hardware, host):
                decisions.append(Decision(wheel=wheel, target=target.name, variant=target.variant,
                                          publish=True, basis=f"gate report {sha[:12]} ({report.hardware_class}, "
                                                              f"{report.created_at})"))
                continue
            blocked = report.reason if not report.passed else f"report ran on {report.hardware_class}"
        elif not intact:
            blocked = "the file changed after it was built: no gate report for these bytes"
        else:
            blocked = "no gate report for these bytes"
        if target.name in waivers:
            decisions.append(Decision(wheel=wheel, target=target.name, variant=target.variant,
                                      publish=True, basis=f"WAIVED: {waivers[target.name]} (gate: {blocked})"))
        else:
            decisions.append(Decision(wheel=wheel, target=target.name, variant=target.variant,
                                      publish=False, basis=blocked))
    return decisions


def release_notes(decisions: list[Decision]) -> str:
    lines = ["# polykernels release", "", f"Published {datetime.now(timezone.utc).isoformat(timespec='seconds')}.", ""]
    for d in decisions:
        lines.append(f"- `{d.wheel.name}` ({d.target}): {d.basis}")
    waived = [d for d in decisions if d.basis.startswith("WAIVED")]
    if waived:
        lines += ["", "## Waivers", "", *[f"- {d.target}: published WITHOUT a passing gate: {d.basis}" for d in waived]]
    return "\n".join(lines) + "\n"


def publish(settings: Settings, matrix: Matrix, *, wheels: list[Wheel] | None = None, index_root: Path | None,
            repository_url: str | None, waivers: dict[str, str], partial: bool, log: Path) -> list[Decision]:
    """Publishes ``wheels`` (what `release` built), or every wheel the build recorded under build/dist."""
    unknown = set(waivers) - set(matrix.targets)
    if unknown:
        raise PublishError(f"--waive names unknown targets {sorted(unknown)}; targets: {', '.join(matrix.targets)}")
    if wheels is None:
        wheels = list(built(settings.dist_dir).values())
    decisions = decide(settings, matrix, wheels, waivers)
    if not decisions:
        raise PublishError(f"no wheels under {settings.dist_dir}", hint="run `nox -s wheel` first")
    blocked = [d for d in decisions if not d.publish]
    if blocked and not partial:
        raise PublishError("refusing to publish: " + "; ".join(f"{d.target}: {d.basis}" for d in blocked),
                           hint="gate the wheels (nox -s gate), waive a target with --waive T --reason '...', "
                                "or publish the others with --partial")
    going = [d for d in decisions if d.publish]
    if repository_url:
        _upload(settings, going, repository_url, log)
        return decisions
    root = index_root or settings.build_dir / "index"
    root.mkdir(parents=True, exist_ok=True)
    for variant in sorted({d.variant for d in going}):
        mine = [d for d in going if d.variant == variant]
        release = {"published_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                   "files": [{"filename": d.wheel.name, "sha256": d.wheel.sha256, "target": d.target,
                              "basis": d.basis,
                              "waived": d.basis.startswith("WAIVED")} for d in mine]}
        index.publish_variant(root, variant, [d.wheel for d in mine], release, release_notes(mine))
    return decisions


def _upload(settings: Settings, going: list[Decision], url: str, log: Path) -> None:
    host = urlparse(url).hostname or ""
    if host.endswith("pypi.org"):
        local = [d.wheel.name for d in going if "+" in d.wheel.name.split("-")[1]]
        if local:
            raise PublishError(f"PyPI refuses local version labels: {local}",
                               hint="PyPI takes one default variant built without a label; publish the "
                                    "labelled variants to your own index (--index or a private --repository-url)")
    run(["twine", "upload", "--non-interactive", "--repository-url", url, *[str(d.wheel.path) for d in going]],
        log=log, env=settings.tool_env)
