"""Every Triton kernel specialization we ship, and the backends its guard allows.

This is the seam the compile matrix uses: ``python -m polykernels.kernel_registry probe NAME
TARGET`` compiles one specialization for one GPU target (no GPU needed) and prints JSON. The
probe runs in its own process because a bad specialization (inline PTX on a gfx target) does
not raise: LLVM's fatal error ends the process. A kernel that cannot compile for a target
must be guarded off there; the matrix checks exactly that.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

GPU_TARGETS = ("cuda:80", "cuda:90", "cuda:100", "cuda:120", "hip:gfx942", "hip:gfx950")


@dataclass(frozen=True, kw_only=True)
class KernelSpec:
    name: str
    module: str
    function: str
    signature: dict[str, str]
    constexprs: dict[str, Any] = field(default_factory=dict)
    backends: tuple[str, ...] = ("cuda", "hip")  # where the guards let it run
    # Constexprs the launcher derives from the platform, computed per target by the same guard.
    platform_constexprs: Callable[[], dict[str, Any]] | None = None

    def allowed_on(self, target: str) -> bool:
        return target.split(":", maxsplit=1)[0] in self.backends


_NORM_SIGNATURE = {
    "X": "*bf16", "Y": "*bf16", "W": "*bf16", "SHIFT": "*bf16", "SCALE": "*bf16", "MEAN": "*fp32", "RSTD": "*fp32",
    "rows": "i32", "L": "i32", "D": "i32", "stride_shift_b": "i32", "stride_shift_l": "i32", "stride_scale_b": "i32",
    "stride_scale_l": "i32", "eps": "fp32", "BLOCK_D": "constexpr", "ROWS": "constexpr", "IS_RMS": "constexpr",
    "EXACT_PTX": "constexpr", "TILE_MODULATION": "constexpr", "STORE_STATS": "constexpr",
}


def _norm(name: str, is_rms: bool, exact: bool) -> KernelSpec:
    return KernelSpec(
        name=name,
        module="polykernels.norm.kernels",
        function="norm_modulate_kernel",
        signature=_NORM_SIGNATURE,
        constexprs={"BLOCK_D": 4096, "ROWS": 2, "IS_RMS": is_rms, "EXACT_PTX": exact, "TILE_MODULATION": True,
                    "STORE_STATS": False},
        backends=("cuda",) if exact else ("cuda", "hip"),
    )


KERNELS: dict[str, KernelSpec] = {
    spec.name: spec
    for spec in (
        _norm("layernorm_modulate", is_rms=False, exact=False),
        _norm("layernorm_modulate_ptx", is_rms=False, exact=True),
        _norm("rmsnorm_scale_shift", is_rms=True, exact=False),
        _norm("rmsnorm_scale_shift_ptx", is_rms=True, exact=True),
        KernelSpec(
            name="qk_rmsnorm",
            module="polykernels.norm.kernels",
            function="qk_rmsnorm_kernel",
            signature={
                "Q": "*bf16", "K": "*bf16", "WQ": "*bf16", "WK": "*bf16", "QO": "*bf16", "KO": "*bf16",
                "q_rows": "i32", "k_rows": "i32", "head_dim": "i32", "eps": "fp32",
                "ROWS": "constexpr", "BLOCK_D": "constexpr",
            },
            constexprs={"ROWS": 16, "BLOCK_D": 128},
        ),
    )
}


def register(spec: KernelSpec) -> None:
    KERNELS[spec.name] = spec


def _load_all() -> None:
    # Families register their kernels on import.
    importlib.import_module("polykernels.gated_delta_rule.registry")


def _gpu_target(target: str) -> Any:
    from triton.backends.compiler import GPUTarget

    backend, arch = target.split(":")
    if backend == "cuda":
        return GPUTarget("cuda", int(arch), 32)
    if backend == "hip":
        return GPUTarget("hip", arch, 64)
    raise ValueError(f"unknown target {target!r}; expected one of {GPU_TARGETS}")


def compile_here(name: str, target: str) -> dict[str, Any]:
    """Compile one specialization in this process (may kill it: use `probe`)."""
    import triton
    from triton.compiler import ASTSource

    from polykernels import platform

    _load_all()
    spec = KERNELS[name]
    fn = getattr(importlib.import_module(spec.module), spec.function)
    constexprs = dict(spec.constexprs)
    if spec.platform_constexprs is not None:
        backend, arch = target.split(":")
        seen = platform.Platform(backend="cuda" if backend == "cuda" else "rocm",
                                 arch=f"sm_{arch}" if backend == "cuda" else arch, device_name=None,
                                 warp_size=32 if backend == "cuda" else 64, runtime_version=None)
        with platform.use(seen):
            constexprs.update(spec.platform_constexprs())
    source = ASTSource(fn, signature=spec.signature, constexprs=constexprs)
    compiled = triton.compile(source, target=_gpu_target(target))
    binary = next((k for k in ("cubin", "hsaco") if k in compiled.asm), None)
    return {"kernel": name, "target": target, "ok": True, "binary": binary,
            "bytes": len(compiled.asm[binary]) if binary else 0}


@dataclass(frozen=True, kw_only=True)
class ProbeResult:
    kernel: str
    target: str
    compiled: bool
    allowed: bool
    detail: str

    @property
    def consistent(self) -> bool:
        """Allowed kernels must compile; kernels that fail to compile must be guarded off."""
        return self.compiled or not self.allowed


def probe(name: str, target: str, timeout: float = 600.0) -> ProbeResult:
    _load_all()
    spec = KERNELS[name]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "polykernels.kernel_registry", "compile", name, target],
        capture_output=True, text=True, timeout=timeout, env=env, check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode == 0 and lines:
        result = json.loads(lines[-1])
        return ProbeResult(kernel=name, target=target, compiled=True, allowed=spec.allowed_on(target),
                           detail=f"{result['binary']} {result['bytes']} bytes")
    tail = [line for line in proc.stderr.strip().splitlines() if line.strip()][-3:]
    return ProbeResult(kernel=name, target=target, compiled=False, allowed=spec.allowed_on(target),
                       detail=f"compiler process exited {proc.returncode}: {' | '.join(tail)[:400]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m polykernels.kernel_registry")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list")
    one = sub.add_parser("compile", help="compile in this process and print JSON")
    one.add_argument("name")
    one.add_argument("target", help=f"one of {', '.join(GPU_TARGETS)}")
    args = parser.parse_args(argv)
    # Run as `python -m`, this file is __main__; families register into the imported module.
    registry = importlib.import_module("polykernels.kernel_registry")

    if args.command == "list":
        registry._load_all()
        for spec in registry.KERNELS.values():
            print(json.dumps({"kernel": spec.name, "backends": list(spec.backends)}))
        return 0
    print(json.dumps(registry.compile_here(args.name, args.target)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
