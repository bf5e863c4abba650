"""Runs the suites and assembles the report."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

import torch

from polykernels.suites.report import Report, SuiteResult, package_versions

# Suite name -> module. A suite whose module is not in this package is reported "absent".
SUITE_MODULES = {
    "qwen_generation": "polykernels.suites.qwen_generation",
    "flux_warmup": "polykernels.suites.flux_warmup",
    "int4_parity": "polykernels.suites.int4_parity",
}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: torch sees no CUDA/ROCm GPU here")
    return device


def run_one(name: str, device: torch.device) -> SuiteResult:
    module_name = SUITE_MODULES[name]
    if importlib.util.find_spec(module_name) is None:
        return SuiteResult(name=name, status="absent", reason="this version of polykernels has no such suite")
    start = time.perf_counter()
    try:
        module = importlib.import_module(module_name)
        return module.run(device)
    except Exception as exc:
        return SuiteResult(
            name=name,
            status="failed",
            reason=f"{type(exc).__name__}: {exc}",
            seconds=time.perf_counter() - start,
            metrics={"traceback": traceback.format_exc()[-4000:]},
        )


def run_suites(names: list[str], device: torch.device) -> Report:
    from polykernels import _manifest, platform

    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    start = time.perf_counter()
    results = []
    for name in names:
        results.append(run_one(name, device))
        print(f"  {name}: {results[-1].status} in {results[-1].seconds:.1f}s", flush=True)
    info = _manifest.load_build_info()
    import polykernels

    return Report(
        passed=all(r.status == "passed" for r in results),
        platform=dataclasses.asdict(platform.current()),
        device=str(device),
        versions=package_versions(),
        build_info=dataclasses.asdict(info) if info else None,
        package_path=str(Path(polykernels.__file__).parent),
        suites=results,
        started_at=started,
        seconds=time.perf_counter() - start,
    )
