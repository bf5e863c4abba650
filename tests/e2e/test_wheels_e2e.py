"""The factory end to end, in real containers (needs a Docker engine: run with --run-docker).

Every target's wheel builds in its offline builder image and passes its checks (device-code
coverage, the label check, stable-ABI symbols, the symbol-version proof against the GPU runtime
it links, loading with no Python torch against that runtime) and carries torch's
manylinux_2_28 tag, which `auditwheel show` confirms; the cpu wheel is then released:
gated in a clean runtime container, published to a static index, and pip-installed from that
index (file:// and HTTP) into fresh environments that run the suites.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from polykernels_build import cli, serve, targets
from polykernels_build.checks import AUDITWHEEL_CONSTRAINT

ROOT = Path(__file__).resolve().parents[2]
VERSION = re.search(r'__version__ = "([^"]+)"', (ROOT / "src/polykernels/_version.py").read_text()).group(1)
_LABELS = {"cpu": "+cpu", "cuda13": "+cu130", "rocm-gfx942": "+rocm7.2.gfx942", "rocm-gfx950": "+rocm7.2.gfx950"}
# The target PyPI serves ([release] pypi in targets.toml) is built without a local version label.
_PYPI = {name for name, t in targets.load(ROOT / "targets.toml").targets.items() if t.pypi}
EXPECTED_WHEELS = {
    name: f"polykernels-{VERSION}{'' if name in _PYPI else label}-cp310-abi3-manylinux_2_28_x86_64.whl"
    for name, label in _LABELS.items()
}
# The GPU runtime each target's extension must need (DT_NEEDED), and be loaded against.
EXPECTED_RUNTIME = {"cpu": None, "cuda13": "libcudart.so.13", "rocm-gfx942": "libamdhip64.so.7",
                    "rocm-gfx950": "libamdhip64.so.7"}

pytestmark = pytest.mark.docker


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


@pytest.mark.parametrize("target", list(EXPECTED_WHEELS))
def test_every_target_builds_and_passes_its_checks(target: str) -> None:
    import os

    assert cli.main(["wheel", "--target", target, "--profile", "offline"], env=os.environ) == 0
    wheels = sorted(p.name for p in (ROOT / "build/dist" / target).glob("*.whl"))
    assert wheels == [EXPECTED_WHEELS[target]]
    checks = json.loads(next((ROOT / "build/dist" / target).glob("*.checks.json")).read_text())
    assert {c["name"]: c["passed"] for c in checks} == {
        "manifest": True, "size": True, "floor": True, "coverage": True, "label": True, "symbols": True,
        "runtime-symbols": True, "loads": True}
    by_name = {c["name"]: c["detail"] for c in checks}
    runtime = EXPECTED_RUNTIME[target]
    wheel = next((ROOT / "build/dist" / target).glob("*.whl"))
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        manifest = json.loads(archive.read("polykernels/_build_info.json"))
        so = Path(archive.extract(next(n for n in archive.namelist() if n.endswith("_C.abi3.so")),
                                  wheel.parent / "e2e-unpacked"))
    needed = subprocess.run(["readelf", "-d", "-W", str(so)], capture_output=True, text=True, check=True).stdout
    if runtime:
        assert f"Shared library: [{runtime}]" in needed
        assert manifest["runtime"]["soname"] == runtime
        assert runtime in by_name["loads"]  # the process that ran the CPU kernel had mapped that runtime
    else:
        assert "libamdhip64" not in needed and "libcudart" not in needed and manifest["runtime"] is None
    assert "deviations" not in manifest and manifest["manylinux"] == "manylinux_2_28_x86_64"
    # The builder's Debian packages, each with the exact version dpkg installed.
    packages = manifest["debian_packages"]
    assert {"g++", "python3", "ccache"} <= set(packages) and all(v and v[0].isdigit() for v in packages.values())
    shown = subprocess.run([sys.executable, "-m", "auditwheel", "show", str(wheel)], capture_output=True,
                           text=True, check=False)
    constraint = AUDITWHEEL_CONSTRAINT.search(" ".join(shown.stdout.split()))
    assert constraint and (int(constraint.group(1)), int(constraint.group(2))) <= (2, 28), shown.stdout + shown.stderr


def layered_venv(path: Path) -> Path:
    """A fresh venv that sees this test's torch (through a .pth), like a user's existing environment."""
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    python = path / "bin" / "python"
    site_dir = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                              capture_output=True, text=True, check=True).stdout.strip()
    import site

    (Path(site_dir) / "host.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return python


def test_cpu_release_then_install_from_the_index(tmp_path: Path) -> None:
    import os

    index_root = tmp_path / "index"
    assert cli.main(["release", "--target", "cpu", "--profile", "offline", "--index", str(index_root)],
                    env=os.environ) == 0
    simple = index_root / "cpu" / "simple"
    assert (simple / "polykernels" / "index.json").exists()

    python = layered_venv(tmp_path / "user")
    subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "--index-url",
                    simple.as_uri(), "polykernels"], check=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([str(python), "-m", "polykernels.suites", "--report", str(tmp_path / "r.json")],
                         cwd=elsewhere, env=env, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["package_path"].startswith(str(tmp_path / "user"))  # the installed wheel, not src/
    assert report["build_info"]["target"] == "cpu"

    server = serve.make_server(index_root, 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        python_http = layered_venv(tmp_path / "user-http")
        url = f"http://127.0.0.1:{server.server_address[1]}/cpu/simple"
        subprocess.run([str(python_http), "-m", "pip", "install", "--disable-pip-version-check", "--index-url",
                        url, "polykernels"], check=True)
        info = subprocess.run([str(python_http), "-m", "polykernels", "info", "--json"], cwd=elsewhere, env=env,
                              capture_output=True, text=True, check=True)
        build = json.loads(info.stdout)["build"]
        assert build["variant"] == "cpu"
        assert build["index_url"] == "http://127.0.0.1:8000/cpu/simple"  # targets.toml's default root
    finally:
        server.shutdown()
        server.server_close()

    # Releasing the same commit again rebuilds the same bytes: publishing them is a no-op.
    assert cli.main(["release", "--target", "cpu", "--profile", "offline", "--index", str(index_root)],
                    env=os.environ) == 0


@pytest.fixture(scope="module")
def rocm_builder() -> str:
    import os

    previous = os.getcwd()
    os.chdir(ROOT)
    try:
        assert cli.main(["images", "--target", "rocm-gfx942", "--profile", "offline"], env=os.environ) == 0
    finally:
        os.chdir(previous)
    return "polykernels-builder:rocm-sid-rocm7"


def test_the_rocm_builder_is_the_hip_7_2_toolchain(rocm_builder: str) -> None:
    # The hipcc the wheels and the tests below use: HIP 7.2 on its clang, the ROCm 7 runtime only.
    result = subprocess.run(["docker", "run", "--rm", "--pull=never", rocm_builder, "sh", "-c",
                             "hipcc --version; ls /usr/lib/x86_64-linux-gnu/ | grep libamdhip64"],
                            capture_output=True, text=True, check=True)
    assert "HIP version: 7.2." in result.stdout, result.stdout
    assert "libamdhip64.so.7" in result.stdout and "libamdhip64.so.6" not in result.stdout


def test_every_gpu_source_compiles_with_hipcc_for_both_gfx_archs(rocm_builder: str) -> None:
    # The warp-shuffle portability of csrc/: every GPU source under it, compiled by hipcc for
    # gfx942 and gfx950 together (an empty glob proves nothing, so it fails). Each source that
    # launches kernels of its own (<<<...>>>) carries code for both archs; one that launches only
    # Triton's compiled kernels (launch/program.cu, launch/direct_launch.cu) carries none.
    sources = sorted(str(p.relative_to(ROOT / "csrc")) for p in (ROOT / "csrc").rglob("*.cu"))
    with_kernels = [src for src in sources if "<<<" in (ROOT / "csrc" / src).read_text()]
    assert sources and with_kernels, "no .cu sources (or none defining a kernel) under csrc/"
    compiles = " && ".join(
        f"hipcc -x hip -c /csrc/{src} -o /tmp/k{i}.o -std=c++20 -fPIC -I/csrc/include -I/csrc "
        "-I/opt/torch-sdk/torch/include -DUSE_ROCM=1 -DTORCH_TARGET_VERSION=0x020d000000000000 "
        f"--offload-arch=gfx942 --offload-arch=gfx950 && (cd /tmp && llvm-objdump --offloading k{i}.o)"
        for i, src in enumerate(sources))
    result = subprocess.run(
        ["docker", "run", "--rm", "--pull=never", "-v", f"{ROOT / 'csrc'}:/csrc:ro", rocm_builder, "sh", "-c",
         compiles], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert result.stdout.count("gfx942") >= len(with_kernels) and result.stdout.count("gfx950") >= len(with_kernels)


def test_cuda_warp_mask_would_break_hipcc(rocm_builder: str) -> None:
    # The seed bug, reproduced: a full 32-bit mask to __shfl_xor_sync does not compile under hipcc;
    # portable.h's PK_SHFL_XOR32 exists so that no kernel of ours ever spells it.
    source = ("#include <hip/hip_runtime.h>\n__global__ void k(float* x) {"
              " x[0] = __shfl_xor_sync(0xffffffff, x[0], 1, 32); }\n")
    result = subprocess.run(
        ["docker", "run", "--rm", "--pull=never", "-i", rocm_builder, "sh", "-c",
         "cat > /tmp/bad.hip && hipcc -c /tmp/bad.hip -o /tmp/bad.o --offload-arch=gfx942"],
        input=source, capture_output=True, text=True, check=False)
    assert result.returncode != 0
    # tests/unit/test_payload_structure.py scans every csrc source for the CUDA spelling.


# The hardware facts the payload's guards encode, re-proven with the hipcc the ROCm wheels are
# built with: gfx942 has XF32 (TF32) matrix instructions and gfx950 has none, which is why the
# GDN kernels fall back to three bf16 passes there (platform.has_tf32_dots); and no AMD target
# has NVIDIA's `f` register constraint, which is why inline PTX is guarded to CUDA
# (platform.has_inline_ptx). Each guard must say exactly what the compiler says.
XF32_DOT = """#include <hip/hip_runtime.h>
typedef float v2f __attribute__((ext_vector_type(2)));
typedef float v4f __attribute__((ext_vector_type(4)));
__global__ void k(const v2f* a, const v2f* b, v4f* c) {
  c[threadIdx.x] = __builtin_amdgcn_mfma_f32_16x16x8_xf32(a[threadIdx.x], b[threadIdx.x], c[threadIdx.x], 0, 0, 0);
}
"""
INLINE_PTX = """#include <hip/hip_runtime.h>
__global__ void k(float* x) { float y; asm("cvt.rn.f32.f32 %0, %1;" : "=f"(y) : "f"(x[0])); x[0] = y; }
"""
ROCM_ARCHS = sorted({a for t in targets.load(ROOT / "targets.toml").targets.values() if t.backend == "rocm"
                     for a in t.archs})


def hipcc_compiles(builder: str, source: str, arch: str) -> tuple[bool, str]:
    result = subprocess.run(
        ["docker", "run", "--rm", "--pull=never", "-i", builder, "sh", "-c",
         f"cat > /tmp/k.hip && hipcc -c /tmp/k.hip -o /tmp/k.o --offload-arch={arch}"],
        input=source, capture_output=True, text=True, check=False)
    return result.returncode == 0, result.stdout[-1500:] + result.stderr[-1500:]


@pytest.mark.parametrize("arch", ROCM_ARCHS)
def test_tf32_guard_matches_hipcc(rocm_builder: str, arch: str) -> None:
    from polykernels import platform

    compiled, output = hipcc_compiles(rocm_builder, XF32_DOT, arch)
    with platform.use(platform.for_triton_target(f"hip:{arch}")):
        assert platform.has_tf32_dots() == compiled, output
    if not compiled:
        assert "Cannot select: intrinsic %llvm.amdgcn.mfma.f32.16x16x8.xf32" in output


@pytest.mark.parametrize("arch", ROCM_ARCHS)
def test_inline_ptx_guard_matches_hipcc(rocm_builder: str, arch: str) -> None:
    from polykernels import platform

    compiled, output = hipcc_compiles(rocm_builder, INLINE_PTX, arch)
    with platform.use(platform.for_triton_target(f"hip:{arch}")):
        assert platform.has_inline_ptx() == compiled, output
    assert "invalid output constraint '=f'" in output
