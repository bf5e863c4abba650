"""The Docker engine, driven through its CLI so every call is a command a person could type."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from polykernels_build.errors import EngineError, ImageError
from polykernels_build.tools import run

MIN_VERSION = (20, 10)
INSTALL_HINT = ("install a Docker engine (Debian/Ubuntu: apt-get install -y docker.io, then start dockerd) "
                "and make sure `docker info` answers")


def require_engine(tool_env: Mapping[str, str]) -> None:
    binary = shutil.which("docker", path=tool_env.get("PATH", ""))
    if binary is None:
        raise EngineError("no Docker engine: the `docker` command is not installed", hint=INSTALL_HINT)
    proc = subprocess.run([binary, "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True,
                          check=False, timeout=60, env=dict(tool_env))
    if proc.returncode != 0 or not proc.stdout.strip():
        raise EngineError("the Docker engine is not running (`docker version` got no server answer)",
                          hint="start it (e.g. `dockerd &` or `systemctl start docker`), then retry")
    version = tuple(int(p) for p in proc.stdout.strip().split("+")[0].split("-")[0].split(".")[:2] if p.isdigit())
    if version < MIN_VERSION:
        raise EngineError(f"Docker engine {proc.stdout.strip()} is too old: need >= "
                          f"{'.'.join(map(str, MIN_VERSION))}", hint=INSTALL_HINT)


def image_id(reference: str, tool_env: Mapping[str, str]) -> str | None:
    proc = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", reference], capture_output=True,
                          text=True, check=False, env=dict(tool_env))
    return proc.stdout.strip() if proc.returncode == 0 else None


def require_image(reference: str, hint: str, tool_env: Mapping[str, str]) -> str:
    found = image_id(reference, tool_env)
    if found is None:
        raise ImageError(f"image {reference} is not present on this engine", hint=hint)
    return found


def build(dockerfile: Path, context: Path, tag: str, *, build_args: Mapping[str, str], log: Path,
          tool_env: Mapping[str, str]) -> str:
    """`docker build`; returns the image id. The classic builder: it needs no buildx plugin, and
    the recipes keep secrets out of final images with download stages instead of BuildKit mounts."""
    argv = ["docker", "build", "-f", str(dockerfile), "-t", tag]
    for key, value in build_args.items():
        argv += ["--build-arg", f"{key}={value}"]
    run([*argv, str(context)], log=log, env={**tool_env, "DOCKER_BUILDKIT": "0"},
        hint=f"read the build log, then retry with `nox -s images -- ...`; log {log}")
    return require_image(tag, "the build reported success but left no image", tool_env)


class Container:
    """A throwaway container running one long-lived shell; removed on exit unless ``keep``."""

    def __init__(self, image: str, *, log: Path, tool_env: Mapping[str, str],
                 mounts: Sequence[tuple[Path, str]] = (), keep: bool = False,
                 env: Mapping[str, str] | None = None) -> None:
        self.image = image
        self.tool_env = tool_env
        self.log = log
        self.mounts = mounts
        self.keep = keep
        self.env = env or {}
        self.name = f"polykernels-{uuid.uuid4().hex[:12]}"

    def __enter__(self) -> Container:
        argv = ["docker", "run", "-d", "--pull=never", "--name", self.name]
        for host, inside in self.mounts:
            argv += ["-v", f"{host}:{inside}"]
        for key, value in self.env.items():
            argv += ["-e", f"{key}={value}"]
        run([*argv, self.image, "sleep", "infinity"], log=self.log, env=self.tool_env)
        return self

    def exec(self, argv: Sequence[str], *, workdir: str | None = None) -> str:
        prefix = ["docker", "exec"] + (["-w", workdir] if workdir else []) + [self.name]
        return run([*prefix, *argv], log=self.log, env=self.tool_env)

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        if self.keep:
            return
        run(["docker", "rm", "-f", self.name], log=self.log, env=self.tool_env, check=False)
