"""release: images -> wheel -> checks -> gate -> publish, per target, with what passed kept.

A step list per target, so further checks (the cross-target compile matrix, say) slot in.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from polykernels_build import build_step, gate, publish
from polykernels_build.errors import ConfigError, FatalError
from polykernels_build.host import Host
from polykernels_build.log import Reporter
from polykernels_build.settings import Settings
from polykernels_build.targets import Matrix, Target


@dataclass(kw_only=True)
class TargetOutcome:
    target: str
    wheel: str = ""
    size_mib: float = 0.0
    suites: str = "not run"
    published: str = "no"
    failed: bool = False


def resolve_targets(spec: list[str], matrix: Matrix, host: Host) -> list[Target]:
    if spec in ([], ["auto"]):
        return [t for t in matrix.targets.values() if host.can_gate(t.hardware)]
    if spec == ["all"]:
        return list(matrix.targets.values())
    if "auto" in spec or "all" in spec:
        raise ConfigError("--target auto and --target all stand alone; or list target names")
    return [matrix.target(name) for name in spec]


def release(settings: Settings, matrix: Matrix, targets: list[Target], host: Host, reporter: Reporter, *,
            profile: str, runtime: str, waivers: dict[str, str], partial: bool, index_root: Path | None,
            allow_unpinned: bool = False) -> list[TargetOutcome]:
    outcomes = []
    for target in targets:
        outcome = TargetOutcome(target=target.name)
        outcomes.append(outcome)
        try:
            built = build_step.build_and_check(settings, matrix, target, profile, reporter,
                                               allow_unpinned=allow_unpinned)
            outcome.wheel, outcome.size_mib = built.path.name, built.size / 2**20
            if not host.can_gate(target.hardware):
                reporter.skip(target.name, "gate", f"no {target.hardware} hardware on this host")
                outcome.suites = f"not gated (needs {target.hardware})"
                continue
            with reporter.step(target.name, f"gate ({runtime})") as row:
                report = gate.gate(settings, matrix, built.path, runtime=runtime, profile=profile,
                                   log=build_step.log_path(settings, target.name, "gate"))
                outcome.suites = "passed" if report.passed else f"FAILED: {report.reason}"
                row.detail = f"{report.hardware_class}: {report.reason}"
                if not report.passed:
                    raise FatalError(f"{target.name}: suites failed: {report.reason}")
        except FatalError as exc:
            outcome.failed = True
            reporter.info(exc.render())
    publishable = {o.target for o in outcomes if o.wheel}
    if publishable:
        try:
            with reporter.step("all", "publish") as row:
                decisions = publish.publish(settings, matrix, index_root=index_root, repository_url=None,
                                            waivers=waivers, partial=partial,
                                            log=build_step.log_path(settings, "release", "publish"),
                                            only_targets=publishable)
                for decision in decisions:
                    match = next(o for o in outcomes if o.target == decision.target)
                    match.published = ("waived" if decision.basis.startswith("WAIVED") else "yes") \
                        if decision.publish else "no"
                row.detail = f"{sum(d.publish for d in decisions)} wheel(s) into {index_root or 'build/index'}"
        except FatalError as exc:
            reporter.info(exc.render())
            for outcome in outcomes:
                outcome.failed = True
    for outcome in outcomes:
        if outcome.published == "no":
            outcome.failed = True
    return outcomes
