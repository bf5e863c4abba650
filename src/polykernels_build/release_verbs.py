"""The verbs the release workflow's steps call (each one a `nox -s ...` a developer can copy)."""

from __future__ import annotations

import argparse
from pathlib import Path

from polykernels_build import attestations, build_step, pin_images, release_publish, sbom, workflow_matrix
from polykernels_build.log import Reporter
from polykernels_build.settings import Settings
from polykernels_build.targets import Matrix

VERBS = ("release-matrix", "release-publish", "verify-wheel", "gate-predicate", "sbom", "pin-images")


def add_parsers(verbs: argparse._SubParsersAction, settings: Settings) -> None:
    def with_release_inputs(p: argparse.ArgumentParser) -> None:
        p.add_argument("--waivers", default="", help="TARGET=reason;... (the workflow's waive input)")
        p.add_argument("--github-output", type=Path, help="append outputs here (GITHUB_OUTPUT)")

    m = verbs.add_parser("release-matrix", help="the release workflow's job matrices, from targets.toml")
    with_release_inputs(m)
    m.add_argument("--dry-run", default="false", help="true: build and gate, upload nothing")
    p = verbs.add_parser("release-publish", help="verify attestations, stage the Pages index and the PyPI upload")
    with_release_inputs(p)
    p.add_argument("--artifacts", type=Path, required=True)
    p.add_argument("--repo", required=True, help="OWNER/REPO whose release workflow must have signed")
    p.add_argument("--previous-index", default="", help="the live index's base URL (GitHub Pages)")
    p.add_argument("--pages", type=Path, default=settings.build_dir / "pages")
    p.add_argument("--pypi-dir", type=Path, default=settings.build_dir / "pypi")
    v = verbs.add_parser("verify-wheel", help="check a downloaded wheel carries this repository's build provenance")
    v.add_argument("--target", required=True)
    v.add_argument("--repo", required=True)
    g = verbs.add_parser("gate-predicate", help="write the gate report of a target's wheel as an attestation predicate")
    g.add_argument("--target", required=True)
    s = verbs.add_parser("sbom", help="a CycloneDX SBOM of a target's wheel and its build tools")
    s.add_argument("--target", required=True)
    pin = verbs.add_parser("pin-images", help="resolve vendor image tags to digests and rewrite targets.toml")
    pin.add_argument("--check", action="store_true", help="report only; do not rewrite targets.toml")


def run(args: argparse.Namespace, settings: Settings, matrix: Matrix, reporter: Reporter) -> int:
    if args.verb == "release-matrix":
        plan = workflow_matrix.plan(matrix, waivers=workflow_matrix.parse_waivers(args.waivers, matrix),
                                    dry_run=workflow_matrix.parse_bool(args.dry_run, "--dry-run"))
        print(workflow_matrix.render(plan))
        if args.github_output:
            workflow_matrix.write_github_output(args.github_output, plan.outputs())
        return 0
    if args.verb == "release-publish":
        plan = workflow_matrix.plan(matrix, waivers=workflow_matrix.parse_waivers(args.waivers, matrix), dry_run=False)
        with reporter.step("all", "release-publish") as row:
            outcomes = release_publish.release_publish(
                settings, matrix, plan, artifacts=args.artifacts, repo=args.repo, previous_index=args.previous_index,
                pages=args.pages, pypi_dir=args.pypi_dir, log=build_step.log_path(settings, "release", "publish"))
            row.detail = "; ".join(f"{o.target}: {o.verdict}" for o in outcomes)[:400]
        print((args.pages / "RELEASE_NOTES.md").read_text())
        if args.github_output:
            pypi = "true" if any(o.pypi for o in outcomes) else "false"
            workflow_matrix.write_github_output(args.github_output, {"pypi": pypi})
        return 0
    target = matrix.target(args.target) if hasattr(args, "target") else None
    if args.verb == "verify-wheel" and target:
        with reporter.step(target.name, "verify build provenance") as row:
            row.detail = attestations.verify_wheel(settings, matrix, target, args.repo,
                                                   build_step.log_path(settings, target.name, "verify")).name
        return 0
    if args.verb == "gate-predicate" and target:
        reporter.info(f"predicate: {attestations.gate_predicate(settings, matrix, target)}")
        return 0
    if args.verb == "sbom" and target:
        with reporter.step(target.name, "sbom") as row:
            row.detail = str(sbom.write_sbom(settings, target, build_step.log_path(settings, target.name, "sbom")))
        return 0
    pins = pin_images.pin_images(matrix, write=not args.check)
    for pin in pins:
        reporter.info(f"{pin.target} {pin.slot} {pin.image}: {pin.new or pin.old or 'unpinned'} ({pin.note})")
    return 0
