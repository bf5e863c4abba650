"""The release workflow's plan, made from targets.toml alone.

`.github/workflows/release.yml` holds no list of targets: its first job runs `nox -s release_matrix`,
which prints this plan's job matrices into ``GITHUB_OUTPUT``. `nox -s release -- --dry-run` renders
the same plan with the same command lines, so what a tag would run can be read (and copied) locally.
The command templates below are the workflow's `run:` lines verbatim; a test holds them equal.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from polykernels_build.errors import ConfigError
from polykernels_build.targets import Matrix, Target

# nox pinned for CI: the same sessions a developer runs with a plain `nox -s ...`.
NOX = "pipx run nox==2026.10.20"
HOSTED_RUNNER = "ubuntu-latest"
# The in-toto predicate type of a polykernels gate report (the report `nox -s gate` writes, schema 1).
# A URN: it names the format without claiming a host; README's release section describes it.
GATE_PREDICATE_TYPE = "urn:polykernels:gate-report:v1"
WORKFLOW = ".github/workflows/release.yml"

# The workflow's run: lines. Values reach them through env: (never ${{ }} inside a script).
BUILD_STEPS = (
    f"{NOX} -s runner_setup",
    f'{NOX} -s "wheel($TARGET)" -- --profile "$PROFILE"',  # noxfile: one wheel(<target>) session per target
    f'{NOX} -s sbom -- --target "$TARGET"',
)
GATE_STEPS = (
    f'{NOX} -s verify_wheel -- --target "$TARGET" --repo "$GITHUB_REPOSITORY"',
    f'{NOX} -s gate -- --wheel build/dist/"$TARGET"/*.whl --runtime venv',
    f'{NOX} -s gate_predicate -- --target "$TARGET"',
)
MATRIX_STEPS = (f'{NOX} -s release_matrix -- --waivers "$WAIVERS" --dry-run "$DRY_RUN" '
                '--github-output "$GITHUB_OUTPUT"',)
PUBLISH_STEPS = (
    f'{NOX} -s release_publish -- --artifacts artifacts --repo "$GITHUB_REPOSITORY" --waivers "$WAIVERS" '
    '--previous-index "$PAGES_URL" --github-output "$GITHUB_OUTPUT"',
)

# TARGET=reason;TARGET=reason. A reason is published in the release notes: one plain line.
_WAIVER_REASON = re.compile(r"^[A-Za-z0-9 .,:()/+#'_@-]{8,200}$")


def parse_waivers(text: str, matrix: Matrix) -> dict[str, str]:
    """The workflow's `waive` input, validated: known targets, each once, with a plain reason."""
    waivers: dict[str, str] = {}
    for item in (part.strip() for part in text.split(";")):
        if not item:
            continue
        name, sep, reason = item.partition("=")
        name, reason = name.strip(), reason.strip()
        if not sep or name not in matrix.targets:
            raise ConfigError(f"waiver {item!r}: expected TARGET=reason with TARGET one of {', '.join(matrix.targets)}")
        if name in waivers:
            raise ConfigError(f"waiver for {name} is given twice")
        if not _WAIVER_REASON.match(reason):
            raise ConfigError(f"waiver for {name}: the reason must be 8-200 plain characters "
                              "(letters, digits, spaces, .,:()/+#'_@-) saying why; it is published")
        waivers[name] = reason
    return waivers


def parse_bool(text: str, what: str) -> bool:
    if text.strip().lower() in ("true", "1", "yes"):
        return True
    if text.strip().lower() in ("", "false", "0", "no"):
        return False
    raise ConfigError(f"{what}: expected true or false, got {text!r}")


def profile_for(target: Target) -> str:
    """Vendor images once pinned by digest; until then the offline profile (and the notes say so)."""
    return "vendor" if target.vendor.digest else "offline"


@dataclass(frozen=True, kw_only=True)
class TargetPlan:
    target: str
    variant: str
    profile: str
    gate_runners: tuple[str, ...]  # empty: not gated in this release
    waiver: str | None
    pypi: bool

    @property
    def fate(self) -> str:
        if self.gate_runners:
            return f"gated on runs-on {list(self.gate_runners)}; published only if its gate attestation verifies"
        if self.waiver:
            return f"not gated, published under waiver: {self.waiver}"
        return "not gated (no runner in targets.toml) and not waived: built and attested, NOT published"


