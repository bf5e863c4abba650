"""Structural promises of the payload, each proven by a test that fails when the promise breaks."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from polykernels import platform

ROOT = Path(__file__).resolve().parents[2]
PAYLOAD = ROOT / "src" / "polykernels"
CAPABILITY_NAMES = {fn.__name__ for fn in platform.CAPABILITIES.values()} | {"ptx_allowed"}
_BOOLEAN_CONTEXTS = (ast.If, ast.IfExp, ast.While, ast.Assert)


def uncalled_capabilities(source: str) -> list[str]:
    """Places a capability function is tested for truth instead of called (always true)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        tests = []
        if isinstance(node, _BOOLEAN_CONTEXTS):
            tests.append(node.test)
        elif isinstance(node, ast.BoolOp):
            tests.extend(node.values)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            tests.append(node.operand)
        elif isinstance(node, ast.Compare):
            tests.extend([node.left, *node.comparators])
        for test in tests:
            name = test.attr if isinstance(test, ast.Attribute) else test.id if isinstance(test, ast.Name) else None
            if name in CAPABILITY_NAMES:
                found.append(f"line {test.lineno}: {name}")
    return found


def test_the_capability_check_catches_the_seed_bug() -> None:
    assert uncalled_capabilities("if platform.has_inline_ptx:\n    pass\n") == ["line 1: has_inline_ptx"]
    assert uncalled_capabilities("x = a and not has_tf32_dots\n")
    assert uncalled_capabilities("if platform.has_inline_ptx():\n    pass\n") == []


def test_every_capability_is_called_where_it_is_tested() -> None:
    offenders = {str(p.relative_to(ROOT)): found for p in sorted(PAYLOAD.rglob("*.py"))
                 if (found := uncalled_capabilities(p.read_text()))}
    assert not offenders, f"capabilities are functions: call them ({offenders})"


def test_guards_call_capabilities_whose_truth_value_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    # A guard that tests a capability function object for truth would hit __bool__ here.
    from polykernels import info

    class NotABool:
        def __init__(self, value: bool) -> None:
            self.value = value

        def __call__(self) -> bool:
            return self.value

        def __bool__(self) -> bool:
            raise AssertionError("a capability was tested for truth instead of called")

    seen = platform.Platform(backend="rocm", arch="gfx942", device_name="MI300X", warp_size=64, runtime_version="7")
    for name in ("has_inline_ptx", "has_tf32_dots", "has_triton"):
        monkeypatch.setattr(platform, name, NotABool(getattr(platform, name)()))
    with platform.use(seen):
        choices = info.op_choices()
    assert choices["layernorm_modulate"].path in ("triton", "torch")


def test_every_op_family_answers_with_one_choice_type() -> None:
    from polykernels import info

    choices = info.op_choices()
    assert {"fake_int4_quant", "chunk_gated_delta_rule", "layernorm_modulate", "qk_rmsnorm"} <= set(choices)
    assert all(type(c) is platform.Choice and c.reason for c in choices.values())


def test_families_register_their_own_kernels_without_an_import_cycle() -> None:
    code = ("import json; from polykernels import kernel_registry as k; "
            "print(json.dumps({n: s.module for n, s in k.kernels().items()}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    modules = json.loads(out)
    assert {"gdn_prepare", "layernorm_modulate_ptx", "qk_rmsnorm"} <= set(modules)
    from polykernels.kernel_registry import kernels

    ptx = kernels()["layernorm_modulate_ptx"]
    assert ptx.allowed_on("cuda:90") and not ptx.allowed_on("hip:gfx942")


def test_import_never_queries_the_device(tmp_path: Path) -> None:
    # `import polykernels` (a GPU wheel's manifest included) and every family import without
    # asking torch for a device: a process that imports polykernels can still fork CUDA workers.
    import shutil

    import polykernels

    package = tmp_path / "polykernels"
    shutil.copytree(Path(polykernels.__file__).parent, package)
    info = {"target": "cuda13", "variant": "cu130", "backend": "cuda", "archs": ["9.0"], "toolkit": "13.0",
            "torch_floor": "2.11", "index_url": "http://127.0.0.1:8000/cu130/simple"}
    (package / "_build_info.json").write_text(json.dumps(info))
    code = ("import torch\n"
            "def boom(*a, **k): raise SystemExit('the device was queried at import')\n"
            "torch.cuda.is_available = torch.cuda.get_device_properties = torch.cuda.init = boom\n"
            "import polykernels, polykernels.norm, polykernels.gated_delta_rule, polykernels.quant, polykernels.info\n"
            "print('ok', torch.cuda.is_initialized())\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["ok", "False"]


def test_csrc_never_spells_the_cuda_warp_mask() -> None:
    # The hipcc bug: __shfl_xor_sync(0xffffffff, ...) does not compile for AMD. Kernels use
    # portable.h's PK_SHFL_XOR32; only portable.h may spell the CUDA form, for CUDA.
    sources = [p for p in (ROOT / "csrc").rglob("*") if p.suffix in (".cu", ".cuh", ".h", ".hpp", ".cpp", ".hip")]
    assert sources, "no sources under csrc/: the scan would prove nothing"
    assert any(p.suffix in (".cu", ".cuh") for p in sources)
    offenders = [str(p.relative_to(ROOT)) for p in sources
                 if p.name != "portable.h" and ("__shfl_xor_sync" in p.read_text() or "__shfl_sync" in p.read_text())]
    assert not offenders, f"use PK_SHFL_XOR32 from polykernels/portable.h in {offenders}"


_FORK_WORKER = """
import multiprocessing as mp
import torch
import polykernels, polykernels.norm, polykernels.gated_delta_rule, polykernels.quant

def work(_):
    x = torch.ones(1024, device="cuda")
    return float((x * 2).sum())

if __name__ == "__main__":
    assert not torch.cuda.is_initialized(), "import polykernels initialized CUDA"
    with mp.get_context("fork").Pool(2) as pool:
        print(pool.map(work, range(2)))
"""


@pytest.mark.gpu
def test_a_process_that_imported_polykernels_can_fork_cuda_workers(gpu_device: str, tmp_path: Path) -> None:
    # CUDA cannot be re-initialized in a forked child: if `import polykernels` touched the GPU,
    # the workers would fail with "Cannot re-initialize CUDA in forked subprocess".
    script = tmp_path / "fork_after_import.py"
    script.write_text(_FORK_WORKER)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[2048.0, 2048.0]"


def test_fresh_allocations_are_nan_in_kernel_tests() -> None:
    # tests/unit/conftest.py: an output element no kernel wrote reads as NaN.
    assert torch.isnan(torch.empty(4)).all() and torch.isnan(torch.empty_like(torch.zeros(2))).all()
    assert torch.isnan(torch.zeros(1).new_empty(3)).all()
    assert torch.empty(2, dtype=torch.int32).shape == (2,)
