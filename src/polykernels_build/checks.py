"""Checks every built wheel must pass before it can be gated: manifest, size, device-code
coverage, the label (what the extension links and carries is what its variant label says),
undefined symbols limited to torch's stable C ABI, Python's limited API and the GPU runtime, the
symbol-version proof against the GPU runtime it was linked with, and a load test against that runtime."""

from __future__ import annotations

import json
import re
import shlex
import sys
import sysconfig
import zipfile
from collections.abc import Callable, Mapping
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
# The interpreter's C API. The extension's module half (csrc/launch/python_module.cpp) is compiled
# against Python's limited API of this version (abi3: one wheel for every Python from it on).
PYTHON_SYMBOL = re.compile(r"^_?Py[A-Z_]")
PYTHON_LIMITED_API = 0x030A0000
IDENTIFIER = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")


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
    if info.get("profile") == "offline" and not info.get("debian_packages"):
        problems.append("manifest records no Debian package versions (an offline build records its builder's)")
    if not info.get("index_url"):
        problems.append("manifest has no index_url (a refusal at import could not say where to install from)")
    label = "" if target.pypi else f"+{target.variant}"
    labelled_right = "+" not in file_version if target.pypi else file_version.endswith(label)
    if not version or version.group(1) != file_version or not labelled_right:
        problems.append(f"version label: file {file_version}, METADATA {version and version.group(1)}, "
                        f"expected {label or 'no local label (the PyPI target)'} in both")
    return CheckResult("manifest", not problems, "; ".join(problems) or f"{file_version}, {info['image_digest'][:19]}")


# What the symbol versions allow: "constrains the platform tag to ..." when external libraries
# (libtorch, the GPU runtime) keep the wheel from being consistent with a policy as a whole,
# "consistent with the following platform tag: ..." when nothing does.
AUDITWHEEL_CONSTRAINT = re.compile(r'(?:constrains the platform tag to|consistent with the following platform tag:) '
                                   r'"manylinux_(\d+)_(\d+)_x86_64"')


def check_floor(wheel: Wheel, log: Path, env: Mapping[str, str]) -> CheckResult:
    """`auditwheel show`: the glibc/libstdc++ symbol versions the extension needs allow the floor
    its manifest promises (manylinux_2_28, torch's own), and the file carries that tag. (auditwheel
    also reports "linux_x86_64" consistency: libtorch and the GPU runtime are left to torch's
    wheels on purpose, which auditwheel cannot know.)"""
    promised = str(wheel.manifest.get("manylinux") or "")
    match = re.match(r"^manylinux_(\d+)_(\d+)_x86_64$", promised)
    if not match:
        return CheckResult("floor", False, f"manifest manylinux {promised or 'missing'!r}")
    out = run([sys.executable, "-m", "auditwheel", "show", str(wheel.path)], log=log, env=env)
    needs = AUDITWHEEL_CONSTRAINT.search(" ".join(out.split()))
    if needs is None:
        return CheckResult("floor", False, "auditwheel show gave no manylinux constraint (a symbol past every "
                                           "manylinux policy?); see the log")
    need, floor = (int(needs.group(1)), int(needs.group(2))), (int(match.group(1)), int(match.group(2)))
    tagged = f"-{promised}.whl" in wheel.name or f".{promised}." in wheel.name
    problems = []
    if need > floor:
        problems.append(f"symbols need manylinux_{need[0]}_{need[1]}, past the promised {promised}")
    if not tagged:
        problems.append(f"{wheel.name} is not tagged {promised}")
    reason = wheel.manifest.get("floor_reason")
    return CheckResult("floor", not problems, "; ".join(problems) or
                       f"{promised} (symbols allow manylinux_{need[0]}_{need[1]})" + (f": {reason}" if reason else ""))


def check_size(wheel: Wheel, target: Target) -> CheckResult:
    size_mib = wheel.size / 2**20
    return CheckResult("size", size_mib <= target.size_budget_mib,
                       f"{size_mib:.2f} MiB (budget {target.size_budget_mib} MiB)")


def check_coverage(found: set[str], target: Target) -> CheckResult:
    expected = backends.get(target.backend).expected_device_code(target.archs)
    if found == expected:
        return CheckResult("coverage", True, ", ".join(sorted(found)) or "no device code (cpu)")
    return CheckResult("coverage", False, f"device code {sorted(found)} but the target asks for {sorted(expected)}")


