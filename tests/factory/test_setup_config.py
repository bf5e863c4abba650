"""setup.py's build configuration: every wrong setting is an error naming the variable to set."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def setup_module():
    spec = importlib.util.spec_from_file_location("polykernels_setup", ROOT / "setup.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)  # setup() runs only under __main__
    return module


def test_cpu_build_needs_no_toolkit(setup_module) -> None:
    build = setup_module.resolve_build({"POLYKERNELS_BACKEND": "cpu"})
    assert build.backend == "cpu" and build.archs == () and build.target_version_macro.endswith("0x020b000000000000")


def test_cuda_defaults_and_gencode_flags(setup_module, tmp_path: Path) -> None:
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text("#!/bin/sh\n")
    build = setup_module.resolve_build({"POLYKERNELS_BACKEND": "cuda", "CUDA_HOME": str(tmp_path)})
    assert build.archs == ("8.0", "9.0", "10.0", "12.0+PTX")
    flags = setup_module.nvcc_arch_flags(build.archs)
    assert "arch=compute_120,code=compute_120" in flags and "arch=compute_90,code=sm_90" in flags
    assert all("offload-arch" not in f for f in flags)


def test_rocm_targets_2_13_and_never_gets_nvcc_flags(setup_module, tmp_path: Path) -> None:
    build = setup_module.resolve_build({"POLYKERNELS_BACKEND": "rocm", "HIPCC": "/usr/bin/hipcc"})
    assert build.archs == ("gfx942", "gfx950") and build.target_version_macro.endswith("0x020d000000000000")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"POLYKERNELS_BACKEND": "cuda", "CUDA_HOME": "/nonexistent", "PATH": "/nonexistent"},
         r"nvcc was not found: set CUDA_HOME"),
        ({"POLYKERNELS_BACKEND": "rocm", "PATH": "/nonexistent"}, r"hipcc was not found: set HIPCC or ROCM_PATH"),
        ({"POLYKERNELS_BACKEND": "rocm", "HIPCC": "hipcc", "PYTORCH_ROCM_ARCH": "gfx942;gfx1234"},
         r"PYTORCH_ROCM_ARCH: unknown arch 'gfx1234'"),
        ({"POLYKERNELS_BACKEND": "tpu"}, r"POLYKERNELS_BACKEND: unknown backend 'tpu'"),
    ],
    ids=["no-nvcc", "no-hipcc", "bad-rocm-arch", "bad-backend"],
)
def test_bad_settings_name_the_variable(setup_module, env: dict, message: str) -> None:
    with pytest.raises(setup_module.BuildConfigError, match=message):
        setup_module.resolve_build(env)


def test_bad_cuda_arch_names_the_variable(setup_module) -> None:
    with pytest.raises(setup_module.BuildConfigError, match=r"TORCH_CUDA_ARCH_LIST: 'sm_90' is not a CUDA arch"):
        setup_module.parse_cuda_archs("8.0;sm_90")


def test_torch_sdk_without_stable_headers_is_refused(setup_module, tmp_path: Path) -> None:
    with pytest.raises(setup_module.BuildConfigError, match=r"POLYKERNELS_TORCH_SDK=.* holds no torch/csrc/stable"):
        setup_module.torch_paths({"POLYKERNELS_TORCH_SDK": str(tmp_path)})


def test_compiled_floor_follows_targets_toml(setup_module, tmp_path: Path) -> None:
    # targets.toml is the one home of the torch floor: move a target's floor there, and the
    # TORCH_TARGET_VERSION compiled into its extension moves with it (through the manifest the
    # factory hands setup.py), with no second table to forget.
    import json

    from polykernels_build import targets, wheels
    from polykernels_build.images import BuilderImage

    text = (ROOT / "targets.toml").read_text()
    edited = text.replace('variant = "cu130"', 'variant = "cu130"\nPLACEHOLDER', 1)
    cuda_table = edited.split("PLACEHOLDER")[0].rsplit("[target.cuda13]", 1)[1]
    assert 'torch_floor = "2.11"' in cuda_table
    (tmp_path / "targets.toml").write_text(text.replace(
        cuda_table, cuda_table.replace('torch_floor = "2.11"', 'torch_floor = "2.12"'), 1))
    target = targets.load(tmp_path / "targets.toml").target("cuda13")
    image = BuilderImage(target="cuda13", profile="offline", tag="t", image_id="sha256:0", base="b",
                         python="cp311", manylinux="2_28")
    info = wheels.build_info(target, image, None, False, 0, "http://127.0.0.1:8000")
    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\n")
    # The variables a plain `pip install .` reads lose to the manifest: one source of truth.
    build = setup_module.resolve_build({"POLYKERNELS_BUILD_INFO": json.dumps(info), "POLYKERNELS_BACKEND": "cpu",
                                        "TORCH_CUDA_ARCH_LIST": "7.5", "CUDA_HOME": str(tmp_path / "cuda")})
    assert build.backend == "cuda" and build.archs == target.archs
    assert build.target_version_macro == "-DTORCH_TARGET_VERSION=0x020c000000000000"
    assert info["index_url"] == "http://127.0.0.1:8000/cu130/simple"


def test_nvcc_on_path_with_a_cpu_torch_builds_for_cpu(setup_module, tmp_path: Path) -> None:
    # The build targets the backend of the torch it builds against, never just the compiler on PATH:
    # a CUDA extension next to a CPU torch needs a libcudart.so.13 nobody installed, and cannot load.
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text("#!/bin/sh\n")
    nvcc.chmod(0o755)
    env = {"PATH": f"{nvcc.parent}:/usr/bin", "CUDA_HOME": str(tmp_path)}
    assert setup_module.resolve_build(env, detect=lambda: "cpu").backend == "cpu"
    assert setup_module.resolve_build(env, detect=lambda: "cuda").backend == "cuda"
    assert setup_module.resolve_build({**env, "POLYKERNELS_BACKEND": "cuda"}, detect=lambda: "cpu").backend == "cuda"
    with pytest.raises(setup_module.BuildConfigError, match=r"torch is a cuda build but nvcc was not found"):
        setup_module.resolve_build({"PATH": "/nonexistent"}, detect=lambda: "cuda")


def test_this_hosts_cpu_torch_is_detected_as_cpu(setup_module) -> None:
    import os
    import shutil

    import torch

    assert torch.version.cuda is None and torch.version.hip is None  # the tests' torch is a CPU build
    env = {"PATH": os.environ.get("PATH", "")}
    assert setup_module.torch_backend() == "cpu"
    build = setup_module.resolve_build(env)
    assert build.backend == "cpu", f"nvcc at {shutil.which('nvcc')} must not decide the backend"

