"""Synthetic wheels for the factory's pure-logic tests (the e2e tests use real ones)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from polykernels_build.dist import Wheel


def make_wheel(directory: Path, target: str = "cpu", variant: str = "cpu", payload: bytes = b"x",
               version: str = "0.1.0") -> Wheel:
    """A wheel as the build leaves it: the file, and its recorded identity beside it."""
    directory.mkdir(parents=True, exist_ok=True)
    name = f"polykernels-{version}+{variant}-cp310-abi3-manylinux_2_34_x86_64.whl"
    path = directory / name
    info = {"target": target, "variant": variant, "backend": "cpu", "archs": [], "torch_floor": "2.11",
            "image_digest": "sha256:" + "0" * 64, "index_url": f"http://127.0.0.1:8000/{variant}/simple"}
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("polykernels/_build_info.json", json.dumps(info))
        archive.writestr("polykernels/payload.bin", payload)
        archive.writestr(f"polykernels-{version}+{variant}.dist-info/METADATA",
                         f"Metadata-Version: 2.4\nName: polykernels\nVersion: {version}+{variant}\n"
                         "Requires-Python: >=3.10\n")
    return Wheel.open(path).save()


def suites_report(passed: bool = True, backend: str = "cpu", arch: str | None = None) -> dict:
    status = "passed" if passed else "failed"
    return {
        "passed": passed,
        "platform": {"backend": backend, "arch": arch},
        "suites": [{"name": n, "status": status if n == "int4_parity" else "passed"}
                   for n in ("qwen_generation", "flux_warmup", "int4_parity")],
    }
