"""Every Triton kernel specialization we ship, and whether its family's guard allows it on a target.

Each op family registers its own specs (``<family>/registry.py``, imported by ``kernels()``).
This is the seam the compile matrix uses: ``python -m polykernels.kernel_registry compile NAME
TARGET`` compiles one specialization for one GPU target (no GPU needed) and prints JSON; the
GPU targets come from the factory's targets.toml. ``probe`` runs it in its own process because
a bad specialization (inline PTX on a gfx target) does not raise: LLVM's fatal error ends the
process. A kernel that cannot compile for a target must be guarded off there; the matrix
checks exactly that, asking the same guard the launcher asks.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from polykernels import loop_spills

FAMILIES = ("polykernels.norm.registry", "polykernels.gated_delta_rule.registry")


def _always() -> bool:
    return True


@dataclass(frozen=True, kw_only=True)
class KernelSpec:
    name: str
    module: str
    function: str
    signature: dict[str, str]
    constexprs: dict[str, Any] = field(default_factory=dict)
    # The family's guard: may this specialization run on the current platform? Asked under the
    # platform of each compile target, exactly as the launcher asks it before a launch.
    allowed: Callable[[], bool] = _always
    # Constexprs the launcher derives from the platform, computed per target by the same guard.
    platform_constexprs: Callable[[], dict[str, Any]] | None = None
    # num_warps / num_stages as the launcher passes them: registers and spills depend on them.
    options: dict[str, int] = field(default_factory=dict)
    # Options the launcher derives from the platform (a per-arch launch table), over ``options``.
    platform_options: Callable[[], dict[str, int]] | None = None
    # Integer arguments that are multiples of 16 at the shapes the spec stands for (FLUX's D 3072):
    # Triton's launcher specializes them as it does 16-byte aligned pointers, and offsets built from
    # them then compile to 16-byte loads. Without it the norms compiled to 2-byte loads and stores,
    # and their registers read up to 180 where the launched kernels take 80-127 (BENCHMARKS.md).
    multiple_of_16: tuple[str, ...] = ()

    def allowed_on(self, target: str) -> bool:
        from polykernels import platform

        with platform.use(platform.for_triton_target(target)):
            return self.allowed()

    def options_on(self, target: str) -> dict[str, int]:
        """The options the launcher passes on ``target``."""
        from polykernels import platform

        if self.platform_options is None:
            return dict(self.options)
        with platform.use(platform.for_triton_target(target)):
            return {**self.options, **self.platform_options()}


KERNELS: dict[str, KernelSpec] = {}


def register(spec: KernelSpec) -> None:
    KERNELS[spec.name] = spec


def kernels() -> dict[str, KernelSpec]:
    """Every registered specialization; each family registers its own on import."""
    for family in FAMILIES:
        importlib.import_module(family)
    return KERNELS


def _gpu_target(target: str) -> Any:
    from triton.backends.compiler import GPUTarget

    from polykernels import platform

    seen = platform.for_triton_target(target)
    if seen.backend == "cuda":
        return GPUTarget("cuda", int(target.split(":")[1]), seen.warp_size)
    return GPUTarget("hip", seen.arch, seen.warp_size)


def compile_here(name: str, target: str, fingerprint: bool = False) -> dict[str, Any]:
    """Compile one specialization in this process (may kill it: use `probe`). ``fingerprint``: also the
    hash of its instructions (``code_fingerprint``)."""
    import triton
    from triton.compiler import ASTSource

    from polykernels import platform
    from polykernels._launch import fewer_stages

    spec = kernels()[name]
    fn = getattr(importlib.import_module(spec.module), spec.function)
    constexprs = dict(spec.constexprs)
    if spec.platform_constexprs is not None:
        with platform.use(platform.for_triton_target(target)):
            constexprs.update(spec.platform_constexprs())
    # Pointers specialized as 16-byte aligned, as Triton's launcher specializes every tensor torch
    # allocates, and the integers the spec names as multiples of 16: without it the loads are not
    # vectorized and registers and spills read far too high.
    aligned = {(fn.arg_names.index(arg),): [["tt.divisibility", 16]]
               for arg, kind in spec.signature.items() if kind.startswith("*") or arg in spec.multiple_of_16}
    if getattr(fn, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource  # layouts need num_warps
    source = ASTSource(fn, signature=spec.signature, constexprs=constexprs, attrs=aligned)
    options: dict[str, Any] | None = spec.options_on(target)
    limit = platform.SHARED_MEMORY_PER_BLOCK.get(platform.for_triton_target(target).arch or "")
    while True:
        compiled = triton.compile(source, target=_gpu_target(target), options=options)
        shared = int(getattr(compiled.metadata, "shared", 0))
        if limit is None or shared <= limit:
            break
        options = fewer_stages(options)  # as the launcher falls back on the device
        if options is None:
            raise RuntimeError(f"{name} needs {shared} bytes of shared memory per program even with one "
                               f"pipeline stage; {target} has {limit}: it cannot launch there")
    binary = next((k for k in ("cubin", "hsaco") if k in compiled.asm), None)
    return {"kernel": name, "target": target, "ok": True, "binary": binary,
            "bytes": len(compiled.asm[binary]) if binary else 0,
            "resources": {**resources(compiled), "num_stages": options.get("num_stages", 1),
                          "shared_limit": limit or 0},
            **({"code_fingerprint": code_fingerprint(compiled)} if fingerprint else {})}


def code_fingerprint(compiled: Any) -> str | None:
    """A hash of a compiled kernel's instructions alone (``instruction_lines``): two sources that compile to the
    same machine code have the same one, whatever their line numbers, so a rewrite meant to change no code
    (a rename, a helper moved, a flag that is always on where it acts) is checked on the build host before any
    GPU runs it. None where the tool to read a cubin is missing."""
    cubin = compiled.asm.get("cubin")
    lines = instruction_lines(_cuobjdump_sass(cubin) if cubin else compiled.asm.get("amdgcn", ""))
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16] if lines else None


_SASS_ADDRESS = re.compile(r"^\s*/\*[0-9a-f]+\*/")


def instruction_lines(text: str) -> list[str]:
    """The instructions of SASS (``cuobjdump -sass``: with their encodings) or AMD assembly, one per line, without
    what a source edit moves and the code does not: addresses, line tables, comments, directives, labels and the
    kernel's name."""
    raw_lines = text.splitlines()
    sass = any(_SASS_ADDRESS.match(raw) for raw in raw_lines)
    lines = []
    for raw in raw_lines:
        if sass:
            if _SASS_ADDRESS.match(raw):  # "/*0040*/  OPCODE operands ;  /* encoding */", its scheduling bits in it
                code = _SASS_ADDRESS.sub("", raw)
            elif raw.lstrip().startswith("/* 0x"):  # the encoding's second half
                code = raw
            else:  # the dump's headers, the line tables
                continue
        else:  # AMD assembly: its comments from ";", directives from "."
            code = raw.split(";", 1)[0].strip()
            if code.startswith((".", "//")) or code.endswith(":"):
                continue
        if code.strip():
            lines.append(" ".join(code.split()))
    return lines


