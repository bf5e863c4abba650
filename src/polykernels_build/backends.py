"""What differs between CPU, CUDA and ROCm in the factory: one object per backend behind one Protocol.

Adding a backend is one class here and its entry in ``BACKENDS``; nothing else in the factory
branches on a backend name. Each object answers:

- which archs it accepts (targets.toml validation) and the Triton targets of those archs (compile matrix);
- the device code a wheel must contain and how to list what it does contain (coverage check);
- the runtime symbol prefixes the extension may leave undefined (symbol check) and the dlopen
  binding of the load test;
- the GPU runtime library a target's toolkit links (``runtime_soname``: ``libamdhip64.so.7``,
  ``libcudart.so.13``), where a builder image keeps it, and the variant label that names what a
  wheel links (``variant_label``): the label check and the symbol-version proof read these;
- the hardware class a suites report ran on, what this host has, and ``can_gate(hardware, host)``.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from polykernels_build.errors import CheckError, ConfigError
from polykernels_build.tools import run

CUDA_ARCH = re.compile(r"^\d+\.\d+[af]?(\+PTX)?$")
ROCM_ARCHS = ("gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1101", "gfx1200", "gfx1201")


@dataclass(frozen=True)
class Host:
    """The hardware classes present on a machine (``nvidia``, ``gfx942``, ...)."""

    hardware: frozenset[str] = frozenset()

    @classmethod
    def probe(cls, env: Mapping[str, str]) -> Host:
        """What this host can gate: each backend probes for its own hardware, once per release."""
        return cls(frozenset().union(*(b.probe_hardware(env) for b in BACKENDS.values())))

    @classmethod
    def that_ran(cls, hardware_class: str) -> Host:
        """The host a suites report ran on, as far as gating is concerned."""
        return cls(frozenset({hardware_class}))


class Backend(Protocol):
    name: str
    runtime_prefixes: tuple[str, ...]  # undefined symbols the GPU runtime provides
    load_binding: str  # dlopen mode of the load test: "lazy" where a GPU-only shim may be unresolved
    runtime_stem: str | None  # the GPU runtime's library name before its major: "libamdhip64.so"
    runtime_dirs: tuple[str, ...]  # where builder images keep that runtime (searched in order)

    def runtime_soname(self, toolkit: str) -> str | None: ...

    def variant_label(self, toolkit: str, archs: tuple[str, ...]) -> str: ...

    def arch_problem(self, archs: tuple[str, ...]) -> str | None: ...

    def triton_targets(self, archs: tuple[str, ...]) -> tuple[str, ...]: ...

    def expected_device_code(self, archs: tuple[str, ...]) -> set[str]: ...

    def device_code(self, so: Path, builder_image: str, log: Path, env: Mapping[str, str]) -> set[str]: ...

    def hardware_class(self, platform: Mapping[str, Any]) -> str: ...

    def probe_hardware(self, env: Mapping[str, str]) -> frozenset[str]: ...

    def can_gate(self, hardware: str, host: Host) -> bool: ...


def _output(argv: list[str], env: Mapping[str, str]) -> str:
    if shutil.which(argv[0], path=env.get("PATH")) is None:
        return ""
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60, env=dict(env))
    return proc.stdout if proc.returncode == 0 else ""


class Cpu:
    name = "cpu"
    runtime_prefixes: tuple[str, ...] = ()
    load_binding = "now"
    runtime_stem = None
    runtime_dirs: tuple[str, ...] = ()

    def runtime_soname(self, toolkit: str) -> str | None:
        return None

    def variant_label(self, toolkit: str, archs: tuple[str, ...]) -> str:
        return "cpu"

    def arch_problem(self, archs: tuple[str, ...]) -> str | None:
        return "a cpu target has no archs" if archs else None

    def triton_targets(self, archs: tuple[str, ...]) -> tuple[str, ...]:
        return ()

    def expected_device_code(self, archs: tuple[str, ...]) -> set[str]:
        return set()

    def device_code(self, so: Path, builder_image: str, log: Path, env: Mapping[str, str]) -> set[str]:
        return set()

    def hardware_class(self, platform: Mapping[str, Any]) -> str:
        return "cpu"

    def probe_hardware(self, env: Mapping[str, str]) -> frozenset[str]:
        return frozenset({"cpu"})

    def can_gate(self, hardware: str, host: Host) -> bool:
        return hardware == "any" or hardware in host.hardware


class Cuda:
    name = "cuda"
    runtime_prefixes = ("cuda", "__cuda")
    # The stable current-stream shim lives in libtorch_cuda, absent from the SDK: resolve lazily.
    load_binding = "lazy"
    runtime_stem = "libcudart.so"
    runtime_dirs = ("/usr/local/cuda/lib", "/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib")

    def runtime_soname(self, toolkit: str) -> str | None:
        return f"{self.runtime_stem}.{toolkit.split('.', 1)[0]}"

    def variant_label(self, toolkit: str, archs: tuple[str, ...]) -> str:
        """cu130 for CUDA 13.0: one wheel carries every arch, the toolkit names it."""
        return "cu" + "".join(toolkit.split(".")[:2])

    def arch_problem(self, archs: tuple[str, ...]) -> str | None:
        bad = [a for a in archs if not CUDA_ARCH.match(a)]
        return f"CUDA archs must look like 9.0 or 12.0+PTX, got {bad or 'none'}" if bad or not archs else None

    def triton_targets(self, archs: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(f"cuda:{arch.split('+')[0].rstrip('af').replace('.', '')}" for arch in archs)

    def expected_device_code(self, archs: tuple[str, ...]) -> set[str]:
        expected = set()
        for arch in archs:
            number = arch.split("+")[0].replace(".", "")
            expected.add(f"sm_{number}")
            if arch.endswith("+PTX"):
                expected.add(f"compute_{number}")
        return expected

    def device_code(self, so: Path, builder_image: str, log: Path, env: Mapping[str, str]) -> set[str]:
        """sm_XX cubins and compute_XX PTX, listed by cuobjdump."""
        out = run([_cuobjdump(env), "--list-elf", "--list-ptx", str(so)], log=log, env=env)
        found = {f"sm_{m}" for m in re.findall(r"ELF file\s+\d+:.*\.sm_(\w+)\.cubin", out)}
        return found | {f"compute_{m}" for m in re.findall(r"PTX file\s+\d+:.*\.sm_(\w+)\.ptx", out)}

    def hardware_class(self, platform: Mapping[str, Any]) -> str:
        return "nvidia"

    def probe_hardware(self, env: Mapping[str, str]) -> frozenset[str]:
        return frozenset({"nvidia"}) if "GPU " in _output(["nvidia-smi", "-L"], env) else frozenset()

    def can_gate(self, hardware: str, host: Host) -> bool:
        return hardware in host.hardware


class Rocm:
    name = "rocm"
    runtime_prefixes = ("hip", "__hip")
    load_binding = "now"
    runtime_stem = "libamdhip64.so"
    runtime_dirs = ("/usr/lib/x86_64-linux-gnu", "/opt/rocm/lib", "/opt/rocm/lib64")

    def runtime_soname(self, toolkit: str) -> str | None:
        return f"{self.runtime_stem}.{toolkit.split('.', 1)[0]}"

    def variant_label(self, toolkit: str, archs: tuple[str, ...]) -> str:
        """rocm7.2.gfx942: the HIP runtime it links (major.minor) and, for a one-arch wheel, its arch."""
        release = "rocm" + ".".join(toolkit.split(".")[:2])
        return f"{release}.{archs[0]}" if len(archs) == 1 else release

    def arch_problem(self, archs: tuple[str, ...]) -> str | None:
        bad = [a for a in archs if a not in ROCM_ARCHS]
        return f"unknown ROCm archs {bad or 'none'}; known: {ROCM_ARCHS}" if bad or not archs else None

    def triton_targets(self, archs: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(f"hip:{arch}" for arch in archs)

    def expected_device_code(self, archs: tuple[str, ...]) -> set[str]:
        return set(archs)

    def device_code(self, so: Path, builder_image: str, log: Path, env: Mapping[str, str]) -> set[str]:
        """gfx code objects, listed by the builder image's own llvm-objdump (the LLVM hipcc drives:
        it reads its own LLVM's bundles). It extracts each bundle next to its input: work on a copy
        in a writable directory."""
        script = (f"mkdir -p /tmp/bundles && cd /tmp/bundles && cp /w/{so.name} . && "
                  f"llvm-objdump --offloading {so.name}")
        out = run(["docker", "run", "--rm", "--pull=never", "-v", f"{so.parent}:/w:ro", builder_image, "sh", "-c",
                   script], log=log, env=env)
        return set(re.findall(r"hipv4-amdgcn-amd-amdhsa--(gfx\w+)", out))

    def hardware_class(self, platform: Mapping[str, Any]) -> str:
        return str(platform.get("arch"))

    def probe_hardware(self, env: Mapping[str, str]) -> frozenset[str]:
        return frozenset(re.findall(r"\b(gfx9\d\w*)\b", _output(["rocminfo"], env)))

    def can_gate(self, hardware: str, host: Host) -> bool:
        return hardware in host.hardware


def _cuobjdump(env: Mapping[str, str]) -> str:
    found = shutil.which("cuobjdump", path=env.get("PATH"))
    if found:
        return found
    spec = importlib.util.find_spec("nvidia")
    for root in spec.submodule_search_locations if spec and spec.submodule_search_locations else []:
        for candidate in Path(root).glob("*/bin/cuobjdump"):
            return str(candidate)
    raise CheckError("cuobjdump not found", hint="pip install nvidia-cuda-cuobjdump (the factory dependency group)")


BACKENDS: dict[str, Backend] = {b.name: b for b in (Cpu(), Cuda(), Rocm())}


def get(name: str) -> Backend:
    if name not in BACKENDS:
        raise ConfigError(f"unknown backend {name!r}", hint=f"choose one of: {', '.join(BACKENDS)}")
    return BACKENDS[name]


def hardware_class(platform: Mapping[str, Any]) -> str:
    """The hardware class a suites report ran on, from the platform it records."""
    return BACKENDS.get(str(platform.get("backend")), BACKENDS["cpu"]).hardware_class(platform)
