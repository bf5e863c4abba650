"""The wheel's build manifest (`_build_info.json`) and the check made at import.

A wheel built for one vendor, arch set or torch floor must refuse to run anywhere else with
an ImportError that names the install command for the right wheel, never with an
`undefined symbol` or a silently wrong kernel. At import only torch's version and vendor are
compared (``check``); the device's arch when the device is first used (``check_device``).

The factory writes ``index_url`` (``<root>/<variant>/simple``, from targets.toml or the release's
--index-url) into every manifest, so the command names the index of the variant that fits.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polykernels.platform import Platform

BUILD_INFO_PATH = Path(__file__).with_name("_build_info.json")


class IncompatibleWheelError(ImportError):
    """The installed wheel was built for another platform or a newer torch."""


@dataclass(frozen=True, kw_only=True)
class BuildInfo:
    target: str
    variant: str | None
    backend: str
    archs: tuple[str, ...]
    toolkit: str | None
    torch_floor: str
    git_sha: str | None = None
    image_digest: str | None = None
    built_at: str | None = None
    index_url: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BuildInfo:
        known = {f for f in cls.__dataclass_fields__ if f != "extra"}
        values = {k: v for k, v in data.items() if k in known}
        values["archs"] = tuple(values.get("archs") or ())
        return cls(**values, extra={k: v for k, v in data.items() if k not in known and k != "schema"})


def load_build_info(path: Path = BUILD_INFO_PATH) -> BuildInfo | None:
    if not path.exists():
        return None
    return BuildInfo.from_dict(json.loads(path.read_text()))


def variant_for(platform: Platform) -> str:
    """The wheel variant that serves ``platform`` (the factory's targets follow this rule)."""
    if platform.backend == "cuda":
        major = (platform.runtime_version or "13.0").split(".")[0]
        return f"cu{major}0"
    if platform.backend == "rocm":
        major = (platform.runtime_version or "7").split(".")[0]
        return f"rocm{major}.{platform.arch}"
    return "cpu"


def index_for(info: BuildInfo, variant: str) -> str | None:
    """The index of ``variant``, next to the one this wheel was published in."""
    if not info.index_url:
        return None
    own = f"/{info.variant}/simple"
    root = info.index_url.rstrip("/")
    root = root[: -len(own)] if info.variant and root.endswith(own) else root
    return f"{root}/{variant}/simple"


def install_command(info: BuildInfo, platform: Platform) -> str:
    index = index_for(info, variant_for(platform))
    if index is None:  # a local build: it was not published anywhere
        variant = variant_for(platform)
        return f"pip install --force-reinstall polykernels from the {variant} index (<your index>/{variant}/simple)"
    return f"pip install --force-reinstall --index-url {index} polykernels"


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("+", maxsplit=1)[0].split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def _arch_covered(arch: str, archs: tuple[str, ...]) -> bool:
    """Whether device code in ``archs`` runs on ``arch``.

    gfx code objects run only on their own arch. A CUDA cubin for X.Y runs on X.Z with Z >= Y
    (arch-specific 'a'/'f' cubins only on their own arch); PTX of X.Y JIT-compiles on anything newer.
    """
    if arch.startswith("gfx"):
        return arch in archs
    wanted = int(arch.removeprefix("sm_").rstrip("af"))
    for entry in archs:
        base = entry.split("+")[0]
        specific = base[-1] in "af"
        major, minor = (int(p) for p in base.rstrip("af").split("."))
        number = major * 10 + minor
        if number == wanted:
            return True
        if not specific and major == wanted // 10 and minor <= wanted % 10:
            return True
        if entry.endswith("+PTX") and number <= wanted:
            return True
    return False


def problems(info: BuildInfo, platform: Platform, torch_version: str) -> list[str]:
    """Everything that makes this wheel wrong for this process, as sentences."""
    found: list[str] = []
    if _version_tuple(torch_version) < _version_tuple(info.torch_floor):
        found.append(f"it needs torch >= {info.torch_floor}, but torch {torch_version} is installed")
    return found + _platform_problems(info, platform)


def _platform_problems(info: BuildInfo, platform: Platform) -> list[str]:
    found: list[str] = []
    if info.backend == "cuda" and platform.backend == "rocm":
        found.append(f"it is a CUDA build ({info.variant}) but torch is a ROCm build (HIP {platform.runtime_version})")
    elif info.backend == "rocm" and platform.backend == "cuda":
        found.append(f"it is a ROCm build ({info.variant}) but torch is a CUDA build (CUDA {platform.runtime_version})")
    elif info.backend == platform.backend and platform.arch and not _arch_covered(platform.arch, info.archs):
        found.append(
            f"it has no device code for this GPU ({platform.device_name}, {platform.arch}); "
            f"it was built for {', '.join(info.archs)}"
        )
    return found


def check_device(info: BuildInfo | None, platform: Platform) -> None:
    """The arch check, made once the device has been queried (before the first launch)."""
    if info is None or info.backend == "cpu":  # a CPU wheel promises no device code
        return
    found = _platform_problems(info, platform)
    if found:
        _refuse(info, platform, found)


def check(info: BuildInfo | None, platform: Platform, torch_version: str) -> None:
    if info is None:  # a source checkout: nothing was promised
        return
    found = problems(info, platform, torch_version)
    if found:
        _refuse(info, platform, found)


def _refuse(info: BuildInfo, platform: Platform, found: list[str]) -> None:
    if len(found) == 1 and found[0].startswith("it needs torch"):
        fix = f"upgrade torch: pip install --upgrade 'torch>={info.torch_floor}'"
    else:
        fix = f"install the matching wheel: {install_command(info, platform)}"
    raise IncompatibleWheelError(
        f"this polykernels wheel (target {info.target}) cannot run here: {'; and '.join(found)}. To fix, {fix}"
    )
