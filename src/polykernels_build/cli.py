"""python -m polykernels_build <verb> ...: the factory's one entry point (nox sessions call it).

Each verb is a small handler in ``VERBS``; each option is declared once in ``OPTIONS`` and named
by the verbs that take it. Failures are ``FatalError``s caught once here: the exit code is the
error class's (errors.py), and every verb ends with one summary table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polykernels_build import build_step, gate, publish, release, targets, workflow_matrix
from polykernels_build.backends import Host
from polykernels_build.errors import CheckError, ConfigError, FatalError, GateError
from polykernels_build.log import Reporter
from polykernels_build.settings import Settings
from polykernels_build.targets import PROFILES, Matrix


@dataclass(frozen=True)
class Context:
    args: argparse.Namespace
    settings: Settings
    matrix: Matrix
    reporter: Reporter


@dataclass(frozen=True)
class Verb:
    help: str
    handler: Callable[[Context], int]
    options: tuple[str, ...] = ()
    exclusive: tuple[tuple[tuple[str, ...], bool], ...] = ()  # (option names, one required)


def _options(settings: Settings) -> dict[str, tuple[tuple[str, ...], dict[str, Any]]]:
    """Every option of every verb: flags and argparse keywords, declared once."""
    return {
        "target": (("--target",), {"required": True, "help": "a target name from targets.toml"}),
        "targets": (("--target",), {"dest": "targets", "nargs": "+", "default": ["auto"],
                                    "help": "auto (what this host can gate), all, or target names"}),
        "profile": (("--profile",), {"choices": PROFILES, "default": settings.default_profile}),
        "allow_unpinned": (("--allow-unpinned",), {"action": "store_true",
                                                   "help": "accept a vendor image without a digest"}),
        "no_ccache": (("--no-ccache",), {"action": "store_true"}),
        "index_url": (("--index-url",), {"help": "root URL the variant indexes are served under (recorded in "
                                                 "the manifest; default: targets.toml [build] index_url)"}),
        "wheel": (("--wheel",), {"type": Path}),
        "import_report": (("--import-report",), {"type": Path, "nargs": "+",
                                                  "help": "keep reports made elsewhere (each verified; a failed "
                                                          "one is kept, and the verb exits with the gate's code)"}),
        "trust_unsigned": (("--trust-unsigned",), {"metavar": "REASON",
                                                   "help": "keep an unsigned or unknown-signer report anyway; the "
                                                           "reason is recorded and published with its wheel"}),
        "runtime": (("--runtime",), {"choices": gate.RUNTIMES, "default": "container"}),
        "pip_arg": (("--pip-arg",), {"action": "append", "default": [],
                                     "help": "passed to pip install in a venv runtime"}),
        "index": (("--index",), {"type": Path, "help": "static index root (default build/index)"}),
        "repository_url": (("--repository-url",), {"help": "upload with twine instead"}),
        "waive": (("--waive",), {"nargs": 2, "action": "append", "metavar": ("TARGET", "REASON"),
                                 "help": "publish TARGET without a passing gate; the reason is recorded"}),
        "partial": (("--partial",), {"action": "store_true",
                                     "help": "publish what passed even if other targets did not"}),
        "lock_timeout": (("--lock-timeout",), {"type": float, "default": 600.0, "metavar": "SECONDS",
                                               "help": "how long to wait for another publish to the same index"}),
        "port": (("--port",), {"type": int, "default": 8000}),
        # The release workflow's verbs (each step of release.yml is one of them, through nox).
        "dry_run": (("--dry-run",), {"nargs": "?", "const": "true", "default": "false", "metavar": "true|false",
                                     "help": "release: print the plan a tag push runs in GitHub Actions; "
                                             "release-matrix: the workflow's dry-run input"}),
        "waivers": (("--waivers",), {"default": "", "help": "the workflow's waive input: TARGET=reason;..."}),
        "github_output": (("--github-output",), {"type": Path, "help": "append outputs here (GITHUB_OUTPUT)"}),
        "artifacts": (("--artifacts",), {"type": Path, "required": True,
                                         "help": "the downloaded wheel-<target> artifacts"}),
        "repo": (("--repo",), {"required": True, "help": "OWNER/REPO whose release workflow must have signed"}),
        "previous_index": (("--previous-index",), {"default": "", "help": "the live index's base URL (Pages)"}),
        "pages": (("--pages",), {"type": Path, "default": settings.build_dir / "pages"}),
        "pypi_dir": (("--pypi-dir",), {"type": Path, "default": settings.build_dir / "pypi"}),
        "check": (("--check",), {"action": "store_true", "help": "report only; do not rewrite targets.toml"}),
    }


def _waivers(pairs: list[list[str]] | None) -> dict[str, str]:
    waivers = {}
    for target, reason in pairs or []:
        if not reason.strip():
            raise ConfigError(f"--waive {target}: the reason must say why (it is published with the release)")
        if target in waivers:
            raise ConfigError(f"--waive {target} is given twice")
        waivers[target] = reason
    return waivers


def _announce(ctx: Context) -> targets.Target:
    target = ctx.matrix.target(ctx.args.target)
    ctx.reporter.info(f"target {target.name}: {target.backend} {', '.join(target.archs) or '-'}, toolkit "
                      f"{target.toolkit}, torch >= {target.torch_floor}, profile {ctx.args.profile}")
    return target


def do_images(ctx: Context) -> int:
    from polykernels_build import images

    target = _announce(ctx)
    with ctx.reporter.step(target.name, f"image ({ctx.args.profile})") as row:
        image = images.builder_image(ctx.settings, ctx.matrix, target, ctx.args.profile,
                                     build_step.log_path(ctx.settings, target.name, "image"),
                                     allow_unpinned=ctx.args.allow_unpinned)
        row.detail = f"{image.tag} {image.image_id[:19]}"
    return 0


def do_wheel(ctx: Context) -> int:
    target = _announce(ctx)
    build_step.build_and_check(ctx.settings, ctx.matrix, target, ctx.args.profile, ctx.reporter,
                               index_url=ctx.args.index_url, allow_unpinned=ctx.args.allow_unpinned,
                               ccache=not ctx.args.no_ccache)
    return 0


def do_compile_matrix(ctx: Context) -> int:
    from polykernels_build import compile_matrix

    with ctx.reporter.step("all", "compile-matrix") as row:
        result = compile_matrix.run(ctx.settings, ctx.matrix)
        row.detail = result.summary
        if not result.consistent:
            raise CheckError(f"compile matrix: {result.summary}",
                             hint="guard the kernel off where it cannot compile (its family's guards.py)")
    return 0


def do_gate(ctx: Context) -> int:
    args, settings = ctx.args, ctx.settings
    if args.import_report:
        # Every report is imported, whatever happened to the ones before it: a failed verdict is
        # stored (it blocks its wheel) and only turns into the exit code at the end.
        code = 0
        for source in args.import_report:
            try:
                report = gate.import_report(settings, ctx.matrix, source, trust_unsigned=args.trust_unsigned)
            except FatalError as exc:
                ctx.reporter.skip(str(source.name), "import report", str(exc).splitlines()[0][:300], status="failed")
                ctx.reporter.console.print(exc.render(), markup=False)
                code = code or exc.return_code
                continue
            trust = " (UNSIGNED, trusted on import)" if settings.reports.trust_path(report.wheel_sha256).exists() \
                else ""
            ctx.reporter.skip(report.target, "import report", f"{report.hardware_class}: {report.reason}{trust}",
                              status="ok" if report.passed else "failed")
            if not report.passed:
                code = code or GateError.return_code
        return code
    wheel = gate.open_wheel(args.wheel)
    with ctx.reporter.step(wheel.target, f"gate ({args.runtime})") as row:
        report = gate.gate(settings, ctx.matrix, wheel, runtime=args.runtime, profile=args.profile,
                           log=build_step.log_path(settings, "gate", args.wheel.stem), pip_args=args.pip_arg,
                           allow_unpinned=args.allow_unpinned)
        row.detail = f"{report.hardware_class}: {report.reason}; report {settings.reports.path(wheel.sha256)}"
        if not report.passed:
            row.status = "failed"
    return 0 if report.passed else GateError.return_code


def do_publish(ctx: Context) -> int:
    with ctx.reporter.step("all", "publish") as row:
        decisions = publish.publish(ctx.settings, ctx.matrix, index_root=ctx.args.index,
                                    repository_url=ctx.args.repository_url, waivers=_waivers(ctx.args.waive),
                                    partial=ctx.args.partial, lock_timeout=ctx.args.lock_timeout,
                                    log=build_step.log_path(ctx.settings, "publish", "publish"))
        row.detail = "; ".join(f"{d.wheel.name}: {'published' if d.publish else 'blocked'} ({d.basis})"
                               for d in decisions)[:400]
    return 0


def do_serve(ctx: Context) -> int:
    from polykernels_build import serve

    serve.serve(ctx.args.index or ctx.settings.build_dir / "index", ctx.args.port)
    return 0


def _release_plan(ctx: Context, *, dry_run: bool) -> workflow_matrix.ReleasePlan:
    return workflow_matrix.plan(ctx.matrix, waivers=workflow_matrix.parse_waivers(ctx.args.waivers, ctx.matrix),
                                dry_run=dry_run)


def do_release(ctx: Context) -> int:
    args, settings = ctx.args, ctx.settings
    if workflow_matrix.parse_bool(args.dry_run, "--dry-run"):
        # What a tag push runs (the plan renders the publishing run; a dispatch may add --waivers).
        print(workflow_matrix.render(_release_plan(ctx, dry_run=False)))
        return 0
    host = Host.probe(settings.tool_env)
    outcomes = release.release(settings, ctx.matrix, release.resolve_targets(args.targets, ctx.matrix, host), host,
                               ctx.reporter, profile=args.profile, runtime=args.runtime,
                               waivers=_waivers(args.waive), partial=args.partial, index_root=args.index,
                               index_url=args.index_url, allow_unpinned=args.allow_unpinned,
                               lock_timeout=args.lock_timeout)
    for o in outcomes:
        wheel = f"{o.wheel.name} {o.wheel.size / 2**20:.2f} MiB sha256 {o.wheel.sha256[:12]}" if o.wheel else "-"
        ctx.reporter.skip(o.target, "release", f"{wheel}; suites {o.suites}; published {o.published}",
                          status="failed" if o.error else "ok")
    (settings.build_dir / "release.json").write_text(json.dumps(
        [{"target": o.target, "wheel": o.wheel.name if o.wheel else None,
          "sha256": o.wheel.sha256 if o.wheel else None, "suites": o.suites, "published": o.published,
          "error": str(o.error) if o.error else None} for o in outcomes], indent=2))
    return release.exit_code(outcomes)


def do_release_matrix(ctx: Context) -> int:
    plan = _release_plan(ctx, dry_run=workflow_matrix.parse_bool(ctx.args.dry_run, "--dry-run"))
    print(workflow_matrix.render(plan))
    if ctx.args.github_output:
        workflow_matrix.write_github_output(ctx.args.github_output, plan.outputs())
    return 0


def do_release_publish(ctx: Context) -> int:
    from polykernels_build import release_publish

    args, settings = ctx.args, ctx.settings
    with ctx.reporter.step("all", "release-publish") as row:
        outcomes = release_publish.release_publish(
            settings, ctx.matrix, _release_plan(ctx, dry_run=False), artifacts=args.artifacts, repo=args.repo,
            previous_index=args.previous_index, pages=args.pages, pypi_dir=args.pypi_dir,
            log=build_step.log_path(settings, "release", "publish"))
        row.detail = "; ".join(f"{o.target}: {o.verdict}" for o in outcomes)[:400]
    print((args.pages / "RELEASE_NOTES.md").read_text())
    if args.github_output:
        workflow_matrix.write_github_output(args.github_output,
                                            {"pypi": "true" if any(o.pypi for o in outcomes) else "false"})
    return 0


def do_verify_wheel(ctx: Context) -> int:
    from polykernels_build import attestations

    target = ctx.matrix.target(ctx.args.target)
    with ctx.reporter.step(target.name, "verify build provenance") as row:
        wheel = attestations.verify_wheel(ctx.settings, target, ctx.args.repo,
                                          build_step.log_path(ctx.settings, target.name, "verify"))
        row.detail = f"{wheel.name} sha256 {wheel.sha256[:12]}"
    return 0


def do_gate_predicate(ctx: Context) -> int:
    from polykernels_build import attestations

    target = ctx.matrix.target(ctx.args.target)
    ctx.reporter.info(f"predicate: {attestations.gate_predicate(ctx.settings, target)}")
    return 0


def do_sbom(ctx: Context) -> int:
    from polykernels_build import sbom

    target = ctx.matrix.target(ctx.args.target)
    with ctx.reporter.step(target.name, "sbom") as row:
        row.detail = str(sbom.write_sbom(ctx.settings, target, build_step.log_path(ctx.settings, target.name, "sbom")))
    return 0


def do_pin_images(ctx: Context) -> int:
    from polykernels_build import pin_images

    for pin in pin_images.pin_images(ctx.matrix, write=not ctx.args.check):
        ctx.reporter.info(f"{pin.target} {pin.slot} {pin.image}: {pin.new or pin.old or 'unpinned'} ({pin.note})")
    return 0


def do_lock(ctx: Context) -> int:
    from polykernels_build import images, locks

    log = ctx.settings.build_dir / "logs" / "lock.log"
    with ctx.reporter.step("all", "locks") as row:
        house = images.wheelhouse(ctx.settings, ctx.matrix, log)
        written = locks.compile_locks(ctx.settings, ctx.matrix, house, log)
        row.detail = ", ".join(str(p.relative_to(ctx.settings.root)) for p in written)
    return 0


def do_schema(ctx: Context) -> int:
    path = ctx.settings.root / "targets.schema.json"
    path.write_text(json.dumps(targets.json_schema(), indent=2) + "\n")
    ctx.reporter.info(f"wrote {path}")
    return 0


def do_matrix(ctx: Context) -> int:
    print(json.dumps([{"target": t.name, "backend": t.backend, "hardware": t.hardware, "variant": t.variant,
                       "runners": list(t.runners)} for t in ctx.matrix.targets.values()]))
    return 0


_TARGET = ("target", "profile", "allow_unpinned")
VERBS: dict[str, Verb] = {
    "images": Verb("build the target's builder image", do_images, _TARGET),
    "wheel": Verb("build and check the target's wheel", do_wheel, (*_TARGET, "no_ccache", "index_url")),
    "compile-matrix": Verb("compile every Triton kernel for every GPU target (CPU only)", do_compile_matrix),
    "gate": Verb("run the suites on an installed wheel, or import reports", do_gate,
                 ("runtime", "profile", "pip_arg", "trust_unsigned", "allow_unpinned"),
                 exclusive=((("wheel", "import_report"), True),)),
    "publish": Verb("publish gated wheels to a static index or a repository", do_publish,
                    ("waive", "partial", "lock_timeout"),
                    exclusive=((("index", "repository_url"), False),)),
    "serve": Verb("serve build/index on 127.0.0.1", do_serve, ("port", "index")),
    "release": Verb("images -> wheel -> gate -> publish, or --dry-run: the plan a tag push runs", do_release,
                    ("targets", "profile", "runtime", "index", "index_url", "waive", "partial", "allow_unpinned",
                     "lock_timeout", "dry_run", "waivers")),
    "release-matrix": Verb("the release workflow's job matrices, from targets.toml", do_release_matrix,
                           ("waivers", "dry_run", "github_output")),
    "release-publish": Verb("verify attestations, stage the Pages index and the PyPI upload", do_release_publish,
                            ("waivers", "github_output", "artifacts", "repo", "previous_index", "pages", "pypi_dir")),
    "verify-wheel": Verb("check a downloaded wheel carries this repository's build provenance", do_verify_wheel,
                         ("target", "repo")),
    "gate-predicate": Verb("write a target's gate report as an attestation predicate", do_gate_predicate,
                           ("target",)),
    "sbom": Verb("a CycloneDX SBOM of a target's wheel and its build tools", do_sbom, ("target",)),
    "pin-images": Verb("resolve vendor image tags to digests and rewrite targets.toml", do_pin_images, ("check",)),
    "lock": Verb("regenerate the hash locks of the build tools and the suites' dependencies", do_lock),
    "schema": Verb("write targets.schema.json for editors", do_schema),
    "matrix": Verb("print the targets as JSON (for CI job matrices)", do_matrix),
}


def _parser(settings: Settings) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m polykernels_build", description="the polykernels factory")
    parser.add_argument("--targets-file", type=Path, default=settings.root / "targets.toml")
    parser.add_argument("--debug-traceback", action="store_true", help="show the stack on failure")
    subparsers = parser.add_subparsers(dest="verb", required=True)
    options = _options(settings)
    for name, verb in VERBS.items():
        sub = subparsers.add_parser(name, help=verb.help)
        for option in verb.options:
            flags, keywords = options[option]
            sub.add_argument(*flags, **keywords)
        for names, required in verb.exclusive:
            group = sub.add_mutually_exclusive_group(required=required)
            for option in names:
                flags, keywords = options[option]
                group.add_argument(*flags, **keywords)
    return parser


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    settings = Settings.from_env(env, Path.cwd())
    reporter = Reporter.from_env(env)
    args = _parser(settings).parse_args(argv)
    try:
        context = Context(args=args, settings=settings, matrix=targets.load(args.targets_file), reporter=reporter)
        code = VERBS[args.verb].handler(context)
    except FatalError as exc:
        if args.debug_traceback:
            traceback.print_exc()
        reporter.console.print(exc.render(), markup=False)
        code = exc.return_code
    if reporter.rows:
        reporter.summary(args.verb)
    return code


if __name__ == "__main__":
    sys.exit(main())
