"""The wheel's build manifest (`_build_info.json`) and the check made at import.

A wheel built for one vendor, arch set or torch floor must refuse to run anywhere else with
an ImportError that names the install command for the right wheel, never with an
`undefined symbol` or a silently wrong kernel. At import only torch's version, vendor and GPU
runtime are compared (``check``); the device's arch when the device is first used (``check_device``).

``runtime`` is the GPU runtime the extension links (``{"soname": "libamdhip64.so.7", "version":
"7.2.53211-..."}``): a ROCm 7 torch carries ``libamdhip64.so.7`` and nothing else, so a wheel
linked against another major would fail with "cannot open shared object file"; one linked against
a newer minor than torch's may import a symbol torch's runtime lacks. Both are refused here.

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
    runtime: dict[str, Any] | None = None  # {"soname": ..., "version": ...} of the linked GPU runtime
    manylinux: str | None = None  # the glibc floor of the host code, e.g. manylinux_2_28_x86_64
    floor_reason: str | None = None  # why, where that floor is above torch's manylinux_2_28
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


def _major_minor(version: str | None, default: str) -> tuple[str, str]:
    parts = (*_version_tuple(version or default), 0, 0)[:2]
    return str(parts[0]), str(parts[1])


def variant_for(platform: Platform, info: BuildInfo | None = None) -> str:
    """The wheel variant that serves ``platform``: its runtime's major.minor, and for ROCm its arch
    (at import the arch is not queried yet: then the installed wheel's own arch). The factory's
    labels follow the same rule (backends.variant_label), and its label check enforces it."""
    if platform.backend == "cuda":
        major, minor = _major_minor(platform.runtime_version, "13.0")
        return f"cu{major}{minor}"
    if platform.backend == "rocm":
        major, minor = _major_minor(platform.runtime_version, "7.2")
        arch = platform.arch or (info.archs[0] if info and info.backend == "rocm" and len(info.archs) == 1 else None)
        return f"rocm{major}.{minor}.{arch}" if arch else f"rocm{major}.{minor}"
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
    index = index_for(info, variant_for(platform, info))
    if index is None:  # a local build: it was not published anywhere
        variant = variant_for(platform, info)
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
    if info.backend == platform.backend:
        found += _runtime_problems(info, platform)
    return found


def _runtime_problems(info: BuildInfo, platform: Platform) -> list[str]:
    """The linked GPU runtime against torch's: the same major (the soname torch ships), and a
    minor no newer than torch's (every symbol we import is proven defined by our runtime only)."""
    runtime = info.runtime or {}
    if not runtime.get("version") or not platform.runtime_version:
        return []
    name = "HIP" if info.backend == "rocm" else "CUDA"
    ours = _version_tuple(str(runtime["version"]))[:2]
    theirs = _version_tuple(platform.runtime_version)[:2]
    if len(ours) < 2 or len(theirs) < 2 or ours == theirs:
        return []
    linked = f"{runtime.get('soname')} ({name} {ours[0]}.{ours[1]})"
    if ours[0] != theirs[0]:
        return [f"it links {linked} but torch is built with {name} {platform.runtime_version}, "
                f"whose runtime is another major version"]
    if ours[1] > theirs[1]:
        return [f"it links {linked}, newer than torch's {name} {platform.runtime_version}: "
                f"torch's runtime may lack symbols it imports"]
    return []


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
