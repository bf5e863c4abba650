"""Build of polykernels' one C++ extension, `polykernels/_C.abi3.so`, for CPU, CUDA or ROCm.

Everything the build needs is resolved once into `ExtensionBuild`. When the factory builds, it
comes from one place: ``POLYKERNELS_BUILD_INFO``, the manifest the factory writes from the
target in targets.toml (backend, archs, ``torch_floor`` = the ``TORCH_TARGET_VERSION`` compiled
in). The variables below, and the defaults, serve a plain ``pip install .`` only:

- ``POLYKERNELS_BACKEND``: ``cpu``, ``cuda`` or ``rocm``. Unset: the backend of the torch the
  extension is built against (``torch.version.hip`` -> rocm, ``torch.version.cuda`` -> cuda, else
  cpu), never merely the compiler found on PATH: a CUDA extension built next to a CPU torch needs a
  libcudart the environment does not have and cannot load. (Under build isolation the build's
  torch is the one pip puts in the build environment: ``pip install --no-build-isolation .``
  builds against the torch you run.)
- ``TORCH_CUDA_ARCH_LIST`` (default ``8.0;9.0;10.0;12.0+PTX``), ``PYTORCH_ROCM_ARCH``
  (default ``gfx942;gfx950``).
- ``POLYKERNELS_TORCH_SDK``: a torch package directory (``.../torch``) to compile and link
  against instead of the build Python's torch (builder images unpack one from a torch wheel,
  whatever its Python tag).
- ``POLYKERNELS_COMPILER_LAUNCHER``: a command put before every compile (``ccache``).
- ``POLYKERNELS_BUILD_INFO``: JSON written by the factory (target, backend, archs, torch floor,
  variant, git sha, image digest); its ``variant`` becomes the local version label (``0.1.0+cu130``).

The extension uses only PyTorch's stable ABI (``TORCH_TARGET_VERSION``): torch is needed for
its headers and the sonames of libtorch, libtorch_cpu and libc10, never for its GPU build.
This file never probes a GPU, downloads anything or runs git.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sysconfig
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).parent.resolve()
CSRC = ROOT / "csrc"
DEFAULT_CUDA_ARCHS = "8.0;9.0;10.0;12.0+PTX"
DEFAULT_ROCM_ARCHS = "gfx942;gfx950"
KNOWN_ROCM_ARCHS = frozenset({"gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1101", "gfx1200", "gfx1201"})
CUDA_ARCH_PATTERN = re.compile(r"^(\d+)\.(\d+)(a|f)?(\+PTX)?$")
# The stable-ABI version a plain `pip install .` promises (u64: major, minor, patch, 5 zero bytes).
# Factory builds take it from the target's torch_floor instead. HIP needs 2.13: before it the
# stream accessor is CUDA-named and lives in libtorch_hip only.
DEFAULT_TORCH_TARGET = {"cpu": (2, 11), "cuda": (2, 11), "rocm": (2, 13)}
# compat/glibc_2_28.cpp keeps the host code at torch's manylinux_2_28 floor (see the file).
CPU_SOURCES = ["csrc/int4_qat/fake_int4_quant_cpu.cpp", "csrc/launch/program_schema.cpp", "csrc/compat/glibc_2_28.cpp",
               "csrc/launch/python_module.cpp"]
GPU_SOURCES = ["csrc/int4_qat/fake_int4_quant_gpu.cu", "csrc/launch/program.cu", "csrc/launch/direct_launch.cu"]
# Sources that include Python.h (the limited API: the module works with every Python >= 3.10).
PYTHON_SOURCES = frozenset({"csrc/launch/python_module.cpp"})


class BuildConfigError(RuntimeError):
    """A setting the build cannot use; the message names the variable to set."""


@dataclass(frozen=True, kw_only=True)
class ExtensionBuild:
    backend: str
    archs: tuple[str, ...]
    compiler: str | None
    torch_target: tuple[int, int]
    build_info: Mapping[str, object] = field(default_factory=dict)

    @property
    def target_version_macro(self) -> str:
        major, minor = self.torch_target
        return f"-DTORCH_TARGET_VERSION=0x{major:02x}{minor:02x}000000000000"


def _find_nvcc(env: Mapping[str, str]) -> str | None:
    cuda_home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if cuda_home and (Path(cuda_home) / "bin" / "nvcc").exists():
        return str(Path(cuda_home) / "bin" / "nvcc")
    return shutil.which("nvcc", path=env.get("PATH"))


def _find_hipcc(env: Mapping[str, str]) -> str | None:
    if env.get("HIPCC"):
        return env["HIPCC"]
    rocm = env.get("ROCM_PATH") or env.get("ROCM_HOME")
    if rocm and (Path(rocm) / "bin" / "hipcc").exists():
        return str(Path(rocm) / "bin" / "hipcc")
    return shutil.which("hipcc", path=env.get("PATH"))


def torch_backend() -> str:
    """The backend of the torch this build compiles against: its own build says, not the host."""
    try:
        import torch
    except ImportError:
        return "cpu"
    if getattr(torch.version, "hip", None):
        return "rocm"
    if getattr(torch.version, "cuda", None):
        return "cuda"
    return "cpu"


def torch_paths(env: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(include dirs, library dirs) of the torch the extension is built against."""
    sdk = env.get("POLYKERNELS_TORCH_SDK")
    if sdk:
        root = Path(sdk)
        if not (root / "include" / "torch" / "csrc" / "stable").is_dir():
            raise BuildConfigError(f"POLYKERNELS_TORCH_SDK={sdk} holds no torch/csrc/stable headers")
        return [str(root / "include"), str(root / "include" / "torch" / "csrc" / "api" / "include")], [
            str(root / "lib")]
    try:
        import torch.utils.cpp_extension as cpp
    except ImportError:
        raise BuildConfigError("torch is not importable: install torch>=2.11 or set POLYKERNELS_TORCH_SDK") from None
    return cpp.include_paths(), cpp.library_paths()