RUNTIME_SONAME = re.compile(r"^(libamdhip64\.so|libcudart\.so)\.(\d+)$")


def needed(so: Path, log: Path, env: Mapping[str, str]) -> list[str]:
    """The DT_NEEDED entries of an ELF shared object, in order (readelf -d)."""
    out = run(["readelf", "-d", "-W", str(so)], log=log, env=env)
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def soname(so: Path, log: Path, env: Mapping[str, str]) -> str | None:
    out = run(["readelf", "-d", "-W", str(so)], log=log, env=env)
    match = re.search(r"\(SONAME\)\s+Library soname: \[([^\]]+)\]", out)
    return match.group(1) if match else None


def gpu_runtimes(names: list[str]) -> list[str]:
    """The GPU runtime sonames (libamdhip64.so.N, libcudart.so.N) among DT_NEEDED entries."""
    return [n for n in names if RUNTIME_SONAME.match(n)]


def check_label(so: Path, found_device_code: set[str], manifest: Mapping[str, object], target: Target, log: Path,
                env: Mapping[str, str]) -> CheckResult:
    """A label can never lie: the GPU runtime the extension needs (DT_NEEDED) is the one the
    target's toolkit links, the manifest records that soname and a runtime version of that
    toolkit, and the variant label derived from what was linked and the device code found is
    the target's label. A wheel labelled rocm7.2 that needs libamdhip64.so.6 fails here."""
    backend = backends.get(target.backend)
    linked = gpu_runtimes(needed(so, log, env))
    want = backend.runtime_soname(target.toolkit)
    problems = []
    if linked != ([want] if want else []):
        problems.append(f"DT_NEEDED GPU runtime {linked or 'none'}, but toolkit {target.toolkit} "
                        f"({target.backend}) links {want or 'none'}")
    runtime = manifest.get("runtime") or {}
    if not isinstance(runtime, Mapping):
        runtime = {}
    if want:
        version = str(runtime.get("version") or "")
        if runtime.get("soname") != (linked[0] if linked else None):
            problems.append(f"manifest runtime soname {runtime.get('soname')!r}, DT_NEEDED says "
                            f"{linked[0] if linked else None!r}")
        if not (version == target.toolkit or version.startswith(f"{target.toolkit}.")):
            problems.append(f"manifest runtime version {version or 'missing'!r} is not toolkit {target.toolkit}")
    elif runtime:
        problems.append(f"a {target.backend} wheel records a GPU runtime {dict(runtime)}")
    # The label as the binary tells it: the runtime's major.minor and the device code's archs.
    if linked and want:
        major = RUNTIME_SONAME.match(linked[0]).group(2)  # type: ignore[union-attr]
        version = str(runtime.get("version") or "")
        minor = version.split(".")[1] if version.startswith(f"{major}.") and "." in version else "?"
        toolkit_seen = f"{major}.{minor}"
    else:
        toolkit_seen = target.toolkit
    archs_seen = tuple(sorted(found_device_code)) if target.backend == "rocm" else target.archs
    told = backend.variant_label(toolkit_seen, archs_seen) if archs_seen or target.backend != "rocm" else "?"
    if told != target.variant:
        problems.append(f"the binary says variant {told!r} (runtime {linked or 'none'}, device code "
                        f"{sorted(found_device_code) or 'none'}), the target's label is {target.variant!r}")
    if manifest.get("variant") != target.variant:
        problems.append(f"manifest variant {manifest.get('variant')!r}, target label {target.variant!r}")
    detail = (f"+{target.variant}: DT_NEEDED {', '.join(linked) or 'no GPU runtime'}"
              + (f" (runtime {runtime.get('version')})" if want else ""))
    return CheckResult("label", not problems, "; ".join(problems) or detail)


def _versioned(out: str) -> set[tuple[str, str]]:
    """(name, version) pairs from `nm -D` lines (``U hipMalloc@hip_4.2``, ``T hipMalloc@@hip_4.2``)."""
    pairs = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, _, version = parts[-1].partition("@")
        pairs.add((name, version.lstrip("@")))
    return pairs


