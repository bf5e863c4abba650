"""Synthetic wheels for the factory's pure-logic tests (the e2e tests use real ones)."""

from __future__ import annotations

import json
import zipfile
from dataclasses import asdict
from pathlib import Path

from polykernels_build import publish, targets
from polykernels_build.dist import GateReport, Wheel, judge
from polykernels_build.settings import Settings
from polykernels_build.signing import Keyring

MATRIX = targets.load(Path(__file__).resolve().parents[2] / "targets.toml")


def run_publish(settings: Settings, **kwargs: object) -> list[publish.Decision]:
    """publish.publish over the repository's targets.toml, local index by default, no waivers."""
    options = {"index_root": None, "repository_url": None, "waivers": {}, "partial": False,
               "log": settings.build_dir / "log"}
    options.update(kwargs)
    return publish.publish(settings, MATRIX, **options)  # type: ignore[arg-type]


def make_wheel(directory: Path, target: str = "cpu", variant: str = "cpu", payload: bytes = b"x",
               version: str = "0.1.0", name: str | None = None, manifest_variant: str | None = None) -> Wheel:
    """A wheel as the build leaves it: the file, and its recorded identity beside it.
    ``name`` renames the file (another build or platform tag, another label)."""
    directory.mkdir(parents=True, exist_ok=True)
    name = name or f"polykernels-{version}+{variant}-cp310-abi3-manylinux_2_34_x86_64.whl"
    path = directory / name
    info = {"target": target, "variant": manifest_variant or variant, "backend": "cpu", "archs": [],
            "torch_floor": "2.11",
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


def gate_report(wheel: Wheel, passed: bool = True, backend: str = "cpu", arch: str | None = None,
                variant: str | None = None) -> GateReport:
    """The report the gate would write for ``wheel`` after suites that ran on ``backend``."""
    from polykernels_build import backends

    suites = suites_report(passed, backend, arch)
    ok, reason = judge(suites)
    return GateReport(wheel_sha256=wheel.sha256, wheel_name=wheel.name, target=wheel.target,
                      variant=variant or wheel.manifest["variant"], hardware_class=backends.hardware_class(
                          suites["platform"]), runtime="venv", host="test", passed=ok, reason=reason, seconds=1.0,
                      created_at="2026-11-29T00:00:00+00:00", suites=suites)


def report_file(path: Path, report: GateReport, keyring: Keyring | None = None) -> Path:
    """A report as another host hands it over: JSON, and ``<file>.sig`` when ``keyring`` signs it."""
    data = json.dumps(asdict(report), indent=2).encode()
    path.write_bytes(data)
    if keyring is not None:
        path.with_name(path.name + ".sig").write_bytes(keyring.sign(data))
    return path