def python_include() -> str:
    """The building Python's header directory (Python.h); the module half of the extension needs it."""
    include = Path(sysconfig.get_paths()["include"])
    if not (include / "Python.h").is_file():
        raise BuildConfigError(f"Python.h is not in {include}: install the Python headers (Debian: python3-dev)")
    return str(include)


def parse_cuda_archs(spec: str) -> tuple[str, ...]:
    archs = tuple(a.strip() for a in spec.replace(",", ";").replace(" ", ";").split(";") if a.strip())
    for arch in archs:
        if not CUDA_ARCH_PATTERN.match(arch):
            raise BuildConfigError(
                f"TORCH_CUDA_ARCH_LIST: {arch!r} is not a CUDA arch; expected entries like 8.0, 9.0a or 12.0+PTX"
            )
    if not archs:
        raise BuildConfigError("TORCH_CUDA_ARCH_LIST is empty; set it to e.g. '9.0' or unset it")
    return archs


def parse_rocm_archs(spec: str) -> tuple[str, ...]:
    archs = tuple(a.strip() for a in spec.replace(",", ";").split(";") if a.strip())
    for arch in archs:
        if arch not in KNOWN_ROCM_ARCHS:
            raise BuildConfigError(
                f"PYTORCH_ROCM_ARCH: unknown arch {arch!r}; expected some of {sorted(KNOWN_ROCM_ARCHS)}"
            )
    if not archs:
        raise BuildConfigError("PYTORCH_ROCM_ARCH is empty; set it to e.g. 'gfx942' or unset it")
    return archs


# backend -> (compiler finder, arch parser, arch variable, default archs, what to set when no compiler is found)
_GPU_TOOLCHAINS = {
    "cuda": (_find_nvcc, parse_cuda_archs, "TORCH_CUDA_ARCH_LIST", DEFAULT_CUDA_ARCHS,
             "nvcc was not found: set CUDA_HOME or put nvcc on PATH"),
    "rocm": (_find_hipcc, parse_rocm_archs, "PYTORCH_ROCM_ARCH", DEFAULT_ROCM_ARCHS,
             "hipcc was not found: set HIPCC or ROCM_PATH"),
}


def parse_floor(floor: object) -> tuple[int, int]:
    match = re.match(r"^(\d+)\.(\d+)$", str(floor))
    if not match:
        raise BuildConfigError(f"POLYKERNELS_BUILD_INFO: torch_floor {floor!r} must be MAJOR.MINOR")
    return int(match.group(1)), int(match.group(2))


