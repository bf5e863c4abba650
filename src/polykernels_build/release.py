"""release: images -> wheel -> checks -> gate -> publish, per target, with what passed kept.

The wheel each target's build returns is the object the gate runs and publish ships: nothing
is rediscovered from build/dist or hashed again on the way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from polykernels_build import backends, build_step, gate, publish
from polykernels_build.backends import Host
from polykernels_build.dist import Wheel
from polykernels_build.errors import ConfigError, FatalError, GateError, PublishError
from polykernels_build.log import Reporter
from polykernels_build.settings import Settings
from polykernels_build.targets import Matrix, Target


@dataclass(kw_only=True)
class TargetOutcome:
    target: str
    wheel: Wheel | None = None
    suites: str = "not run"
    published: str = "no"
    error: FatalError | None = None


def resolve_targets(spec: list[str], matrix: Matrix, host: Host) -> list[Target]:
    if spec in ([], ["auto"]):
        return [t for t in matrix.targets.values() if can_gate_here(t, host)]
    if spec == ["all"]:
        return list(matrix.targets.values())
    if "auto" in spec or "all" in spec:
        raise ConfigError("--target auto and --target all stand alone; or list target names")
    return [matrix.target(name) for name in spec]


def can_gate_here(target: Target, host: Host) -> bool:
    return backends.get(target.backend).can_gate(target.hardware, host)


def _build_and_gate(settings: Settings, matrix: Matrix, target: Target, host: Host, reporter: Reporter,
                    outcome: TargetOutcome, *, profile: str, runtime: str, index_url: str | None,
                    allow_unpinned: bool) -> None:
    outcome.wheel = build_step.build_and_check(settings, matrix, target, profile, reporter, index_url=index_url,
                                               allow_unpinned=allow_unpinned)
    if not can_gate_here(target, host):
        reporter.skip(target.name, "gate", f"no {target.hardware} hardware on this host")
        outcome.suites = f"not gated (needs {target.hardware})"
        return
    with reporter.step(target.name, f"gate ({runtime})") as row:
        report = gate.gate(settings, matrix, outcome.wheel, runtime=runtime, profile=profile,
                           log=build_step.log_path(settings, target.name, "gate"), allow_unpinned=allow_unpinned)
        outcome.suites = "passed" if report.passed else f"FAILED: {report.reason}"
        row.detail = f"{report.hardware_class}: {report.reason}"
        if not report.passed:
            raise GateError(f"{target.name}: suites failed: {report.reason}")


def release(settings: Settings, matrix: Matrix, targets: list[Target], host: Host, reporter: Reporter, *,
            profile: str, runtime: str, waivers: dict[str, str], partial: bool, index_root: Path | None,
            index_url: str | None = None, allow_unpinned: bool = False,
            lock_timeout: float = 600.0) -> list[TargetOutcome]:
    outcomes = []
    for target in targets:
        outcome = TargetOutcome(target=target.name)
        outcomes.append(outcome)
        try:
            _build_and_gate(settings, matrix, target, host, reporter, outcome, profile=profile, runtime=runtime,
                            index_url=index_url, allow_unpinned=allow_unpinned)
        except FatalError as exc:
            outcome.error = exc
            reporter.info(exc.render())
    built = [o.wheel for o in outcomes if o.wheel is not None]
    if built:
        try:
            with reporter.step("all", "publish") as row:
                decisions = publish.publish(settings, matrix, wheels=built, index_root=index_root,
                                            repository_url=None, waivers=waivers, partial=partial,
                                            lock_timeout=lock_timeout,
                                            log=build_step.log_path(settings, "release", "publish"))
                for decision in decisions:
                    match = next(o for o in outcomes if o.target == decision.target)
                    match.published = ("waived" if decision.waived else "yes") if decision.publish else "no"
                row.detail = f"{sum(d.publish for d in decisions)} wheel(s) into {index_root or 'build/index'}"
        except FatalError as exc:
            reporter.info(exc.render())
            for outcome in outcomes:
                outcome.error = outcome.error or exc
    for outcome in outcomes:
        if outcome.published == "no" and outcome.error is None:
            outcome.error = PublishError(f"{outcome.target}: not published")
    return outcomes


def exit_code(outcomes: list[TargetOutcome]) -> int:
    """The release's exit code: the first failure's code (errors.py), 0 when every target went out."""
    return next((o.error.return_code for o in outcomes if o.error is not None), 0)
