"""The gate: install the exact wheel file into a clean environment, run the suites there, and
keep a report bound to the wheel's sha256 and to the hardware the suites ran on."""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from polykernels_build import engine, images
from polykernels_build.errors import ConfigError, GateError
from polykernels_build.settings import Settings
from polykernels_build.targets import Matrix, Target
from polykernels_build.tools import run
from polykernels_build.wheels import sha256_of

GATE_SCHEMA = 1
REQUIRED_SUITES = ("qwen_generation", "flux_warmup", "int4_parity")


@dataclass(kw_only=True)
class GateReport:
    schema: int = GATE_SCHEMA
    wheel_sha256: str
    wheel_name: str
    target: str
    variant: str
    hardware_class: str  # nvidia | gfx942 | gfx950 | cpu
    runtime: str
    host: str
    passed: bool
    reason: str
    seconds: float
    created_at: str
    suites: dict[str, Any] = field(default_factory=dict)  # the report `python -m polykernels.suites` wrote

    @classmethod
    def from_json(cls, text: str, source: str) -> GateReport:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise GateError(f"{source} is not JSON: {exc}") from None
        if not isinstance(data, dict) or data.get("schema") != GATE_SCHEMA:
            raise GateError(f"{source} is not a polykernels gate report (schema {GATE_SCHEMA})")
        known = set(cls.__dataclass_fields__)
        missing = known - set(data) - {"suites"}
        if missing:
            raise GateError(f"{source} lacks {sorted(missing)}")
        return cls(**{k: v for k, v in data.items() if k in known})


def manifest_of(wheel: Path) -> dict[str, Any]:
    try:
        with zipfile.ZipFile(wheel) as archive:
            return json.loads(archive.read("polykernels/_build_info.json"))
    except (KeyError, zipfile.BadZipFile, FileNotFoundError) as exc:
        raise GateError(f"{wheel} is not a polykernels wheel with a build manifest ({exc})") from None


def hardware_class(platform: dict[str, Any]) -> str:
    if platform.get("backend") == "cuda":
        return "nvidia"
    if platform.get("backend") == "rocm":
        return str(platform.get("arch"))
    return "cpu"


def hardware_matches(target: Target, seen: str) -> bool:
    return target.hardware in ("any", seen)


def judge(suites: dict[str, Any]) -> tuple[bool, str]:
    by_name = {s["name"]: s for s in suites.get("suites", [])}
    problems = [f"{name}: {by_name[name]['status'] if name in by_name else 'not run'}"
                for name in REQUIRED_SUITES if by_name.get(name, {}).get("status") != "passed"]
    return not problems, "; ".join(problems) or "all suites passed"


def suites_requirements(settings: Settings) -> list[str]:
    """The suites' dependencies, as pyproject.toml declares them (the `suites` extra)."""
    project = tomllib.loads((settings.root / "pyproject.toml").read_text())["project"]
    return list(project["optional-dependencies"]["suites"])


def _runtime_image(settings: Settings, matrix: Matrix, target: Target, profile: str, log: Path) -> str:
    if profile == "vendor":
        return engine.require_image(target.runtime.reference,
                                    f"pull {target.runtime.reference} (or use --profile offline)")
    if target.backend != "cpu":
        raise GateError(f"{target.name}: the offline profile has no GPU runtime image (no GPU torch can be "
                        "installed offline)", hint="gate on a GPU host with --runtime venv, then --import-report")
    base = images.debian_base_for(settings, matrix.bootstrap_for(target), log)
    context = images.build_context(settings, matrix, log)
    packages = " ".join([matrix.build_torch, *suites_requirements(settings)])
    return engine.build(context / "runtime" / "Dockerfile", context, f"polykernels-runtime:{target.name}-offline",
                        build_args={"BASE_IMAGE": base, "PACKAGES": packages}, log=log, tool_env=settings.tool_env)


def _run_in_container(settings: Settings, image: str, wheel: Path, out: Path, log: Path) -> None:
    mounts = [(wheel.parent.resolve(), "/wheels"), (out.resolve(), "/out")]
    with engine.Container(image, log=log, mounts=mounts, keep=settings.keep_containers) as box:
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


def gate(settings: Settings, matrix: Matrix, wheel: Path, *, runtime: str, profile: str, log: Path,
         pip_args: list[str] | None = None) -> GateReport:
    if not wheel.is_file():
        raise ConfigError(f"--wheel {wheel}: no such file")
    manifest = manifest_of(wheel)
    target = matrix.target(manifest["target"])
    sha = sha256_of(wheel)
    out = settings.build_dir / "gate" / sha[:16]
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    if runtime not in ("container", "venv"):
        raise ConfigError(f"--runtime {runtime!r}: expected container or venv")
    start = time.perf_counter()
    try:
        if runtime == "container":
            engine.require_engine(settings.tool_env)
            _run_in_container(settings, _runtime_image(settings, matrix, target, profile, log), wheel, out, log)
        else:
            _run_in_venv(settings, wheel, out, log, pip_args or [])
    except Exception:
        # The suites exit non-zero when a case fails: that is a verdict, judged below, not a crash.
        if not (out / "suites.json").exists():
            raise
    suites = json.loads((out / "suites.json").read_text())
    passed, reason = judge(suites)
    seen = hardware_class(suites.get("platform", {}))
    if passed and not hardware_matches(target, seen):
        passed, reason = False, f"ran on {seen}, but {target.name} must be gated on {target.hardware}"
    report = GateReport(
        wheel_sha256=sha, wheel_name=wheel.name, target=target.name, variant=target.variant, hardware_class=seen,
        runtime=runtime, host=socket.gethostname(), passed=passed, reason=reason,
        seconds=round(time.perf_counter() - start, 1),
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), suites=suites,
    )
    store(settings, report)
    return report


def reports_dir(settings: Settings) -> Path:
    return settings.build_dir / "reports"


def store(settings: Settings, report: GateReport) -> Path:
    from polykernels_build.index import write_atomically

    path = reports_dir(settings) / f"{report.wheel_sha256}.json"
    write_atomically(path, json.dumps(asdict(report), indent=2))
    return path


def built_wheels(settings: Settings) -> dict[str, Path]:
    """sha256 -> wheel, for every wheel under build/dist."""
    return {sha256_of(w): w for w in sorted((settings.build_dir / "dist").glob("*/*.whl"))}


def import_report(settings: Settings, matrix: Matrix, source: Path) -> GateReport:
    """Keep a report made elsewhere (a GPU runner) if it belongs to a wheel we built."""
    report = GateReport.from_json(source.read_text(), str(source))
    wheels = built_wheels(settings)
    if report.wheel_sha256 not in wheels:
        raise GateError(f"{source} is for a wheel with sha256 {report.wheel_sha256[:16]}..., which is not under "
                        f"{settings.build_dir / 'dist'}", hint="import reports only for wheels this release built")
    wheel = wheels[report.wheel_sha256]
    target = matrix.target(manifest_of(wheel)["target"])
    if report.target != target.name:
        raise GateError(f"{source} says target {report.target}, but the wheel is for {target.name}")
    passed, _ = judge(report.suites)
    if report.passed != passed or hardware_class(report.suites.get("platform", {})) != report.hardware_class:
        raise GateError(f"{source}: its verdict does not follow from the suite results it carries")
    store(settings, report)
    return report


def load_report(settings: Settings, sha: str) -> GateReport | None:
    path = reports_dir(settings) / f"{sha}.json"
    return GateReport.from_json(path.read_text(), str(path)) if path.exists() else None
