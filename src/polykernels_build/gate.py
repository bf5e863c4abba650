"""The gate: install the exact wheel file into a clean environment, run the suites there, and
keep a report bound to the wheel's sha256 and to the hardware the suites ran on."""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from polykernels_build import backends, engine, images, locks
from polykernels_build.dist import GateReport, Wheel, built, judge
from polykernels_build.errors import ConfigError, GateError
from polykernels_build.settings import Settings
from polykernels_build.targets import Matrix, Target
from polykernels_build.tools import run

RUNTIMES = ("container", "venv")


def may_gate(target: Target, hardware_class: str) -> bool:
    """Whether suites that ran on ``hardware_class`` can gate ``target``: the backend's one rule."""
    return backends.get(target.backend).can_gate(target.hardware, backends.Host.that_ran(hardware_class))


def suites_requirements(settings: Settings) -> list[str]:
    """The suites' dependencies, as pyproject.toml declares them (the `suites` extra)."""
    project = tomllib.loads((settings.root / "pyproject.toml").read_text())["project"]
    return list(project["optional-dependencies"]["suites"])


def _runtime_image(settings: Settings, matrix: Matrix, target: Target, profile: str, log: Path,
                   allow_unpinned: bool = False) -> str:
    if profile == "vendor":
        if not target.runtime.digest and not allow_unpinned:
            raise ConfigError(f"{target.name}: the runtime image {target.runtime.image} is not pinned by digest in "
                              f"{matrix.path}", hint="put its sha256 into the target's runtime.digest (a tag such "
                              "as :latest moves), or pass --allow-unpinned for a local experiment")
        return engine.require_image(target.runtime.reference,
                                    f"pull {target.runtime.reference} (or use --profile offline)", settings.tool_env)
    if target.backend != "cpu":  # the offline profile installs PyPI's CPU torch only
        raise GateError(f"{target.name}: the offline profile has no GPU runtime image (no GPU torch can be "
                        "installed offline)", hint="gate on a GPU host with --runtime venv, then --import-report")
    base = images.debian_base_for(settings, matrix.bootstrap_for(target), log)
    context = images.build_context(settings, matrix, log)
    # Hash-locked: the suites' lock plus the build torch with targets.toml's sha256s.
    (context / locks.RUNTIME_REQUIREMENTS).write_text(locks.runtime_requirements(settings, matrix))
    return engine.build(context / "runtime" / "Dockerfile", context, f"polykernels-runtime:{target.name}-offline",
                        build_args={"BASE_IMAGE": base}, log=log, tool_env=settings.tool_env)


def _run_in_container(settings: Settings, image: str, wheel: Path, out: Path, log: Path) -> None:
    mounts = [(wheel.parent.resolve(), "/wheels"), (out.resolve(), "/out")]
    with engine.Container(image, log=log, tool_env=settings.tool_env, mounts=mounts,
                          keep=settings.keep_containers) as box:
        # --no-index: every dependency range must be satisfied by the runtime as it stands.
        box.exec(["python3", "-m", "pip", "install", "--no-index", "--disable-pip-version-check",
                  f"/wheels/{wheel.name}[suites]"])
        box.exec(["python3", "-m", "polykernels.suites", "--report", "/out/suites.json"], workdir="/tmp")


def _run_in_venv(settings: Settings, wheel: Path, out: Path, log: Path, pip_args: list[str]) -> None:
    """A fresh venv layered on the host Python's packages (a GPU host's own torch), the wheel installed
    into the venv alone. A .pth file does the layering: --system-site-packages would reach only the
    base interpreter when the host Python is itself a venv."""
    venv = out / "venv"
    host_sites = run(["python3", "-c", "import json, site; print(json.dumps(site.getsitepackages()))"], log=log,
                     env=settings.tool_env).strip().splitlines()[-1]
    run(["python3", "-m", "venv", str(venv)], log=log, env=settings.tool_env)
    python = venv / "bin" / "python"
    site_dir = run([str(python), "-c", "import site; print(site.getsitepackages()[0])"], log=log,
                   env=settings.tool_env).strip().splitlines()[-1]
    (Path(site_dir) / "polykernels-gate-host.pth").write_text("\n".join(json.loads(host_sites)) + "\n")
    # The exact file, with the suites' declared dependencies (its `suites` extra).
    run([str(python), "-m", "pip", "install", "--disable-pip-version-check", *pip_args, f"{wheel.resolve()}[suites]"],
        log=log, env=settings.tool_env)
    with tempfile.TemporaryDirectory() as elsewhere:  # never import from the source tree
        env = {k: v for k, v in settings.tool_env.items() if k != "PYTHONPATH"}
        extra = settings.tool_env.get("PYTHONPATH")
        if extra:  # host-provided packages (e.g. carried wheels) stay visible, our src does not
            env["PYTHONPATH"] = ":".join(p for p in extra.split(":") if p and not p.rstrip("/").endswith("src"))
        run([str(python), "-m", "polykernels.suites", "--report", str((out / "suites.json").resolve())], log=log,
            env=env, cwd=Path(elsewhere))