def check_runtime_symbols(so: Path, runtime_library: Path | None, target: Target, log: Path,
                          env: Mapping[str, str]) -> CheckResult:
    """Symbol-version proof: every GPU-runtime symbol the extension imports is defined, with the
    same symbol version, by the runtime library it was linked against (whose SONAME is the
    extension's DT_NEEDED entry). A runtime that lacks a symbol is caught here, not on an MI355X."""
    backend = backends.get(target.backend)
    imported = {(n, v) for n, v in _versioned(run(["nm", "-D", "--undefined-only", str(so)], log=log, env=env))
                if backend.runtime_prefixes and n.startswith(backend.runtime_prefixes)}
    if backend.runtime_stem is None:
        if imported:
            return CheckResult("runtime-symbols", False, f"a cpu extension imports GPU runtime symbols "
                                                         f"{sorted(imported)[:5]}")
        return CheckResult("runtime-symbols", True, "no GPU runtime (cpu)")
    if runtime_library is None:
        return CheckResult("runtime-symbols", False, f"no {backend.runtime_stem}.* in the builder image")
    linked = gpu_runtimes(needed(so, log, env))
    library_soname = soname(runtime_library, log, env)
    problems = []
    if linked != [library_soname]:
        problems.append(f"DT_NEEDED {linked} is not the runtime library's SONAME {library_soname!r}")
    defined = _versioned(run(["nm", "-D", "--defined-only", str(runtime_library)], log=log, env=env))
    names = {n for n, _ in defined}
    missing = sorted(f"{n}@{v}" if v else n for n, v in imported
                     if ((n, v) not in defined if v else n not in names))
    if missing:
        problems.append(f"{len(missing)} imported symbols not defined with that version by {library_soname}: "
                        f"{missing[:6]}")
    if not imported:
        problems.append(f"imports no {target.backend} runtime symbol at all: nothing proves the link")
    versions = sorted({v or "unversioned" for _, v in imported})
    return CheckResult("runtime-symbols", not problems, "; ".join(problems) or
                       f"{len(imported)} runtime symbols ({', '.join(versions)}) all defined by {library_soname}")


def runtime_library(target: Target, builder_image: str, destination: Path, log: Path,
                    env: Mapping[str, str]) -> Path | None:
    """Copies the GPU runtime the target's toolkit links out of the builder image (the library the
    extension was linked against), for the symbol-version proof to read on this host."""
    backend = backends.get(target.backend)
    wanted = backend.runtime_soname(target.toolkit)
    if wanted is None:
        return None
    destination.mkdir(parents=True, exist_ok=True)
    (destination / wanted).unlink(missing_ok=True)
    search = " ".join(f"{d}/{wanted}" for d in backend.runtime_dirs)
    script = f"for f in {search}; do if [ -e \"$f\" ]; then cp -L \"$f\" /out/ && exit 0; fi; done; exit 0"
    run(["docker", "run", "--rm", "--pull=never", "-v", f"{destination}:/out", builder_image, "sh", "-c", script],
        log=log, env=env)
    found = destination / wanted
    return found if found.exists() else None


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


def python_limited_api(log: Path, env: Mapping[str, str], builder_image: str | None = None,
                       python_tag: str | None = None) -> frozenset[str]:
    """Every identifier Python.h declares under ``Py_LIMITED_API`` (PYTHON_LIMITED_API): a symbol outside
    it is not in the stable ABI the abi3 tag promises. Read from the builder image's Python headers
    (its compiler preprocesses them), or, with no image, from this Python's with the host's ``cc``."""
    preprocess = ["cc", "-E", "-P", f"-DPy_LIMITED_API={PYTHON_LIMITED_API:#x}", "-x", "c", "-"]
    if builder_image is not None:
        python = f"/opt/python/{python_tag}-{python_tag}/bin/python"
        script = (f"include=$({python} -c 'import sysconfig; print(sysconfig.get_paths()[\"include\"])') && "
                  f"{shlex.join(preprocess)} -I\"$include\"")
        argv = ["docker", "run", "--rm", "-i", "--pull=never", builder_image, "sh", "-c", script]
    else:
        include = Path(sysconfig.get_paths()["include"])
        if not (include / "Python.h").is_file():
            raise CheckError(f"Python.h is not in {include}: the symbol check reads Python's limited API from it",
                             hint="install the Python headers (Debian: apt-get install python3-dev)")
        argv = [*preprocess, f"-I{include}"]
    out = run(argv, log=log, env=env, input_bytes=b"#include <Python.h>\n", stderr_to_log=True,
              hint="the Python headers could not be preprocessed; see the log")
    return frozenset(IDENTIFIER.findall(out))


