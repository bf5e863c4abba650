"""python -m polykernels_build <verb> ...: the factory's one entry point (nox sessions call it)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

from rich.table import Table

from polykernels_build import build_step, gate, host, publish, release, release_verbs, serve, targets, workflow_matrix
from polykernels_build.errors import ConfigError, FatalError
from polykernels_build.log import Reporter
from polykernels_build.settings import Settings


def _waivers(pairs: list[list[str]] | None) -> dict[str, str]:
    waivers = {}
    for target, reason in pairs or []:
        if not reason.strip():
            raise ConfigError(f"--waive {target}: the reason must say why (it is published with the release)")
        waivers[target] = reason
    return waivers


def _parser(settings: Settings) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m polykernels_build", description="the polykernels factory")
    parser.add_argument("--targets-file", type=Path, default=settings.root / "targets.toml")
    parser.add_argument("--debug-traceback", action="store_true", help="show the stack on failure")
    verbs = parser.add_subparsers(dest="verb", required=True)

    def with_publish_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--waive", nargs=2, action="append", metavar=("TARGET", "REASON"),
                       help="publish TARGET without a passing gate; the reason is recorded in the index")
        p.add_argument("--partial", action="store_true", help="publish what passed even if other targets did not")

    def with_target(p: argparse.ArgumentParser) -> None:
        p.add_argument("--target", required=True, help="a target name from targets.toml")
        p.add_argument("--profile", choices=("vendor", "offline"), default=settings.default_profile)
        p.add_argument("--allow-unpinned", action="store_true", help="accept a vendor image without a digest")

    with_target(verbs.add_parser("images", help="build the target's builder image"))
    wheel = verbs.add_parser("wheel", help="build and check the target's wheel")
    with_target(wheel)
    wheel.add_argument("--no-ccache", action="store_true")
    verbs.add_parser("compile-matrix", help="compile every Triton kernel for every GPU target (CPU only)")
    gate_p = verbs.add_parser("gate", help="run the suites on an installed wheel, or import a report")
    source = gate_p.add_mutually_exclusive_group(required=True)
    source.add_argument("--wheel", type=Path)
    source.add_argument("--import-report", type=Path)
    gate_p.add_argument("--runtime", choices=("container", "venv"), default="container")
    gate_p.add_argument("--profile", choices=("vendor", "offline"), default=settings.default_profile)
    gate_p.add_argument("--pip-arg", action="append", default=[], help="passed to pip install in a venv runtime")
    pub = verbs.add_parser("publish", help="publish gated wheels to a static index or a repository")
    where = pub.add_mutually_exclusive_group()
    where.add_argument("--index", type=Path, help="static index root (default build/index)")
    where.add_argument("--repository-url", help="upload with twine instead")
    with_publish_options(pub)
    srv = verbs.add_parser("serve", help="serve build/index on 127.0.0.1")
    srv.add_argument("--port", type=int, default=8000)
    srv.add_argument("--index", type=Path, default=settings.build_dir / "index")
    rel = verbs.add_parser("release", help="images -> wheel -> gate -> publish")
    rel.add_argument("--target", nargs="+", default=["auto"], help="auto (what this host can gate), all, or names")
    rel.add_argument("--profile", choices=("vendor", "offline"), default=settings.default_profile)
    rel.add_argument("--runtime", choices=("container", "venv"), default="container")
    rel.add_argument("--index", type=Path)
    with_publish_options(rel)
    rel.add_argument("--allow-unpinned", action="store_true")
    rel.add_argument("--dry-run", action="store_true", help="print the plan a tag push runs in GitHub Actions")
    rel.add_argument("--waivers", default="", help="with --dry-run: the workflow's waive input, TARGET=reason;...")
    release_verbs.add_parsers(verbs, settings)
    verbs.add_parser("schema", help="write targets.schema.json for editors")
    verbs.add_parser("matrix", help="print the targets as JSON (for CI job matrices)")
    return parser


def _release_table(outcomes: list[release.TargetOutcome]) -> Table:
    table = Table(title="release")
    for column in ("target", "wheel", "size", "suites", "published"):
        table.add_column(column)
    for o in outcomes:
        table.add_row(o.target, o.wheel or "-", f"{o.size_mib:.2f} MiB" if o.wheel else "-", o.suites, o.published)
    return table


def run_verb(args: argparse.Namespace, settings: Settings, reporter: Reporter) -> int:
    matrix = targets.load(args.targets_file)
    if args.verb in release_verbs.VERBS:
        return release_verbs.run(args, settings, matrix, reporter)
    if args.verb == "release" and args.dry_run:
        print(workflow_matrix.render(workflow_matrix.plan(
            matrix, waivers=workflow_matrix.parse_waivers(args.waivers, matrix), dry_run=False)))
        return 0
    if args.verb == "schema":
        path = settings.root / "targets.schema.json"
        path.write_text(json.dumps(targets.json_schema(), indent=2) + "\n")
        reporter.info(f"wrote {path}")
        return 0
    if args.verb == "matrix":
        print(json.dumps([{"target": t.name, "backend": t.backend, "hardware": t.hardware, "variant": t.variant,
                           "runners": list(t.runners)} for t in matrix.targets.values()]))
        return 0
    if args.verb in ("images", "wheel"):
        target = matrix.target(args.target)
        reporter.info(f"target {target.name}: {target.backend} {', '.join(target.archs) or '-'}, toolkit "
                      f"{target.toolkit}, torch >= {target.torch_floor}, profile {args.profile}")
        if args.verb == "images":
            from polykernels_build import images

            with reporter.step(target.name, f"image ({args.profile})") as row:
                image = images.builder_image(settings, matrix, target, args.profile,
                                             build_step.log_path(settings, target.name, "image"),
                                             allow_unpinned=args.allow_unpinned)
                row.detail = f"{image.tag} {image.image_id[:19]}"
        else:
            build_step.build_and_check(settings, matrix, target, args.profile, reporter,
                                       allow_unpinned=args.allow_unpinned, ccache=not args.no_ccache)
        return 0
    if args.verb == "compile-matrix":
        from polykernels_build import compile_matrix

        with reporter.step("all", "compile-matrix") as row:
            result = compile_matrix.run(settings)
            row.detail = result.summary
        return 0 if result.consistent else 1
    if args.verb == "gate":
        if args.import_report:
            report = gate.import_report(settings, matrix, args.import_report)
            reporter.info(f"kept report for {report.wheel_name} ({report.hardware_class}, passed={report.passed})")
            return 0 if report.passed else 1
        with reporter.step(args.wheel.name, f"gate ({args.runtime})") as row:
            report = gate.gate(settings, matrix, args.wheel, runtime=args.runtime, profile=args.profile,
                               log=build_step.log_path(settings, "gate", args.wheel.stem), pip_args=args.pip_arg)
            row.detail = f"{report.hardware_class}: {report.reason}"
            if not report.passed:
                row.status = "failed"
        reporter.info(f"report: {gate.reports_dir(settings) / (report.wheel_sha256 + '.json')}")
        return 0 if report.passed else 1
    if args.verb == "publish":
        with reporter.step("all", "publish") as row:
            decisions = publish.publish(settings, matrix, index_root=args.index, repository_url=args.repository_url,
                                        waivers=_waivers(args.waive), partial=args.partial,
                                        log=build_step.log_path(settings, "publish", "publish"))
            row.detail = "; ".join(f"{d.wheel.name}: {'published' if d.publish else 'blocked'} ({d.basis})"
                                   for d in decisions)[:400]
        return 0
    if args.verb == "serve":
        serve.serve(args.index, args.port)
        return 0
    this_host = host.probe()
    outcomes = release.release(settings, matrix, release.resolve_targets(args.target, matrix, this_host),
                               this_host, reporter, profile=args.profile, runtime=args.runtime,
                               waivers=_waivers(args.waive), partial=args.partial, index_root=args.index,
                               allow_unpinned=args.allow_unpinned)
    reporter.console.print(_release_table(outcomes))
    (settings.build_dir / "release.json").write_text(json.dumps([asdict(o) for o in outcomes], indent=2))
    return 1 if any(o.failed for o in outcomes) else 0


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    settings = Settings.from_env(env, Path.cwd())
    reporter = Reporter.from_env(env)
    args = _parser(settings).parse_args(argv)
    try:
        code = run_verb(args, settings, reporter)
    except FatalError as exc:
        if args.debug_traceback:
            traceback.print_exc()
        reporter.console.print(exc.render(), markup=False)
        code = exc.return_code
    if reporter.rows and args.verb != "release":
        reporter.summary(args.verb)
    elif args.verb == "release" and not args.dry_run:
        reporter.summary("steps")
    return code


if __name__ == "__main__":
    sys.exit(main())
