"""The release workflow's publish job: verify, decide, stage the Pages index and the PyPI upload.

Every wheel must carry our build provenance. A target gated in this release is published only
with a verified gate attestation for its exact bytes; a waived target is published with its waiver
in the notes; a target with neither is held back and the notes say so. PyPI gets the `[release]
pypi` target's wheel only when its gate verified (a waiver never reaches plain `pip install`).
"""

from __future__ import annotations

import html
import json
import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from polykernels_build import attestations, index, publish
from polykernels_build.dist import Wheel, arrived
from polykernels_build.errors import PublishError
from polykernels_build.settings import Settings
from polykernels_build.targets import Matrix
from polykernels_build.workflow_matrix import ReleasePlan


@dataclass(frozen=True, kw_only=True)
class Outcome:
    target: str
    variant: str
    wheel: str
    sha256: str
    profile: str
    verdict: str
    published: bool
    pypi: bool


def collect_artifacts(settings: Settings, artifacts: Path) -> list[Wheel]:
    """artifacts/wheel-<target>/ (download-artifact's layout) -> build/dist/<target>/, each wheel opened
    from its bytes (the records that travelled with it are not trusted) and recorded for publish."""
    wheels = []
    for folder in sorted(artifacts.glob("wheel-*")):
        target = folder.name.removeprefix("wheel-")
        dest = settings.dist_dir / target
        dest.mkdir(parents=True, exist_ok=True)
        for item in folder.glob("*.whl"):
            shutil.copy2(item, dest / item.name)
        wheels.append(arrived(dest, target))
    return wheels


def seed_previous_index(root: Path, base_url: str, variants: list[str]) -> None:
    """Pages replaces the whole site on deploy: start from what it serves now, every byte re-verified."""
    for variant in variants:
        url = f"{base_url.rstrip('/')}/{variant}/simple/{index.PROJECT}/"
        try:
            with urllib.request.urlopen(url + "index.json", timeout=60) as response:
                listing = json.load(response)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                continue  # nothing published for this variant yet
            raise PublishError(f"reading the live index {url}: {exc}") from None
        stage = root / ".previous" / variant
        stage.mkdir(parents=True, exist_ok=True)
        wheels = []
        for entry in listing.get("files", []):
            with urllib.request.urlopen(url + entry["filename"], timeout=300) as response:
                (stage / entry["filename"]).write_bytes(response.read())
            wheel = Wheel.open(stage / entry["filename"])
            if wheel.sha256 != entry["hashes"]["sha256"]:
                raise PublishError(f"the live index serves {entry['filename']} with bytes that do not match its hash")
            wheels.append(wheel)
        if wheels:
            index.publish_variant(root, variant, wheels, {"carried_over_from": url, "files": []},
                                  "Carried over from the live index.\n")


def decide(settings: Settings, matrix: Matrix, release: ReleasePlan, wheels: list[Wheel], repo: str,
           log: Path) -> list[Outcome]:
    outcomes = []
    by_target = {t.target: t for t in release.targets}
    for wheel in wheels:
        if wheel.target not in by_target:
            raise PublishError(f"{wheel.name} is for {wheel.target}, which targets.toml does not name")
        plan = by_target[wheel.target]
        attestations.verified_statements(settings, wheel, repo, attestations.SLSA_PROVENANCE, log)
        if plan.gate_runners:
            report = attestations.verified_gate_report(settings, matrix, wheel, repo, log)
            verdict, published = f"passed on {report.hardware_class} ({report.created_at}), attestation verified", True
        elif plan.waiver:
            verdict, published = f"WAIVED (not gated): {plan.waiver}", True
        else:
            verdict, published = "held back: no gate runner in targets.toml and no waiver", False
        profile = wheel.manifest.get("profile", "?")
        if profile == "offline":
            profile += " (vendor image not pinned yet)"
        outcomes.append(Outcome(target=plan.target, variant=plan.variant, wheel=wheel.name, sha256=wheel.sha256,
                                profile=profile, verdict=verdict, published=published,
                                pypi=plan.pypi and published and not plan.waiver))
    missing = set(by_target) - {o.target for o in outcomes}
    if missing:
        raise PublishError(f"no wheel arrived for {sorted(missing)}", hint="every build job must succeed")
    return outcomes


def notes(outcomes: list[Outcome], pages_url: str) -> str:
    lines = ["# polykernels release", "", "| wheel | target | sha256 | built with | gate | where |",
             "|---|---|---|---|---|---|"]
    for o in sorted(outcomes, key=lambda o: o.target):
        where = (f"`{o.variant}` index" + (", PyPI" if o.pypi else "")) if o.published else "not published"
        lines.append(f"| `{o.wheel}` | {o.target} | `{o.sha256}` | {o.profile} | {o.verdict} | {where} |")
    lines += ["", "Install a variant:", ""]
    lines += [f"    pip install --index-url {pages_url.rstrip('/')}/{o.variant}/simple polykernels"
              for o in sorted(outcomes, key=lambda o: o.target) if o.published]
    lines += ["", "Check a wheel: `gh attestation verify WHEEL --repo OWNER/REPO` (build provenance) and add",
              f"`--predicate-type {attestations.GATE_PREDICATE_TYPE}` for its gate verdict."]
    return "\n".join(lines) + "\n"


def landing_page(text: str) -> str:
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>polykernels</title></head>\n"
            f"<body><pre>{html.escape(text)}</pre></body></html>\n")


def release_publish(settings: Settings, matrix: Matrix, release: ReleasePlan, *, artifacts: Path, repo: str,
                    previous_index: str, pages: Path, pypi_dir: Path, log: Path) -> list[Outcome]:
    wheels = collect_artifacts(settings, artifacts)
    outcomes = decide(settings, matrix, release, wheels, repo, log)
    going = {o.target for o in outcomes if o.published}
    if pages.exists():
        shutil.rmtree(pages)
    pages.mkdir(parents=True)
    if going and previous_index:
        seed_previous_index(pages, previous_index, sorted({o.variant for o in outcomes if o.published}))
    waivers = {t.target: t.waiver for t in release.targets if t.waiver}
    if going:
        publish.publish(settings, matrix, wheels=[w for w in wheels if w.target in going], index_root=pages,
                        repository_url=None, waivers=waivers, partial=False, log=log)
    text = notes(outcomes, previous_index or "https://OWNER.github.io/polykernels")
    (pages / "RELEASE_NOTES.md").write_text(text)
    (pages / "index.html").write_text(landing_page(text))
    if pypi_dir.exists():
        shutil.rmtree(pypi_dir)
    pypi_dir.mkdir(parents=True)
    for o in outcomes:
        if o.pypi:
            shutil.copy2(settings.dist_dir / o.target / o.wheel, pypi_dir / o.wheel)
    return outcomes
