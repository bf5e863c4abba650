"""The compile matrix: every Triton kernel specialization x every GPU target, compiled on this
CPU through the payload's kernel registry (one process per compile: a bad one kills its process).
The GPU targets are the archs of targets.toml's targets, as their backends name them for Triton.

A kernel that cannot compile for a target must be guarded off there; one that its guard allows
must compile. Either mismatch fails the matrix. Each compile also records its registers, spill
bytes and shared memory per target (with the launcher's warps and stages): spills are reported,
not failed, since a spilling kernel can still be the fastest one measured (those whose spills sit
inside a loop, paid every iteration, are named apart: NVIDIA's local memory and AMD's scratch
alike). A kernel whose Hopper tensor-core products ptxas serializes fails it (the compile succeeds
and the kernel runs slower than the form it was written in). Written to build/compile-matrix.json.
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from polykernels_build import backends
from polykernels_build.dist import write_atomically
from polykernels_build.settings import Settings
from polykernels_build.targets import Matrix
from polykernels_build.tools import run as run_tool


@dataclass(frozen=True)
class MatrixResult:
    rows: list[dict]

    @property
    def consistent(self) -> bool:
        return all(r["consistent"] for r in self.rows) and not self.serialized

    def _with(self, resource: str) -> list[str]:
        """kernel@target pairs whose compile read a non-zero ``resource`` (kernel_registry.resources)."""
        return [f"{r['kernel']}@{r['target']}" for r in self.rows if r.get("resources", {}).get(resource)]

    @property
    def serialized(self) -> list[str]:
        """kernel@target pairs whose wgmma products ptxas runs one after another (kernel_registry)."""
        return self._with("serialized_products")

    @property
    def spilling(self) -> list[str]:
        """kernel@target pairs whose threads spill registers (stack on NVIDIA, scratch on AMD)."""
        return self._with("spill_bytes")

    @property
    def spilling_in_loops(self) -> list[str]:
        """The spilling pairs whose spill loads or stores sit inside a loop (paid every iteration)."""
        return self._with("loop_spill_instructions")

    @property
    def summary(self) -> str:
        bad = [f"{r['kernel']}@{r['target']}" for r in self.rows if not r["consistent"]]
        guarded = sum(1 for r in self.rows if not r["compiled"] and not r["allowed"])
        spills, in_loops, serialized = self.spilling, self.spilling_in_loops, self.serialized
        return (f"{len(self.rows)} compiles, {guarded} guarded off as expected"
                + (f"; {len(spills)} spill registers (see compile-matrix.json): {', '.join(spills)}" if spills else "")
                + (f"; inside a loop: {', '.join(in_loops)}" if in_loops else "")
                + (f", MISSING GUARDS or broken kernels: {bad}" if bad else "")
                + (f", TENSOR-CORE PRODUCTS SERIALIZED by ptxas: {serialized}" if serialized else ""))


_PROBE = """
import json, sys
from dataclasses import asdict
from polykernels.kernel_registry import probe
print(json.dumps(asdict(probe(sys.argv[1], sys.argv[2]))) + "\\n", end="")
"""


def gpu_targets(matrix: Matrix) -> list[str]:
    """Triton targets ("cuda:90", "hip:gfx942") of every target's archs, in matrix order."""
    found = [t for target in matrix.targets.values()
             for t in backends.get(target.backend).triton_targets(target.archs)]
    return list(dict.fromkeys(found))


def _kernels(settings: Settings, log: Path) -> list[str]:
    code = "import json; from polykernels import kernel_registry as k; print(json.dumps(list(k.kernels())))"
    out = run_tool([sys.executable, "-c", code], log=log, env=settings.tool_env, cwd=settings.root,
                   stderr_to_log=True,
                   hint="the compile matrix needs polykernels and triton importable (nox -s compile_matrix)")
    return json.loads(out.strip().splitlines()[-1])


def run(settings: Settings, matrix: Matrix, workers: int = 2) -> MatrixResult:
    settings.build_dir.mkdir(parents=True, exist_ok=True)
    log = settings.build_dir / "logs" / "compile-matrix.log"
    kernels, targets = _kernels(settings, log), gpu_targets(matrix)

    def one(pair: tuple[str, str]) -> dict:
        out = run_tool([sys.executable, "-c", _PROBE, *pair], log=log, env=settings.tool_env, cwd=settings.root,
                       stderr_to_log=True)
        row = json.loads(out.strip().splitlines()[-1])
        row["consistent"] = row["compiled"] or not row["allowed"]
        return row

    with ThreadPoolExecutor(max_workers=workers) as pool:
        rows = list(pool.map(one, [(k, t) for k in kernels for t in targets]))
    result = MatrixResult(rows=rows)
    write_atomically(settings.build_dir / "compile-matrix.json", json.dumps(asdict(result), indent=2))
    return result