def resources(compiled: Any) -> dict[str, int]:
    """Registers per thread, spill bytes per thread and shared memory per program of a compiled
    kernel, read on this CPU: what makes a kernel slow before any GPU runs it (a spilling
    kernel's stack or scratch traffic), and where it spills, the spill instructions inside its
    loops (``loop_spills``). Empty where the tool to read them is missing."""
    found: dict[str, int] = {"shared_bytes": int(getattr(compiled.metadata, "shared", 0))}
    if "cubin" in compiled.asm:
        usage = _cuobjdump_resource_usage(compiled.asm["cubin"])
        match = re.search(r"REG:(\d+) STACK:(\d+)", usage)
        if not match:
            return {}
        found.update(registers=int(match[1]), spill_bytes=int(match[2]))
        if found["spill_bytes"]:
            found["loop_spill_instructions"] = loop_spills.sass_loop_spills(_cuobjdump_sass(compiled.asm["cubin"]))
        serialized = serialized_products(compiled.asm.get("ptx", ""))
        if serialized is not None:
            found["serialized_products"] = int(serialized)
    elif "amdgcn" in compiled.asm:
        text = compiled.asm["amdgcn"]
        vgprs, scratch = re.search(r"; TotalNumVgprs: (\d+)", text), re.search(r"; ScratchSize: (\d+)", text)
        if not (vgprs and scratch):
            return {}
        found.update(registers=int(vgprs[1]), spill_bytes=int(scratch[1]))
        if found["spill_bytes"]:
            found["loop_spill_instructions"] = loop_spills.amdgcn_loop_spills(text)
    return found


