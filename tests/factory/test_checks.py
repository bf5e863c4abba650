from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from polykernels_build import backends, checks, targets
from polykernels_build.dist import Wheel

ROOT = Path(__file__).resolve().parents[2]
MATRIX = targets.load(ROOT / "targets.toml")
ENV = {"PATH": os.environ["PATH"]}


def expected(name: str) -> set[str]:
    target = MATRIX.target(name)
    return backends.get(target.backend).expected_device_code(target.archs)


def test_expected_device_code_per_target() -> None:
    assert expected("cuda13") == {"sm_80", "sm_90", "sm_100", "sm_120", "compute_120"}
    assert expected("rocm-gfx950") == {"gfx950"}
    assert expected("cpu") == set()


def test_every_backend_satisfies_the_protocol() -> None:
    # Adding a backend is one class in backends.py: it must answer everything the factory asks.
    members = [name for name in backends.Backend.__dict__ if not name.startswith("_")]
    members += list(backends.Backend.__annotations__)
    for backend in backends.BACKENDS.values():
        missing = [m for m in members if not hasattr(backend, m)]
        assert not missing, (backend.name, missing)
    assert {t.backend for t in MATRIX.targets.values()} <= set(backends.BACKENDS)


@pytest.fixture(scope="module")
def torch_sdk() -> Path:
    import torch

    return Path(torch.__file__).parent


def build_so(tmp_path: Path, body: str) -> Path:
    if shutil.which("cc") is None:
        pytest.fail("these tests compile a tiny shared library: a C compiler is needed")
    source = tmp_path / "probe.c"
    source.write_text(body)
    so = tmp_path / "probe.so"
    subprocess.run(["cc", "-shared", "-fPIC", str(source), "-o", str(so)], check=True)
    return so


def test_symbols_stable_abi_passes(tmp_path: Path, torch_sdk: Path) -> None:
    so = build_so(tmp_path, "extern int aoti_torch_dtype_float32(void);\n"
                            "int f(void){return aoti_torch_dtype_float32();}")
    result = checks.check_symbols(so, MATRIX.target("cpu"), torch_sdk, tmp_path / "log", ENV)
    assert result.passed, result.detail


def test_symbols_unstable_cpp_abi_fails(tmp_path: Path, torch_sdk: Path) -> None:
    # A mangled c10 symbol: exactly what becomes `undefined symbol` under another torch.
    so = build_so(tmp_path, "extern int _ZN3c1019UndefinedTensorImpl10_singletonE;\n"
                            "int f(void){return _ZN3c1019UndefinedTensorImpl10_singletonE;}")
    result = checks.check_symbols(so, MATRIX.target("cpu"), torch_sdk, tmp_path / "log", ENV)
    assert not result.passed and "_ZN3c1019UndefinedTensorImpl10_singletonE" in result.detail


def test_symbols_gpu_runtime_allowed_only_for_its_backend(tmp_path: Path, torch_sdk: Path) -> None:
    so = build_so(tmp_path, "extern int hipGetLastError(void);\nint f(void){return hipGetLastError();}")
    assert checks.check_symbols(so, MATRIX.target("rocm-gfx942"), torch_sdk, tmp_path / "log", ENV).passed
    assert not checks.check_symbols(so, MATRIX.target("cuda13"), torch_sdk, tmp_path / "log", ENV).passed


def test_symbols_of_pythons_limited_api_pass(tmp_path: Path, torch_sdk: Path) -> None:
    # What the extension's module half uses: limited-API calls, and the inline Py_DECREF's _Py_Dealloc.
    so = build_so(tmp_path, "extern void* PyCapsule_New(void*, const char*, void*);\n"
                            "extern void _Py_Dealloc(void*);\n"
                            "void* f(void* p){_Py_Dealloc(p); return PyCapsule_New(p, 0, 0);}")
    result = checks.check_symbols(so, MATRIX.target("cuda13"), torch_sdk, tmp_path / "log", ENV)
    assert result.passed and "2 of Python's limited API" in result.detail, result.detail


def test_symbols_outside_pythons_limited_api_fail(tmp_path: Path, torch_sdk: Path) -> None:
    # A CPython internal the limited headers do not declare: it breaks the abi3 promise.
    so = build_so(tmp_path, "extern void* _PyObject_GetDictPtr(void*);\n"
                            "void* f(void* p){return _PyObject_GetDictPtr(p);}")
    result = checks.check_symbols(so, MATRIX.target("cpu"), torch_sdk, tmp_path / "log", ENV)
    assert not result.passed and "_PyObject_GetDictPtr" in result.detail


def test_size_budget(tmp_path: Path) -> None:
    path = tmp_path / "big.whl"
    path.write_bytes(b"0" * (3 * 2**20))
    wheel = Wheel(path=path, sha256="", manifest={})
    assert not checks.check_size(wheel, MATRIX.target("cpu")).passed
    assert checks.check_size(wheel, MATRIX.target("cuda13")).passed


def test_manifest_check_catches_a_mislabelled_wheel(tmp_path: Path) -> None:
    from tests.factory.helpers import make_wheel

    good = make_wheel(tmp_path / "a", target="cpu", variant="cpu")
    assert checks.check_manifest(good, MATRIX.target("cpu")).passed
    wrong = make_wheel(tmp_path / "b", target="cuda13", variant="cu130")
    result = checks.check_manifest(wrong, MATRIX.target("cpu"))
    assert not result.passed and "target" in result.detail and "version label" in result.detail


def _compiled_row(kernel: str, target: str, **resources: int) -> dict:
    """A compile matrix row of a kernel that compiled where its guard allows it."""
    return {"kernel": kernel, "target": target, "compiled": True, "allowed": True, "consistent": True,
            "resources": {"shared_bytes": 1024, **resources}}


def test_compile_matrix_fails_kernels_whose_products_ptxas_serializes() -> None:
    from polykernels_build.compile_matrix import MatrixResult

    result = MatrixResult(rows=[
        _compiled_row("a_hopper", "cuda:90", registers=232, spill_bytes=0, serialized_products=1),
        _compiled_row("b_hopper", "cuda:90", registers=168, spill_bytes=0, serialized_products=0),
    ])
    assert not result.consistent and result.serialized == ["a_hopper@cuda:90"]
    assert result.summary.endswith("TENSOR-CORE PRODUCTS SERIALIZED by ptxas: ['a_hopper@cuda:90']")


def test_compile_matrix_reports_spilling_kernels_without_failing() -> None:
    from polykernels_build.compile_matrix import MatrixResult

    result = MatrixResult(rows=[
        _compiled_row("a", "cuda:90", registers=255, spill_bytes=4008),
        _compiled_row("a", "hip:gfx942", registers=128, spill_bytes=0),
        {"kernel": "b_ptx", "target": "hip:gfx942", "compiled": False, "allowed": False, "consistent": True},
    ])
    assert result.consistent and result.spilling == ["a@cuda:90"]
    assert result.summary == ("3 compiles, 1 guarded off as expected; 1 spill registers (see compile-matrix.json): "
                              "a@cuda:90")


def test_compile_matrix_names_kernels_that_spill_inside_a_loop() -> None:
    from polykernels_build.compile_matrix import MatrixResult

    result = MatrixResult(rows=[
        _compiled_row("once", "cuda:90", registers=255, spill_bytes=320, loop_spill_instructions=0),
        _compiled_row("per_chunk", "cuda:90", registers=255, spill_bytes=144, loop_spill_instructions=5),
    ])
    assert result.consistent and result.spilling_in_loops == ["per_chunk@cuda:90"]
    assert result.summary.endswith("; inside a loop: per_chunk@cuda:90")