def resolve_build(env: Mapping[str, str], detect: Callable[[], str] = torch_backend) -> ExtensionBuild:
    build_info = json.loads(env.get("POLYKERNELS_BUILD_INFO") or "{}")
    from_factory = "backend" in build_info
    backend = str(build_info["backend"] if from_factory else env.get("POLYKERNELS_BACKEND", "")).strip().lower()
    detected = not backend
    if detected:
        backend = detect()
    if backend not in DEFAULT_TORCH_TARGET:
        raise BuildConfigError(f"POLYKERNELS_BACKEND: unknown backend {backend!r}; expected cpu, cuda or rocm")
    torch_target = parse_floor(build_info["torch_floor"]) if from_factory else DEFAULT_TORCH_TARGET[backend]
    factory_archs = ";".join(build_info.get("archs") or []) if from_factory else None
    if backend == "cpu":
        return ExtensionBuild(backend="cpu", archs=(), compiler=None, torch_target=torch_target,
                              build_info=build_info)
    find, parse, variable, default, where = _GPU_TOOLCHAINS[backend]
    compiler = find(env)
    if compiler is None:
        if detected:
            raise BuildConfigError(f"the build's torch is a {backend} build but {where}; or set "
                                   "POLYKERNELS_BACKEND=cpu for a CPU-only extension")
        raise BuildConfigError(f"POLYKERNELS_BACKEND={backend} but {where}")
    archs = parse(factory_archs or env.get(variable) or default)
    return ExtensionBuild(backend=backend, archs=archs, compiler=compiler, torch_target=torch_target,
                          build_info=build_info)


def nvcc_arch_flags(archs: tuple[str, ...]) -> list[str]:
    flags = []
    for arch in archs:
        major, minor, suffix, ptx = CUDA_ARCH_PATTERN.match(arch).groups()  # type: ignore[union-attr]
        number = f"{major}{minor}{suffix or ''}"
        flags += ["-gencode", f"arch=compute_{number},code=sm_{number}"]
        if ptx:
            flags += ["-gencode", f"arch=compute_{number},code=compute_{number}"]
    return flags


def nvcc_library_dirs(nvcc: str) -> list[str]:
    """Where this nvcc's own libcudart lives, as nvcc reports it (wrappers and pip layouts included)."""
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe.cu"
        probe.write_text("")
        out = subprocess.run([nvcc, "--dryrun", "-c", str(probe), "-o", str(Path(tmp) / "probe.o")],
                             capture_output=True, text=True, check=False)
    text = out.stdout + out.stderr
    dirs = re.findall(r'"-L([^"]+)"', next((line for line in text.splitlines() if "LIBRARIES=" in line), ""))
    # pip's CUDA wheels keep libcudart in <root>/lib where nvcc's default says lib64.
    root = Path(nvcc).resolve().parent.parent
    dirs += [str(root / "lib"), str(root / "lib64")]
    return [d for d in dict.fromkeys(dirs) if Path(d).is_dir() and not d.rstrip("/").endswith("stubs")]


def _run(argv: list[str]) -> None:
    print(" ".join(argv), flush=True)
    subprocess.run(argv, check=True)


def _toolkit_version(build: ExtensionBuild) -> str | None:
    if build.compiler is None:
        return None
    out = subprocess.run([build.compiler, "--version"], capture_output=True, text=True, check=False).stdout
    # nvcc: "release 13.0, V13.0.88"; hipcc: "HIP version: 7.2.53211-<hash>" (kept whole: its
    # major.minor is the runtime's, the rest says which build).
    match = re.search(r"release (\d+\.\d+)", out) or re.search(r"HIP version: (\S+)", out)
    return match.group(1) if match else out.strip().splitlines()[-1] if out.strip() else None


GPU_RUNTIME_SONAME = re.compile(r"^(libamdhip64|libcudart)\.so\.\d+$")