def check_symbols(so: Path, target: Target, torch_sdk: Path, log: Path, env: Mapping[str, str],
                  limited_api: Callable[[], frozenset[str]] | None = None) -> CheckResult:
    """Every undefined symbol is a versioned system symbol, a GPU-runtime symbol, part of torch's
    stable C ABI or of Python's limited API; anything else (a mangled c10/at symbol, a CPython
    internal) is an `undefined symbol` waiting for a user. ``limited_api``: reads Python's limited API
    (``python_limited_api``; the default reads this Python's headers)."""
    out = run(["nm", "-D", "--undefined-only", str(so)], log=log, env=env)
    surface = stable_surface(torch_sdk)
    cpu_exports = exported(sorted((torch_sdk / "lib").glob("lib*.so")), log, env)
    runtime_prefixes = backends.get(target.backend).runtime_prefixes
    unstable, stable, unchecked, python = [], 0, [], []
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
        if PYTHON_SYMBOL.match(symbol):
            python.append(symbol)
            continue
        unstable.append(symbol)
    if python:
        limited = limited_api() if limited_api is not None else python_limited_api(log, env)
        unstable += [symbol for symbol in python if symbol not in limited]
    if unstable:
        return CheckResult("symbols", False, f"{len(unstable)} symbols outside the stable ABI: {unstable[:5]}")
    note = f"; declared stable but only in GPU torch builds: {unchecked}" if unchecked else ""
    return CheckResult("symbols", True, f"{stable} stable-ABI symbols, all declared in torch's C shim, and "
                                        f"{len(python)} of Python's limited API{note}")


PROBE = Path(__file__).with_name("probes") / "stable_abi_call.py"


def check_loads(so: Path, target: Target, builder_image: str, python_tag: str, log: Path,
                env: Mapping[str, str]) -> CheckResult:
    """In the builder image, with no Python torch: dlopen the extension against the torch SDK and
    the GPU runtime there, call its CPU kernel through the stable dispatcher (once with a bad group size,
    whose error must reach torch rather than kill the process), and import it as a Python module (the
    builder's Python): a GPU build's module launches GPU kernels, a CPU build's not."""
    python = f"/opt/python/{python_tag}-{python_tag}/bin/python"
    libraries = "/opt/torch-sdk/torch/lib:/usr/local/cuda/lib:/usr/local/cuda/lib64:/opt/rocm/lib"
    out = run(["docker", "run", "--rm", "--pull=never", "-v", f"{so.parent}:/w:ro", "-v", f"{PROBE}:/probe.py:ro",
               "-e", f"LD_LIBRARY_PATH={libraries}", builder_image, python, "/probe.py", f"/w/{so.name}",
               backends.get(target.backend).load_binding],
              log=log, env=env, hint="the extension does not load or its op does not run; see the log")
    result = json.loads(out.strip().splitlines()[-1])
    want = backends.get(target.backend).runtime_soname(target.toolkit)
    loaded = sorted({Path(p).name for p in result.get("gpu_runtimes", [])})
    runtime_ok = (want is None and not loaded) or (want is not None and any(n.startswith(want) for n in loaded))
    module_ok = result.get("gpu_launch") is (target.backend != "cpu")
    ok = bool(result.get("matches_rule")) and result.get("refuses_bad_input") is True and runtime_ok and module_ok
    detail = ("loads with no Python torch" + (f" against {', '.join(loaded)}" if loaded else "")
              + ", registers polykernels::fake_int4_quant, CPU kernel correct, a bad group size comes back as"
              " an error, imports as a module"
              + (" with its GPU launch" if target.backend != "cpu" else ""))
    return CheckResult("loads", ok, detail if ok else f"probe said {result}; expected runtime {want or 'none'}")


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
    found = backends.get(target.backend).device_code(so, builder_image, log, env)
    runtime = runtime_library(target, builder_image, work / "runtime", log, env)
    return [
        check_manifest(wheel, target),
        check_size(wheel, target),
        check_floor(wheel, log, env),
        check_coverage(found, target),
        check_label(so, found, wheel.manifest, target, log, env),
        check_symbols(so, target, sdk, log, env, lambda: python_limited_api(log, env, builder_image, python_tag)),
        check_runtime_symbols(so, runtime, target, log, env),
        check_loads(so, target, builder_image, python_tag, log, env),
    ]
