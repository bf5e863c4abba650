"""Checks every built wheel must pass before it can be gated: manifest, size, device-code
coverage, and undefined symbols limited to torch's stable C ABI and the GPU runtime."""

from __future__ import annotations

import json
import re
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from polykernels_build import backends
from polykernels_build.dist import Wheel
from polykernels_build.errors import CheckError
from polykernels_build.targets import Target
from polykernels_build.tools import run

SYSTEM_VERSIONS = ("@GLIBC_", "@GLIBCXX_", "@CXXABI_", "@GCC_")
STABLE_HEADER_DIRS = ("torch/csrc/stable/c", "torch/csrc/inductor/aoti_torch/c")
STABLE_NAME = re.compile(r"\b((?:aoti_torch|torch)_[A-Za-z0-9_]+)\s*\(")
# std:: entities (mangled _ZSt..., _ZNSt..., _ZNKSt...): the C++ runtime's, not torch's ABI.
STD_LIBRARY = re.compile(r"^_Z(N[KRVO]*)?St")


@dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool
    detail: str


def extract(wheel: Path, member_suffix: str, destination: Path) -> Path:
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith(member_suffix) or Path(n).name.startswith(member_suffix)]
        if not names:
            raise CheckError(f"{wheel.name} has no {member_suffix}")
        return Path(archive.extract(names[0], destination))


def check_manifest(wheel: Wheel, target: Target) -> CheckResult:
    info = wheel.manifest
    with zipfile.ZipFile(wheel.path) as archive:
        metadata_name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(metadata_name).decode()
    version = re.search(r"^Version: (\S+)$", metadata, re.M)
    file_version = wheel.name.split("-")[1]
    expected = {"target": target.name, "variant": target.variant, "backend": target.backend,
                "archs": list(target.archs), "torch_floor": target.torch_floor}
    wrong = {k: info.get(k) for k, v in expected.items() if info.get(k) != v}
    problems = [f"manifest {k}={v!r}, target says {expected[k]!r}" for k, v in wrong.items()]
    if not info.get("index_url"):
        problems.append("manifest has no index_url (a refusal at import could not say where to install from)")
    label = "" if target.pypi else f"+{target.variant}"
    labelled_right = "+" not in file_version if target.pypi else file_version.endswith(label)
    if not version or version.group(1) != file_version or not labelled_right:
        problems.append(f"version label: file {file_version}, METADATA {version and version.group(1)}, "
                        f"expected {label or 'no local label (the PyPI target)'} in both")
    return CheckResult("manifest", not problems, "; ".join(problems) or f"{file_version}, {info['image_digest'][:19]}")


def check_size(wheel: Wheel, target: Target) -> CheckResult:
    size_mib = wheel.size / 2**20
    return CheckResult("size", size_mib <= target.size_budget_mib,
                       f"{size_mib:.2f} MiB (budget {target.size_budget_mib} MiB)")


def check_coverage(so: Path, target: Target, builder_image: str, log: Path, env: Mapping[str, str]) -> CheckResult:
    backend = backends.get(target.backend)
    expected, found = backend.expected_device_code(target.archs), backend.device_code(so, builder_image, log, env)
    if found == expected:
        return CheckResult("coverage", True, ", ".join(sorted(found)) or "no device code (cpu)")
    return CheckResult("coverage", False, f"device code {sorted(found)} but the target asks for {sorted(expected)}")


def stable_surface(torch_sdk: Path) -> set[str]:
    """Every C function named by torch's stable-ABI headers."""
    names: set[str] = set()
    for directory in STABLE_HEADER_DIRS:
        for header in (torch_sdk / "include" / directory).glob("*.h"):
            names.update(STABLE_NAME.findall(header.read_text(errors="replace")))
    return names


def exported(libraries: list[Path], log: Path, env: Mapping[str, str]) -> set[str]:
    names: set[str] = set()
    for library in libraries:
        out = run(["nm", "-D", "--defined-only", str(library)], log=log, env=env)
        names.update(line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip())
    return names


