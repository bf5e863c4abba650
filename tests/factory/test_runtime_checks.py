"""The label check and the symbol-version proof, on small ELF fixtures built here with cc and ld
version scripts: a stand-in HIP runtime (SONAME libamdhip64.so.N, version node hip_4.2) and an
extension linked against it, so each check can be made to fail for exactly the bug it names."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from polykernels_build import checks, targets

ROOT = Path(__file__).resolve().parents[2]
MATRIX = targets.load(ROOT / "targets.toml")
ENV = {"PATH": os.environ["PATH"]}
GFX942 = MATRIX.target("rocm-gfx942")
HIP_72 = {"soname": "libamdhip64.so.7", "version": "7.2.53211-9999"}


def cc(*argv: str) -> None:
    if shutil.which("cc") is None:
        pytest.fail("these tests build tiny ELF fixtures: a C compiler is needed")
    subprocess.run(["cc", *argv], check=True, capture_output=True)


def runtime(directory: Path, soname: str = "libamdhip64.so.7", version: str = "hip_4.2",
            symbols: tuple[str, ...] = ("hipMalloc", "hipLaunchKernel")) -> Path:
    """A shared library that stands for the HIP runtime: SONAME, one version node, these functions."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "rt.c").write_text("".join(f"int {s}(void){{return 0;}}\n" for s in symbols))
    (directory / "rt.map").write_text(f"{version} {{ global: {'; '.join(symbols)}; local: *; }};\n")
    library = directory / soname
    cc("-shared", "-fPIC", str(directory / "rt.c"), "-o", str(library), f"-Wl,-soname,{soname}",
       f"-Wl,--version-script,{directory / 'rt.map'}")
    link = directory / soname.rsplit(".", 1)[0]  # libamdhip64.so, what -lamdhip64 finds
    link.unlink(missing_ok=True)
    link.symlink_to(library.name)
    return library


def extension(directory: Path, against: Path, calls: tuple[str, ...] = ("hipMalloc", "hipLaunchKernel")) -> Path:
    """An extension that calls these runtime functions, linked against ``against``."""
    directory.mkdir(parents=True, exist_ok=True)
    body = "".join(f"extern int {s}(void);\n" for s in calls)
    body += "int polykernels_probe(void){return " + " + ".join(f"{s}()" for s in calls) + ";}\n"
    (directory / "ext.c").write_text(body)
    so = directory / "_C.abi3.so"
    stem = against.name.split(".so")[0].removeprefix("lib")
    cc("-shared", "-fPIC", str(directory / "ext.c"), "-o", str(so), f"-L{against.parent}", f"-l{stem}")
    return so


@pytest.fixture
def hip7(tmp_path: Path) -> Path:
    return runtime(tmp_path / "rt7")


def test_label_passes_when_the_link_device_code_and_label_agree(tmp_path: Path, hip7: Path) -> None:
    so = extension(tmp_path / "ext", hip7)
    result = checks.check_label(so, {"gfx942"}, {"runtime": HIP_72, "variant": GFX942.variant}, GFX942,
                                tmp_path / "log", ENV)
    assert result.passed, result.detail
    assert "libamdhip64.so.7" in result.detail


def test_label_fails_for_a_rocm7_label_on_a_hip6_link(tmp_path: Path) -> None:
    # The bug this check exists for: labelled rocm7.x, DT_NEEDED libamdhip64.so.6.
    so = extension(tmp_path / "ext", runtime(tmp_path / "rt6", soname="libamdhip64.so.6"))
    manifest = {"runtime": {"soname": "libamdhip64.so.6", "version": "6.4.43482"}, "variant": GFX942.variant}
    result = checks.check_label(so, {"gfx942"}, manifest, GFX942, tmp_path / "log", ENV)
    assert not result.passed
    assert "DT_NEEDED GPU runtime ['libamdhip64.so.6']" in result.detail
    assert "is not toolkit 7.2" in result.detail and "the binary says variant 'rocm6.4.gfx942'" in result.detail


def test_label_fails_when_the_device_code_is_for_another_arch(tmp_path: Path, hip7: Path) -> None:
    so = extension(tmp_path / "ext", hip7)
    result = checks.check_label(so, {"gfx950"}, {"runtime": HIP_72, "variant": GFX942.variant}, GFX942,
                                tmp_path / "log", ENV)
    assert not result.passed and "'rocm7.2.gfx950'" in result.detail


