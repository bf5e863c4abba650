"""The compile matrix: every Triton kernel specialization x every GPU target, compiled on this
CPU through the payload's kernel registry (one process per compile: a bad one kills its process).

A kernel that cannot compile for a target must be guarded off there; one that its guard allows
must compile. Either mismatch fails the matrix. Written to build/compile-matrix.json.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

from polykernels_build.errors import ToolError
from polykernels_build.index import write_atomically
from polykernels_build.settings import Settings


@dataclass(frozen=True)
class MatrixResult:
    rows: list[dict]

    @property
    def consistent(self) -> bool:
        return all(r["consistent"] for r in self.rows)

    @property
    def summary(self) -> str:
        bad = [f"{r['kernel']}@{r['target']}" for r in self.rows if not r["consistent"]]
        guarded = sum(1 for r in self.rows if not r["compiled"] and not r["allowed"])
        return (f"{len(self.rows)} compiles, {guarded} guarded off as expected"
                + (f", MISSING GUARDS or broken kernels: {bad}" if bad else ""))


_PROBE = """
import json, sys
from dataclasses import asdict
from polykernels.kernel_registry import probe
print(json.dumps(asdict(probe(sys.argv[1], sys.argv[2]))) + "\\n", end="")
"""


def _kernels(settings: Settings) -> tuple[list[str], list[str]]:
    code = ("import json; from polykernels import kernel_registry as k; k._load_all();"
            "print(json.dumps([list(k.KERNELS), list(k.GPU_TARGETS)]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False,
                          env=dict(settings.tool_env), cwd=settings.root)
    if proc.returncode:
        raise ToolError([sys.executable, "-c", code], proc.returncode, proc.stderr,
                        hint="the compile matrix needs polykernels and triton importable (nox -s compile_matrix)")
    kernels, gpu_targets = json.loads(proc.stdout)
    return kernels, gpu_targets


def run(settings: Settings, workers: int = 2) -> MatrixResult:
    settings.build_dir.mkdir(parents=True, exist_ok=True)
    kernels, gpu_targets = _kernels(settings)

    def one(pair: tuple[str, str]) -> dict:
        proc = subprocess.run([sys.executable, "-c", _PROBE, *pair], capture_output=True, text=True, check=False,
                              env=dict(settings.tool_env), cwd=settings.root)
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        row["consistent"] = row["compiled"] or not row["allowed"]
        return row

    with ThreadPoolExecutor(max_workers=workers) as pool:
        rows = list(pool.map(one, [(k, t) for k in kernels for t in gpu_targets]))
    result = MatrixResult(rows=rows)
    write_atomically(settings.build_dir / "compile-matrix.json", json.dumps(asdict(result), indent=2))
    return result