def elf_needed(path: Path) -> list[str]:
    """DT_NEEDED entries of a 64-bit little-endian ELF file, read without binutils."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise BuildConfigError(f"{path} is not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = []
    for section in sections:
        if section[1] != 6:  # SHT_DYNAMIC
            continue
        strings = sections[section[6]][4]  # sh_link -> the dynamic string table's offset
        for offset in range(section[4], section[4] + section[5], 16):
            tag, value = struct.unpack_from("<qQ", data, offset)
            if tag == 0:
                break
            if tag == 1:  # DT_NEEDED
                names.append(data[strings + value: data.index(b"\0", strings + value)].decode())
    return names


def gpu_runtime(output: Path, build: ExtensionBuild) -> dict[str, str | None] | None:
    """The GPU runtime the linked extension needs (its DT_NEEDED soname) and the toolkit's runtime
    version: what the import-time check compares with torch.version.hip / torch.version.cuda."""
    sonames = [n for n in elf_needed(output) if GPU_RUNTIME_SONAME.match(n)]
    if build.backend == "cpu" or not sonames:
        return None
    return {"soname": sonames[0], "version": _toolkit_version(build)}


class BuildStableExtension(build_ext):
    """Compiles each source with the compiler of its kind; nvcc flags never reach hipcc."""

    def run(self) -> None:
        super().run()
        if self.inplace:
            # In-place (development) builds: the manifest goes beside the copied extension.
            built = Path(self.build_lib) / "polykernels" / "_build_info.json"
            if built.exists():
                shutil.copy2(built, ROOT / "src" / "polykernels" / "_build_info.json")

    def build_extension(self, ext: Extension) -> None:
        build: ExtensionBuild = resolve_build(os.environ)
        torch_includes, torch_libraries = torch_paths(os.environ)
        launcher = os.environ.get("POLYKERNELS_COMPILER_LAUNCHER", "").split()
        include_dirs = [str(CSRC / "include"), str(CSRC), *torch_includes]
        includes = [f"-I{d}" for d in include_dirs]
        common = ["-O3", "-std=c++20", build.target_version_macro]
        temp = Path(self.build_temp) / build.backend
        temp.mkdir(parents=True, exist_ok=True)
        objects = []
        sources = CPU_SOURCES + (GPU_SOURCES if build.backend != "cpu" else [])
        for source in sources:
            obj = temp / (Path(source).name + ".o")
            src = str(ROOT / source)
            if source.endswith(".cpp"):
                cxx = os.environ.get("CXX", "c++")
                python = [f"-I{python_include()}"] if source in PYTHON_SOURCES else []
                _run([*launcher, cxx, "-c", src, "-o", str(obj), *common, "-fPIC", "-Wall", *includes, *python])
            elif build.backend == "cuda":
                _run([*launcher, build.compiler, "-c", src, "-o", str(obj), *common, "-DUSE_CUDA",
                      "-Xcompiler", "-fPIC",
                      "--prec-div=true", "--ftz=false", *nvcc_arch_flags(build.archs), *includes])
            else:
                _run([*launcher, build.compiler, "-c", "-x", "hip", src, "-o", str(obj), *common, "-fPIC",
                      "-DUSE_ROCM=1",
                      "-D__HIP_PLATFORM_AMD__=1", "-fhip-fp32-correctly-rounded-divide-sqrt",
                      "-fno-gpu-rdc", *[f"--offload-arch={a}" for a in build.archs], *includes])
            objects.append(str(obj))
        output = Path(self.get_ext_fullpath(ext.name))
        output.parent.mkdir(parents=True, exist_ok=True)
        torch_lib = [f"-L{d}" for d in torch_libraries]
        # Record the torch sonames: torch loads its libraries RTLD_LOCAL, so the stable C
        # symbols resolve only through our own DT_NEEDED entries.
        torch_libs = ["-Wl,--no-as-needed", "-ltorch", "-ltorch_cpu", "-lc10", "-Wl,--as-needed"]
        if build.backend == "rocm":
            linker = [build.compiler, "-shared", "-fno-gpu-rdc", *[f"--offload-arch={a}" for a in build.archs]]
            runtime = ["-lamdhip64"]
        else:
            linker = [os.environ.get("CXX", "c++"), "-shared"]
            runtime = []
            if build.backend == "cuda":
                runtime = [*(f"-L{d}" for d in nvcc_library_dirs(build.compiler)), "-lcudart"]
        _run([*linker, *objects, "-o", str(output), *torch_lib, *torch_libs, *runtime])
        self._write_build_info(build, output.parent, gpu_runtime(output, build))

    def _write_build_info(self, build: ExtensionBuild, package_dir: Path,
                          runtime: dict[str, str | None] | None) -> None:
        major, minor = build.torch_target
        info = {
            "schema": 1,
            "target": "local",
            "variant": None,
            "backend": build.backend,
            "archs": list(build.archs),
            "toolkit": _toolkit_version(build),
            "torch_floor": f"{major}.{minor}",
            "runtime": runtime,
            "git_sha": None,
            "image_digest": None,
            "built_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            **build.build_info,
        }
        (package_dir / "_build_info.json").write_text(json.dumps(info, indent=2) + "\n")


def _version(env: Mapping[str, str]) -> str:
    text = (ROOT / "src" / "polykernels" / "_version.py").read_text()
    base = re.search(r'__version__ = "([^"]+)"', text).group(1)  # type: ignore[union-attr]
    info = json.loads(env.get("POLYKERNELS_BUILD_INFO") or "{}")
    variant = info.get("variant") if info.get("local_label", True) else None  # PyPI's target: no label
    return f"{base}+{variant}" if variant else base


if __name__ == "__main__":
    setup(
        version=_version(os.environ),
        ext_modules=[Extension("polykernels._C", sources=[], py_limited_api=True)],
        cmdclass={"build_ext": BuildStableExtension},
        options={"bdist_wheel": {"py_limited_api": "cp310"}},
    )
