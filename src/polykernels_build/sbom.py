"""An SBOM per built wheel, from CycloneDX's own generator (cyclonedx-py), never written by hand.

The SBOM describes an environment holding the exact wheel (its files, version and declared
requirements) beside the factory's build tools from pyproject's `factory` group (cibuildwheel,
auditwheel, ...): what the wheel contains and what built it. The builder image itself is named by
digest in the wheel's manifest and in its build-provenance attestation.
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from polykernels_build.dist import Wheel, built
from polykernels_build.errors import ConfigError
from polykernels_build.settings import Settings
from polykernels_build.targets import Target
from polykernels_build.tools import run


def recorded_wheel(settings: Settings, target: Target) -> Wheel:
    """The one wheel the build recorded for ``target`` (a release builds exactly one per target)."""
    found = [w for w in built(settings.dist_dir).values() if w.target == target.name]
    if len(found) != 1:
        raise ConfigError(f"{target.name}: expected exactly one recorded wheel under {settings.dist_dir}, found "
                          f"{[w.name for w in found] or 'none'}", hint=f'nox -s "wheel({target.name})"')
    return found[0]


def build_tools(settings: Settings) -> list[str]:
    """pyproject's `factory` dependency group: the host-side tools that build and repair wheels."""
    groups = tomllib.loads((settings.root / "pyproject.toml").read_text())["dependency-groups"]
    return [r for r in groups["factory"] if isinstance(r, str)]


def write_sbom(settings: Settings, target: Target, log: Path) -> Path:
    wheel = recorded_wheel(settings, target)
    out = settings.build_dir / "sbom" / target.name
    env_dir = out / "env"
    run([sys.executable, "-m", "venv", "--clear", str(env_dir)], log=log, env=settings.tool_env)
    python = env_dir / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--quiet"]
    run([*pip, *build_tools(settings)], log=log, env=settings.tool_env)
    run([*pip, "--no-deps", str(wheel.path)], log=log, env=settings.tool_env)
    sbom = out / f"{wheel.name}.cdx.json"
    run(["cyclonedx-py", "environment", "--pyproject", str(settings.root / "pyproject.toml"), "--mc-type", "library",
         "--output-reproducible", "--output-format", "JSON", "--output-file", str(sbom), str(python)], log=log,
        env=settings.tool_env)
    return sbom
