"""What this host can gate: probed once by the CLI, passed to `release --target auto`."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class Host:
    nvidia_gpu: bool
    rocm_archs: frozenset[str]

    def can_gate(self, hardware: str) -> bool:
        if hardware == "any":
            return True
        if hardware == "nvidia":
            return self.nvidia_gpu
        return hardware in self.rocm_archs


def _output(argv: list[str]) -> str:
    if shutil.which(argv[0]) is None:
        return ""
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    return proc.stdout if proc.returncode == 0 else ""


def probe() -> Host:
    return Host(nvidia_gpu="GPU " in _output(["nvidia-smi", "-L"]),
                rocm_archs=frozenset(re.findall(r"\b(gfx9\d\w*)\b", _output(["rocminfo"]))))
