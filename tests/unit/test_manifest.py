from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from polykernels import _manifest
from polykernels.platform import Platform

HIP_72 = "7.2.53211-8c0d1a3f"  # torch.version.hip of a ROCm 7.2 build
H100 = Platform(backend="cuda", arch="sm_90", device_name="H100", warp_size=32, runtime_version="13.0")
B200 = Platform(backend="cuda", arch="sm_100", device_name="B200", warp_size=32, runtime_version="13.0")
RTX = Platform(backend="cuda", arch="sm_121", device_name="RTX", warp_size=32, runtime_version="13.0")
A10 = Platform(backend="cuda", arch="sm_86", device_name="A10", warp_size=32, runtime_version="13.0")
T4 = Platform(backend="cuda", arch="sm_75", device_name="T4", warp_size=32, runtime_version="13.0")
MI300X = Platform(backend="rocm", arch="gfx942", device_name="MI300X", warp_size=64, runtime_version=HIP_72)
MI355X = Platform(backend="rocm", arch="gfx950", device_name="MI355X", warp_size=64, runtime_version=HIP_72)
CPU = Platform(backend="cpu", arch=None, device_name=None, warp_size=1, runtime_version=None)

INDEX = "https://wheels.example/polykernels"
CUDA_WHEEL = _manifest.BuildInfo(target="cuda13", variant="cu130", backend="cuda",
                                 archs=("8.0", "9.0", "10.0", "12.0+PTX"), toolkit="13.0", torch_floor="2.11",
                                 index_url=f"{INDEX}/cu130/simple",
                                 runtime={"soname": "libcudart.so.13", "version": "13.0"})
GFX942_WHEEL = _manifest.BuildInfo(target="rocm-gfx942", variant="rocm7.2.gfx942", backend="rocm",
                                   archs=("gfx942",), toolkit="7.2", torch_floor="2.13",
                                   index_url=f"{INDEX}/rocm7.2.gfx942/simple",
                                   runtime={"soname": "libamdhip64.so.7", "version": "7.2.53211-8c0d1a3f"})


@pytest.mark.parametrize("seen", [H100, B200, RTX, A10], ids=lambda p: p.device_name)
def test_cuda_wheel_runs_on_covered_nvidia(seen: Platform) -> None:
    _manifest.check(CUDA_WHEEL, seen, "2.11.0+cu130")


def test_cuda_wheel_under_rocm_torch_names_the_rocm_wheel() -> None:
    with pytest.raises(ImportError, match=r"CUDA build .* ROCm build .*rocm7\.2\.gfx942/simple polykernels"):
        _manifest.check(CUDA_WHEEL, MI300X, "2.13.0+rocm7.2")


def test_refusal_is_a_pasteable_command() -> None:
    # The manifest names its own variant's index; the refusal names the sibling index that fits.
    with pytest.raises(ImportError) as refused:
        _manifest.check(CUDA_WHEEL, MI355X, "2.13.0+rocm7.2")
    command = str(refused.value).split("To fix, install the matching wheel: ")[1]
    assert command == f"pip install --force-reinstall --index-url {INDEX}/rocm7.2.gfx950/simple polykernels"
    assert "<" not in command


def test_arch_is_checked_at_first_device_use_not_at_import() -> None:
    # Import compares torch.version only (arch unknown): no device query, so nothing to refuse.
    at_import = Platform(backend="rocm", arch=None, device_name=None, warp_size=64, runtime_version=HIP_72)
    _manifest.check(GFX942_WHEEL, at_import, "2.13.0+rocm7.2")
    with pytest.raises(ImportError, match=r"no device code for this GPU \(MI355X, gfx950\)"):
        _manifest.check_device(GFX942_WHEEL, MI355X)
    _manifest.check_device(GFX942_WHEEL, MI300X)


def test_rocm_wheel_under_cuda_torch_names_the_cuda_wheel() -> None:
    with pytest.raises(ImportError, match=r"ROCm build .* CUDA build .*cu130/simple polykernels"):
        _manifest.check(GFX942_WHEEL, H100, "2.13.0+cu130")


def test_missing_gpu_arch_is_named() -> None:
    with pytest.raises(ImportError, match=r"no device code for this GPU \(MI355X, gfx950\).*rocm7\.2\.gfx950"):
        _manifest.check(GFX942_WHEEL, MI355X, "2.13.0+rocm7.2")
    with pytest.raises(ImportError, match=r"sm_75"):
        _manifest.check(CUDA_WHEEL, T4, "2.11.0")