# What ptxas reports (its infos C7510-C7515, "Potential Performance Loss") when it must run a Hopper
# kernel's asynchronous tensor-core products one after another: the overlap the kernel was written
# for is gone, and the compile still succeeds. A variant of the Gluon sequential pass that left its
# output product in flight across chunks compiled so and ran 57% slower on the H200 (BENCHMARKS.md,
# "twelfth set").
_SERIALIZED = "wgmma.mma_async instructions are serialized"


def serialized_products(ptx: str) -> bool | None:
    """Whether ptxas serializes the wgmma products of this PTX (None: it has none, or no ptxas here).
    Triton's own ptxas run keeps no log, so the PTX is assembled once more for it."""
    arch = re.search(r"^\.target\s+(sm_\w+)", ptx, re.MULTILINE)
    if "wgmma.mma_async" not in ptx or not arch:
        return None
    log = _run_triton_nvidia_tool("ptxas", "kernel.ptx", ptx.encode(), "-v", f"--gpu-name={arch[1]}", "-o",
                                  "kernel.cubin")
    return None if log is None else _SERIALIZED in log


def _run_triton_nvidia_tool(name: str, file_name: str, content: bytes, *args: str) -> str | None:
    """stdout and stderr of one of the NVIDIA tools Triton ships (ptxas, cuobjdump), run in a scratch
    folder on ``content`` written to ``file_name`` (its arguments name files there); None without it."""
    import tempfile
    from pathlib import Path

    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    if not tool.is_file():
        return None
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / file_name).write_bytes(content)
        done = subprocess.run([str(tool), *args, file_name], capture_output=True, text=True, check=False,
                              timeout=300, cwd=tmp)
    return done.stdout + done.stderr


def _cuobjdump_resource_usage(cubin: bytes) -> str:
    return _run_triton_nvidia_tool("cuobjdump", "kernel.cubin", cubin, "--dump-resource-usage") or ""


def _cuobjdump_sass(cubin: bytes) -> str:
    return _run_triton_nvidia_tool("cuobjdump", "kernel.cubin", cubin, "-sass") or ""


@dataclass(frozen=True, kw_only=True)
class ProbeResult:
    kernel: str
    target: str
    compiled: bool
    allowed: bool
    detail: str
    resources: dict[str, int] = field(default_factory=dict)

    @property
    def consistent(self) -> bool:
        """Allowed kernels must compile; kernels that fail to compile must be guarded off."""
        return self.compiled or not self.allowed


def probe(name: str, target: str, timeout: float = 600.0) -> ProbeResult:
    spec = kernels()[name]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "polykernels.kernel_registry", "compile", name, target],
        capture_output=True, text=True, timeout=timeout, env=env, check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode == 0 and lines:
        result = json.loads(lines[-1])
        used = result.get("resources", {})
        detail = f"{result['binary']} {result['bytes']} bytes"
        if "registers" in used:
            detail += f", {used['registers']} registers, {used['spill_bytes']} spill bytes per thread"
        if used.get("loop_spill_instructions"):
            detail += f", {used['loop_spill_instructions']} spill loads and stores inside a loop"
        if used.get("serialized_products"):
            detail += ", its tensor-core products serialized by ptxas"
        asked = spec.options_on(target).get("num_stages", 1)
        if used.get("num_stages", 1) < asked:
            detail += (f", {used['num_stages']} of {asked} pipeline stages fit its "
                       f"{used['shared_limit']} bytes of shared memory")
        return ProbeResult(kernel=name, target=target, compiled=True, allowed=spec.allowed_on(target),
                           detail=detail, resources=used)
    tail = [line for line in proc.stderr.strip().splitlines() if line.strip()][-3:]
    return ProbeResult(kernel=name, target=target, compiled=False, allowed=spec.allowed_on(target),
                       detail=f"compiler process exited {proc.returncode}: {' | '.join(tail)[:400]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m polykernels.kernel_registry")
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("compile", help="compile in this process and print JSON")
    one.add_argument("name")
    one.add_argument("target", help="a Triton target: cuda:NN (sm_NN) or hip:gfxNNN")
    one.add_argument("--fingerprint", action="store_true",
                     help="also a hash of the instructions: the same before and after a rewrite that changes no code")
    args = parser.parse_args(argv)
    # Run as `python -m`, this file is __main__; families register into the imported module.
    registry = importlib.import_module("polykernels.kernel_registry")
    print(json.dumps(registry.compile_here(args.name, args.target, args.fingerprint)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