def check_symbols(so: Path, target: Target, torch_sdk: Path, log: Path, env: Mapping[str, str]) -> CheckResult:
    """Every undefined symbol is a versioned system symbol, a GPU-runtime symbol, or part of torch's
    stable C ABI; anything else (a mangled c10/at symbol) is an `undefined symbol` waiting for a user."""
    out = run(["nm", "-D", "--undefined-only", str(so)], log=log, env=env)
    surface = stable_surface(torch_sdk)
    cpu_exports = exported(sorted((torch_sdk / "lib").glob("lib*.so")), log, env)
    runtime_prefixes = backends.get(target.backend).runtime_prefixes
    unstable, stable, unchecked = [], 0, []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2 or parts[0] in ("w", "v"):
            continue
        symbol = parts[-1]
        if any(v in symbol for v in SYSTEM_VERSIONS) or STD_LIBRARY.match(symbol):
            continue
        if runtime_prefixes and symbol.startswith(runtime_prefixes):
            continue
        if symbol in surface:
            stable += 1
            if symbol not in cpu_exports:
                unchecked.append(symbol)  # GPU-only shim: declared stable, lives in torch's GPU library
            continue
        unstable.append(symbol)
    if unstable:
        return CheckResult("symbols", False, f"{len(unstable)} symbols outside the stable ABI: {unstable[:5]}")
    note = f"; declared stable but only in GPU torch builds: {unchecked}" if unchecked else ""
    return CheckResult("symbols", True, f"{stable} stable-ABI symbols, all declared in torch's C shim{note}")


PROBE = Path(__file__).with_name("probes") / "stable_abi_call.py"


def check_loads(so: Path, target: Target, builder_image: str, python_tag: str, log: Path,
                env: Mapping[str, str]) -> CheckResult:
    """In the builder image, with no Python torch: dlopen the extension against the torch SDK and
    the GPU runtime there, and call its CPU kernel through the stable dispatcher."""
    python = f"/opt/python/{python_tag}-{python_tag}/bin/python"
    libraries = "/opt/torch-sdk/torch/lib:/usr/local/cuda/lib:/usr/local/cuda/lib64:/opt/rocm/lib"
    out = run(["docker", "run", "--rm", "--pull=never", "-v", f"{so.parent}:/w:ro", "-v", f"{PROBE}:/probe.py:ro",
               "-e", f"LD_LIBRARY_PATH={libraries}", builder_image, python, "/probe.py", f"/w/{so.name}",
               backends.get(target.backend).load_binding],
              log=log, env=env, hint="the extension does not load or its op does not run; see the log")
    result = json.loads(out.strip().splitlines()[-1])
    return CheckResult("loads", bool(result.get("matches_rule")),
                       "loads with no Python torch, registers polykernels::fake_int4_quant, CPU kernel correct"
                       if result.get("matches_rule") else f"probe said {result}")


def torch_sdk_from(wheelhouse: Path, destination: Path) -> Path:
    """Unpacks headers and libraries of the build torch (the same SDK the builder images use)."""
    marker = destination / "torch" / "include"
    if not marker.exists():
        wheel = next(iter(sorted(wheelhouse.glob("torch-*.whl"))), None)
        if wheel is None:
            raise CheckError(f"no torch wheel in {wheelhouse}", hint="run `nox -s images` first")
        with zipfile.ZipFile(wheel) as archive:
            for name in archive.namelist():
                if name.startswith(("torch/include/", "torch/lib/libtorch.so", "torch/lib/libtorch_cpu.so",
                                    "torch/lib/libc10.so")):
                    archive.extract(name, destination)
    return destination / "torch"


def run_checks(wheel: Wheel, target: Target, builder_image: str, python_tag: str, wheelhouse: Path, work: Path,
               log: Path, env: Mapping[str, str]) -> list[CheckResult]:
    work.mkdir(parents=True, exist_ok=True)
    so = extract(wheel.path, "_C.abi3.so", work / "unpacked")
    sdk = torch_sdk_from(wheelhouse, work / "torch-sdk")
    return [
        check_manifest(wheel, target),
        check_size(wheel, target),
        check_coverage(so, target, builder_image, log, env),
        check_symbols(so, target, sdk, log, env),
        check_loads(so, target, builder_image, python_tag, log, env),
    ]