def test_torch_below_floor() -> None:
    with pytest.raises(ImportError,
                       match=r"needs torch >= 2\.11, but torch 2\.10\.1\+cu128 is installed.*upgrade 'torch>=2\.11'"):
        _manifest.check(CUDA_WHEEL, H100, "2.10.1+cu128")


def test_cpu_platform_accepts_any_wheel_backend_checks_only_torch() -> None:
    _manifest.check(CUDA_WHEEL, CPU, "2.11.0")


def test_source_tree_has_no_manifest_and_no_check() -> None:
    _manifest.check(None, MI300X, "1.0")


def test_import_fails_cleanly_for_wrong_wheel(tmp_path: Path) -> None:
    # A copy of the package whose manifest claims a torch floor above the installed torch:
    # `import polykernels` must raise IncompatibleWheelError, not crash later.
    import shutil

    import polykernels

    package = tmp_path / "polykernels"
    shutil.copytree(Path(polykernels.__file__).parent, package, ignore=shutil.ignore_patterns("*.so"))
    info = {"target": "cuda13", "variant": "cu130", "backend": "cpu", "archs": [], "toolkit": None,
            "torch_floor": "99.0"}
    (package / "_build_info.json").write_text(json.dumps(info))
    proc = subprocess.run([sys.executable, "-c", "import polykernels"], cwd=tmp_path, capture_output=True,
                          text=True, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}, check=False)
    assert proc.returncode == 1
    assert "IncompatibleWheelError" in proc.stderr and "needs torch >= 99.0" in proc.stderr


def at_import(backend: str, runtime: str) -> Platform:
    """What the import-time check sees: torch.version only, no device query."""
    return Platform(backend=backend, arch=None, device_name=None, warp_size=64 if backend == "rocm" else 32,
                    runtime_version=runtime)


def test_rocm7_wheel_under_rocm6_torch_is_refused_naming_the_rocm6_variant() -> None:
    # libamdhip64.so.7 does not exist under a ROCm 6 torch: refuse at import, not "cannot open shared object".
    with pytest.raises(ImportError) as refused:
        _manifest.check(GFX942_WHEEL, at_import("rocm", "6.4.43482-0f2d60242"), "2.13.0+rocm6.4")
    message = str(refused.value)
    assert "libamdhip64.so.7 (HIP 7.2)" in message and "HIP 6.4.43482" in message
    assert message.endswith(f"--index-url {INDEX}/rocm6.4.gfx942/simple polykernels")


def test_rocm_wheel_newer_than_torchs_runtime_minor_is_refused() -> None:
    with pytest.raises(ImportError, match=r"newer than torch's HIP 7\.0.*rocm7\.0\.gfx942/simple"):
        _manifest.check(GFX942_WHEEL, at_import("rocm", "7.0.51831-a3e329ad8"), "2.13.0+rocm7.0")


def test_rocm_wheel_runs_under_the_same_or_a_newer_runtime_minor() -> None:
    _manifest.check(GFX942_WHEEL, at_import("rocm", "7.2.53211-8c0d1a3f"), "2.13.0+rocm7.2")
    _manifest.check(GFX942_WHEEL, at_import("rocm", "7.3.1-x"), "2.14.0+rocm7.3")


def test_cuda13_wheel_under_cuda12_torch_names_the_cu128_index() -> None:
    with pytest.raises(ImportError, match=r"libcudart\.so\.13 \(CUDA 13\.0\).*cu128/simple polykernels"):
        _manifest.check(CUDA_WHEEL, at_import("cuda", "12.8"), "2.11.0+cu128")
    _manifest.check(CUDA_WHEEL, at_import("cuda", "13.2"), "2.14.0+cu132")


def test_a_manifest_without_runtime_is_not_refused_for_it() -> None:
    # Wheels built before the runtime was recorded (or local builds): nothing was promised.
    old = _manifest.BuildInfo(target="rocm-gfx942", variant="rocm7.2.gfx942", backend="rocm", archs=("gfx942",),
                              toolkit="7.2", torch_floor="2.13")
    _manifest.check(old, at_import("rocm", "6.4.1"), "2.13.0+rocm6.4")
