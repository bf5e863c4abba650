"""One target's wheel: cibuildwheel inside the target's builder image, auditwheel repair that
leaves torch's and the GPU runtime's libraries to the user's torch, and the build manifest."""

from __future__ import annotations

import json
import shutil
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from polykernels_build.dist import Wheel
from polykernels_build.errors import BuildError, ConfigError, ToolError
from polykernels_build.images import BuilderImage
from polykernels_build.settings import Settings
from polykernels_build.targets import Target
from polykernels_build.tools import run

# Provided by the user's torch (and its GPU runtime): never vendored into our wheel.
EXCLUDED_LIBRARIES = ("libtorch.so", "libtorch_cpu.so", "libc10.so", "libcudart.so.*", "libamdhip64.so.*")
CCACHE_VOLUME = "polykernels-ccache"


def export_source(settings: Settings, destination: Path, log: Path) -> tuple[str | None, bool, int]:
    """Copies the files git knows (tracked and untracked-not-ignored) into ``destination``.

    Returns (commit sha, dirty, commit time). The build never sees build/ or other ignored files.
    """
    if destination.exists():
        shutil.rmtree(destination)
    destination.mkdir(parents=True)

    def git(*args: str) -> str:
        return run(["git", *args], log=log, env=settings.tool_env, cwd=settings.root, stderr_to_log=True)

    try:
        files = [f for f in git("ls-files", "-co", "--exclude-standard", "-z").split("\0") if f]
        sha = git("rev-parse", "HEAD").strip() or None
        dirty = bool(git("status", "--porcelain").strip())
        commit_time = int(git("log", "-1", "--format=%ct").strip())
    except (ToolError, FileNotFoundError) as exc:
        raise BuildError("the source tree must be a git checkout (the manifest records its commit)") from exc
    for name in files:
        source = settings.root / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return sha, dirty, commit_time


def index_url(root_url: str, target: Target) -> str:
    """The index this target's wheel is published under: ``<root>/<variant>/simple``."""
    return f"{root_url.rstrip('/')}/{target.variant}/simple"


def build_info(target: Target, image: BuilderImage, git_sha: str | None, dirty: bool,
               commit_time: int, root_url: str) -> dict[str, Any]:
    """The manifest embedded in the wheel, and what setup.py compiles from: backend, archs and
    torch floor (the extension's TORCH_TARGET_VERSION) come from the target here and nowhere else.
    Its time is the commit's, so that rebuilding the same commit in the same image gives the same
    bytes (and publishing them again is a no-op)."""
    return {
        "target": target.name,
        "variant": target.variant,
        "local_label": not target.pypi,  # the PyPI target's version carries no +variant
        "backend": target.backend,
        "archs": list(target.archs),
        "toolkit": None if target.toolkit == "none" else target.toolkit,
        "torch_floor": target.torch_floor,
        "git_sha": git_sha,
        "git_dirty": dirty,
        "profile": image.profile,
        "image": image.tag,
        "image_digest": image.image_id,
        "image_base": image.base,
        # The glibc/libstdc++ floor of the host code, enforced by auditwheel repair --plat; a reason
        # only where it is above torch's manylinux_2_28.
        "manylinux": image.platform_tag,
        "floor_reason": image.floor_reason or None,
        # Exact versions of the bootstrap's Debian packages in the builder (offline profile only).
        "debian_packages": dict(image.debian_packages) or None,
        "built_at": datetime.fromtimestamp(commit_time, timezone.utc).isoformat(timespec="seconds"),
        "index_url": index_url(root_url, target),
    }


def cibuildwheel_env(settings: Settings, target: Target, image: BuilderImage, info: dict[str, Any],
                     ccache: bool) -> dict[str, str]:
    manifest = json.dumps(info, separators=(",", ":"))
    if "'" in manifest:
        raise ConfigError("build manifest values must not contain single quotes")
    epoch = int(datetime.fromisoformat(info["built_at"]).timestamp())
    # The manifest is the build's whole configuration: setup.py takes backend, archs and floor from it.
    variables = {"POLYKERNELS_BUILD_INFO": f"'{manifest}'", "SOURCE_DATE_EPOCH": str(epoch)}
    create_args = "--pull=never"
    if ccache:
        variables.update({"POLYKERNELS_COMPILER_LAUNCHER": "ccache", "CCACHE_DIR": "/ccache",
                          "CCACHE_BASEDIR": "/project", "CCACHE_NOHASHDIR": "true"})
        create_args += f" --volume {CCACHE_VOLUME}:/ccache"
    excludes = " ".join(f"--exclude '{lib}'" for lib in EXCLUDED_LIBRARIES)
    return {
        **settings.tool_env,
        "CIBW_PLATFORM": "linux",
        "CIBW_ARCHS": "x86_64",
        "CIBW_BUILD": image.build_identifier,
        "CIBW_MANYLINUX_X86_64_IMAGE": image.tag,
        "CIBW_CONTAINER_ENGINE": f"docker; create_args: {create_args}",
        "CIBW_BUILD_FRONTEND": "build; args: --no-isolation --skip-dependency-check",
        "CIBW_ENVIRONMENT": " ".join(f"{k}={v}" for k, v in variables.items()),
        # --plat: the recipe's floor is a promise; auditwheel fails the build if a symbol breaks it.
        # --only-plat: that one tag (torch's own), not every older one the symbols happen to allow.
        "CIBW_REPAIR_WHEEL_COMMAND_LINUX": (f"auditwheel repair --plat {image.platform_tag} --only-plat {excludes} "
                                            f"-w {{dest_dir}} {{wheel}}"),
        "CIBW_BUILD_VERBOSITY": "1",
        # cibuildwheel's abi3 audit fetches virtualenv at run time (no network in air-gapped builds);
        # checks.check_symbols holds the extension's Python symbols to the limited API instead.
        "CIBW_AUDIT_COMMAND": "",
    }


def build_wheel(settings: Settings, target: Target, image: BuilderImage, log: Path, *, root_url: str,
                ccache: bool = True) -> Wheel:
    source = settings.build_dir / "src" / target.name
    sha, dirty, commit_time = export_source(settings, source, log)
    info = build_info(target, image, sha, dirty, commit_time, root_url)
    out = settings.dist_dir / target.name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    env = cibuildwheel_env(settings, target, image, info, ccache)
    # Run from the exported tree: cibuildwheel copies its working directory into the container.
    run([sys.executable, "-m", "cibuildwheel", "--output-dir", str(out), "."], log=log, env=env, cwd=source,
        hint=f"the compiler output is in {log}; POLYKERNELS_KEEP_CONTAINER does not apply to cibuildwheel, "
             "rerun with CIBW_DEBUG_KEEP_CONTAINER=1 to inspect its container")
    wheels = sorted(out.glob("*.whl"))
    if len(wheels) != 1:
        raise BuildError(f"{target.name}: expected one wheel in {out}, found {[w.name for w in wheels]}", log=log)
    return Wheel.open(wheels[0]).save()