def test_label_fails_when_the_manifest_misstates_the_runtime(tmp_path: Path, hip7: Path) -> None:
    so = extension(tmp_path / "ext", hip7)
    manifest = {"runtime": {"soname": "libamdhip64.so.6", "version": "7.2.1"}, "variant": GFX942.variant}
    result = checks.check_label(so, {"gfx942"}, manifest, GFX942, tmp_path / "log", ENV)
    assert not result.passed and "manifest runtime soname 'libamdhip64.so.6'" in result.detail


def test_label_fails_for_a_cpu_wheel_that_links_a_gpu_runtime(tmp_path: Path) -> None:
    so = extension(tmp_path / "ext", runtime(tmp_path / "cudart", soname="libcudart.so.13", version="libcudart.so.13",
                                             symbols=("cudaMalloc",)), calls=("cudaMalloc",))
    result = checks.check_label(so, set(), {"variant": "cpu"}, MATRIX.target("cpu"), tmp_path / "log", ENV)
    assert not result.passed and "libcudart.so.13" in result.detail


def test_label_cuda_reads_libcudart(tmp_path: Path) -> None:
    cudart = runtime(tmp_path / "cudart", soname="libcudart.so.13", version="libcudart.so.13",
                     symbols=("cudaMalloc", "cudaLaunchKernel"))
    so = extension(tmp_path / "ext", cudart, calls=("cudaMalloc", "cudaLaunchKernel"))
    cuda = MATRIX.target("cuda13")
    manifest = {"runtime": {"soname": "libcudart.so.13", "version": "13.0"}, "variant": cuda.variant}
    found = {"sm_80", "sm_90", "sm_100", "sm_120", "compute_120"}
    assert checks.check_label(so, found, manifest, cuda, tmp_path / "log", ENV).passed
    assert checks.check_runtime_symbols(so, cudart, cuda, tmp_path / "log", ENV).passed


def test_symbol_versions_pass_against_the_runtime_linked(tmp_path: Path, hip7: Path) -> None:
    so = extension(tmp_path / "ext", hip7)
    result = checks.check_runtime_symbols(so, hip7, GFX942, tmp_path / "log", ENV)
    assert result.passed, result.detail
    assert "2 runtime symbols (hip_4.2)" in result.detail


def test_symbol_missing_from_the_runtime_fails(tmp_path: Path, hip7: Path) -> None:
    # Built against a runtime that has hipLaunchKernel, checked against one that lacks it.
    so = extension(tmp_path / "ext", hip7)
    older = runtime(tmp_path / "older", symbols=("hipMalloc",))
    result = checks.check_runtime_symbols(so, older, GFX942, tmp_path / "log", ENV)
    assert not result.passed and "hipLaunchKernel@hip_4.2" in result.detail and "hipMalloc" not in result.detail


def test_symbol_defined_under_another_version_fails(tmp_path: Path, hip7: Path) -> None:
    so = extension(tmp_path / "ext", hip7)
    renamed = runtime(tmp_path / "renamed", version="hip_7.0")
    result = checks.check_runtime_symbols(so, renamed, GFX942, tmp_path / "log", ENV)
    assert not result.passed and "hipMalloc@hip_4.2" in result.detail


def test_runtime_library_with_another_soname_fails(tmp_path: Path, hip7: Path) -> None:
    so = extension(tmp_path / "ext", hip7)
    six = runtime(tmp_path / "rt6", soname="libamdhip64.so.6")
    result = checks.check_runtime_symbols(so, six, GFX942, tmp_path / "log", ENV)
    assert not result.passed and "SONAME 'libamdhip64.so.6'" in result.detail


def test_no_runtime_library_in_the_image_fails(tmp_path: Path, hip7: Path) -> None:
    so = extension(tmp_path / "ext", hip7)
    assert not checks.check_runtime_symbols(so, None, GFX942, tmp_path / "log", ENV).passed


def test_cpu_extension_has_nothing_to_prove(tmp_path: Path) -> None:
    (tmp_path / "c.c").write_text("int f(void){return 1;}\n")
    cc("-shared", "-fPIC", str(tmp_path / "c.c"), "-o", str(tmp_path / "c.so"))
    assert checks.check_runtime_symbols(tmp_path / "c.so", None, MATRIX.target("cpu"), tmp_path / "log", ENV).passed