def gate(settings: Settings, matrix: Matrix, wheel: Wheel, *, runtime: str, profile: str, log: Path,
         pip_args: list[str] | None = None, allow_unpinned: bool = False) -> GateReport:
    """Runs the suites on ``wheel`` (as the build handed it over) and stores the report for its sha256."""
    target = matrix.target(wheel.target)
    out = settings.build_dir / "gate" / wheel.sha256[:16]
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    if runtime not in RUNTIMES:
        raise ConfigError(f"--runtime {runtime!r}: expected one of {', '.join(RUNTIMES)}")
    start = time.perf_counter()
    try:
        if runtime == "container":
            engine.require_engine(settings.tool_env)
            image = _runtime_image(settings, matrix, target, profile, log, allow_unpinned)
            _run_in_container(settings, image, wheel.path, out, log)
        else:
            _run_in_venv(settings, wheel.path, out, log, pip_args or [])
    except Exception:
        # The suites exit non-zero when a case fails: that is a verdict, judged below, not a crash.
        if not (out / "suites.json").exists():
            raise
    try:
        suites = json.loads((out / "suites.json").read_text())
    except ValueError as exc:
        raise GateError(f"the suites wrote a report that is not JSON ({exc})", log=log) from None
    passed, reason = judge(suites, str(out / "suites.json"))
    seen = backends.hardware_class(suites.get("platform", {}))
    if passed and not may_gate(target, seen):
        passed, reason = False, f"ran on {seen}, but {target.name} must be gated on {target.hardware}"
    report = GateReport(
        wheel_sha256=wheel.sha256, wheel_name=wheel.name, target=target.name, variant=target.variant,
        hardware_class=seen, runtime=runtime, host=socket.gethostname(), passed=passed, reason=reason,
        seconds=round(time.perf_counter() - start, 1),
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), suites=suites,
    )
    settings.reports.store(report)
    return report


def open_wheel(path: Path) -> Wheel:
    """A wheel named on the command line (`gate --wheel W`): its identity, read once."""
    if not path.is_file():
        raise ConfigError(f"--wheel {path}: no such file")
    return Wheel.open(path)


def import_report(settings: Settings, matrix: Matrix, source: Path, *, trust_unsigned: str | None = None) -> GateReport:
    """Keeps a report made elsewhere (a GPU runner) if it belongs to a wheel we built and an allowed
    signer signed it (``<report>.sig`` beside it, as ``ssh-keygen -Y sign`` writes it). An unsigned
    report, or one from an unknown signer, is kept only with ``trust_unsigned``: the operator's reason,
    recorded beside the report and named in the release notes of every wheel it lets out.

    A failed verdict is kept too (it is the truth about those bytes, and it blocks them); the caller
    turns it into the gate's exit code."""
    try:
        data = source.read_bytes()
    except OSError as exc:
        raise GateError(f"--import-report {source}: cannot read it ({exc.strerror or exc})") from None
    report = GateReport.from_json(data.decode(errors="replace"), str(source))
    wheels = built(settings.dist_dir)
    if report.wheel_sha256 not in wheels:
        raise GateError(f"{source} is for a wheel with sha256 {report.wheel_sha256[:16]}..., which is not under "
                        f"{settings.dist_dir}", hint="import reports only for wheels this release built")
    wheel = wheels[report.wheel_sha256]
    target = matrix.target(wheel.target)
    if report.target != target.name or report.variant != target.variant or report.wheel_name != wheel.name:
        raise GateError(f"{source} says {report.wheel_name} of target {report.target} ({report.variant}), but those "
                        f"bytes are {wheel.name} of {target.name} ({target.variant})")
    passed, _ = judge(report.suites, str(source))
    if report.passed != (passed and may_gate(target, report.hardware_class)) or \
            backends.hardware_class(report.suites.get("platform", {})) != report.hardware_class:
        raise GateError(f"{source}: its verdict does not follow from the suite results it carries")
    signature_file = source.with_name(source.name + ".sig")
    signature = signature_file.read_bytes() if signature_file.is_file() else None
    try:
        settings.keyring.verify(data, signature, str(source))
    except GateError:
        if not trust_unsigned:
            raise
        trust = {"reason": trust_unsigned, "source": source.name, "signed": signature is not None,
                 "sha256_of_report": hashlib.sha256(data).hexdigest()}
        settings.reports.keep(report, data, None, trust=trust)
        return report
    settings.reports.keep(report, data, signature, trust=None)
    return report