@dataclass(frozen=True, kw_only=True)
class ReleasePlan:
    targets: tuple[TargetPlan, ...]
    dry_run: bool

    def build_matrix(self) -> list[dict[str, str]]:
        return [{"target": t.target, "profile": t.profile} for t in self.targets]

    def gate_matrix(self) -> list[dict[str, object]]:
        return [{"target": t.target, "runners": list(t.gate_runners)} for t in self.targets if t.gate_runners]

    def outputs(self) -> dict[str, str]:
        """What the matrix job hands to the others (GITHUB_OUTPUT lines)."""
        return {"build": json.dumps(self.build_matrix()), "gate": json.dumps(self.gate_matrix()),
                "dry_run": json.dumps(self.dry_run), "gate_predicate_type": GATE_PREDICATE_TYPE}


def plan(matrix: Matrix, *, waivers: dict[str, str], dry_run: bool) -> ReleasePlan:
    unknown = set(waivers) - set(matrix.targets)
    if unknown:
        raise ConfigError(f"waivers name unknown targets {sorted(unknown)}")
    return ReleasePlan(dry_run=dry_run, targets=tuple(
        TargetPlan(target=t.name, variant=t.variant, profile=profile_for(t),
                   # a waived target skips its gate (say, its runner is down); the waiver is on the record
                   gate_runners=() if t.name in waivers else t.runners, waiver=waivers.get(t.name), pypi=t.pypi)
        for t in matrix.targets.values()))


def write_github_output(path: Path, outputs: dict[str, str]) -> None:
    with path.open("a") as handle:
        for key, value in outputs.items():
            if "\n" in value:
                raise ConfigError(f"output {key} spans lines")
            handle.write(f"{key}={value}\n")


def _with_env(template: str, env: dict[str, str]) -> str:
    """A run: line with its values in, as a developer would type it (`"wheel($TARGET)"` -> `"wheel(cpu)"`)."""
    for key, value in env.items():
        template = template.replace(f'"${key}"', shlex.quote(value))
        if f"${key}" in template:  # inside a quoted word: only a value that needs no quoting of its own
            if not re.fullmatch(r"[\w./-]+", value):
                raise ConfigError(f"{key}={value!r} cannot go inside a quoted word of {template!r}")
            template = template.replace(f"${key}", value)
    return template


def render(release: ReleasePlan, *, repo: str = "OWNER/polykernels") -> str:
    """The plan a tag push (or a dispatch with these inputs) runs, job by job, as commands to copy."""
    lines = [f"release plan ({'dry run: nothing is uploaded' if release.dry_run else 'publishes'}), "
             f"from targets.toml via {WORKFLOW}", "",
             "job matrix (" + HOSTED_RUNNER + "):", f"  {MATRIX_STEPS[0]}", ""]
    for t in release.targets:
        env = {"TARGET": t.target, "PROFILE": t.profile, "GITHUB_REPOSITORY": repo}
        pinned = "" if t.profile == "vendor" else \
            "  (vendor image not pinned yet: offline profile, noted in the release)"
        lines.append(f"target {t.target} -> index {t.variant}{' and PyPI' if t.pypi else ''}{pinned}")
        lines.append(f"  build (runs-on {HOSTED_RUNNER}): ")
        lines += [f"    {_with_env(step, env)}" for step in BUILD_STEPS]
        lines.append("    attest build provenance of the wheel; upload wheel, checks report, SBOM")
        if t.gate_runners:
            lines.append(f"  gate (runs-on {list(t.gate_runners)}):")
            lines += [f"    {_with_env(step, env)}" for step in GATE_STEPS]
            lines.append(f"    attest the gate report against the wheel's sha256 ({GATE_PREDICATE_TYPE})")
        lines.append(f"  => {t.fate}")
        lines.append("")
    lines.append("publish (needs every build and gate):")
    lines += [f"  {_with_env(step, {'GITHUB_REPOSITORY': repo})}" for step in PUBLISH_STEPS]
    if release.dry_run:
        lines.append("  dry run: stops here (no PyPI upload, no Pages deploy)")
    else:
        pypi = [t.target for t in release.targets if t.pypi]
        lines.append(f"  PyPI (trusted publishing, environment pypi): {', '.join(pypi) or 'nothing'}, "
                     "if its gate verified")
        lines.append("  GitHub Pages: the PEP 503/691 index per variant, with the release notes")
    return "\n".join(lines) + "\n"
