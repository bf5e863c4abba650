# /// script
# dependencies = ["nox>=2025.2.9"]
# ///
"""polykernels sessions. Each one lists what it installs and delegates; logic lives in the packages.

    nox -s release                      build, gate and publish what this host can gate (the main job)
    nox -s lint tests wheels_e2e        the test suite (wheels_e2e needs a Docker engine)
    nox -s bench                        GPU benchmarks -> build/bench (needs a GPU)
"""

from __future__ import annotations

import sys

import nox

nox.needs_version = ">=2025.2.9"
nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lint", "tests"]

PYPROJECT = nox.project.load_toml("pyproject.toml")
MATRIX = nox.project.load_toml("targets.toml")
# The torch the tests and the factory run against: the one every wheel is built against.
TEST_TORCH = MATRIX["build"]["torch"]
# One `wheel(<target>)` session per target, tagged with its backend: `nox -s "wheel(cu130)"`, `nox -t rocm`.
TARGETS = [nox.param(name, id=name, tags=[table["backend"]]) for name, table in MATRIX["target"].items()]


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
    """ruff over the whole tree."""
    session.install(*_group("lint"))
    session.run("ruff", "check", ".")


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
    session.install(*_group("factory"))
    # `nox -s wheel -- --target T` still works: a --target in the arguments picks the one session that runs.
    chosen = session.posargs[session.posargs.index("--target") + 1] if "--target" in session.posargs else target
    if chosen != target:
        session.skip(f"--target {chosen}")
    rest = [a for i, a in enumerate(session.posargs)
            if a != "--target" and (i == 0 or session.posargs[i - 1] != "--target")]
    session.run("python", "-m", "polykernels_build", "wheel", "--target", target, *rest, env={"PYTHONPATH": "src"})


@nox.session(default=False)
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


@nox.session(default=False)
def wheels_e2e(session: nox.Session) -> None:
    """Container builds end to end (needs Docker): every target builds; the cpu wheel is gated, published, installed."""
    session.install(*_group("test"), *_group("factory"), TEST_TORCH)
    session.run("pytest", "tests/e2e", "--run-docker", *session.posargs)


if __name__ == "__main__":
    nox.main()
