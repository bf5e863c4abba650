"""The label check and the symbol-version proof, on small ELF fixtures built here with cc and ld
version scripts: a stand-in HIP runtime (SONAME libamdhip64.so.N, version node hip_4.2) and an
extension linked against it, so each check can be made to fail for exactly the bug it names."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from polykernels_build import checks, targets
from polykernels_build.dist import Wheel

ROOT = Path(__file__).resolve().parents[2]
MATRIX = targets.load(ROOT / "targets.toml")
ENV = {"PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
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


def floor_wheel(directory: Path, sources: list[Path], tag: str = "manylinux_2_28_x86_64") -> Wheel:
    """A wheel holding one extension compiled here from ``sources``, promising ``tag``."""
    directory.mkdir(parents=True, exist_ok=True)
    so = directory / "_C.abi3.so"
    compiler = "c++" if any(s.suffix == ".cpp" for s in sources) else "cc"
    if shutil.which(compiler) is None:
        pytest.fail(f"these tests compile a tiny extension: {compiler} is needed")
    subprocess.run([compiler, "-shared", "-fPIC", "-O2", *map(str, sources), "-o", str(so)], check=True)
    name = f"polykernels-0.1.0+cpu-cp310-abi3-{tag}.whl"
    manifest = {"target": "cpu", "variant": "cpu", "manylinux": tag}
    dist_info = "polykernels-0.1.0+cpu.dist-info"
    with zipfile.ZipFile(directory / name, "w") as archive:
        archive.write(so, "polykernels/_C.abi3.so")
        archive.writestr("polykernels/_build_info.json", json.dumps(manifest))
        archive.writestr(f"{dist_info}/METADATA", "Metadata-Version: 2.4\nName: polykernels\nVersion: 0.1.0+cpu\n")
        archive.writestr(f"{dist_info}/WHEEL", f"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: false\n"
                                               f"Tag: cp310-abi3-{tag}\n")
        # auditwheel finds the files to read through RECORD.
        archive.writestr(f"{dist_info}/RECORD", "".join(f"{n},,\n" for n in (
            "polykernels/_C.abi3.so", "polykernels/_build_info.json", f"{dist_info}/METADATA", f"{dist_info}/WHEEL",
            f"{dist_info}/RECORD")))
    return Wheel.open(directory / name)


# libstdc++ >= 11 on glibc >= 2.32 reads this in every reference count: the symbol that made our
# wheels manylinux_2_34 (the build hosts here have glibc 2.36).
READS_SINGLE_THREADED = ("#include <stdlib.h>\nextern char __libc_single_threaded;\n"
                         "int polykernels_probe(void){return __libc_single_threaded + (getenv(\"X\") != 0);}\n")
OLD_SYMBOLS_ONLY = "#include <stdlib.h>\nint polykernels_probe(void){return getenv(\"X\") != 0;}\n"


def test_floor_passes_for_old_symbols_only(tmp_path: Path) -> None:
    (tmp_path / "ok.c").write_text(OLD_SYMBOLS_ONLY)
    result = checks.check_floor(floor_wheel(tmp_path / "w", [tmp_path / "ok.c"]), tmp_path / "log", ENV)
    assert result.passed, result.detail


def test_floor_fails_for_libc_single_threaded(tmp_path: Path) -> None:
    (tmp_path / "st.c").write_text(READS_SINGLE_THREADED)
    result = checks.check_floor(floor_wheel(tmp_path / "w", [tmp_path / "st.c"]), tmp_path / "log", ENV)
    assert not result.passed and "past the promised manylinux_2_28_x86_64" in result.detail


def test_the_compat_definition_brings_the_floor_back_to_2_28(tmp_path: Path) -> None:
    # csrc/compat/glibc_2_28.cpp binds the read inside the extension: nothing past glibc 2.28 is imported.
    (tmp_path / "st.c").write_text(READS_SINGLE_THREADED)
    wheel = floor_wheel(tmp_path / "w", [tmp_path / "st.c", ROOT / "csrc" / "compat" / "glibc_2_28.cpp"])
    result = checks.check_floor(wheel, tmp_path / "log", ENV)
    assert result.passed, result.detail
    out = subprocess.run(["nm", "-D", "--undefined-only", str(tmp_path / "w" / "_C.abi3.so")], capture_output=True,
                         text=True, check=True).stdout
    assert "__libc_single_threaded" not in out


def test_floor_fails_for_a_wheel_not_tagged_as_promised(tmp_path: Path) -> None:
    (tmp_path / "ok.c").write_text(OLD_SYMBOLS_ONLY)
    wheel = floor_wheel(tmp_path / "w", [tmp_path / "ok.c"], tag="manylinux_2_34_x86_64")
    wheel = Wheel(path=wheel.path, sha256=wheel.sha256,
                  manifest={**wheel.manifest, "manylinux": "manylinux_2_28_x86_64"})
    result = checks.check_floor(wheel, tmp_path / "log", ENV)
    assert not result.passed and "is not tagged manylinux_2_28_x86_64" in result.detail
