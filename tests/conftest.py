"""Test options: GPU and Docker tests run only where those exist, and say so.

``--run-gpu``: tests marked ``gpu`` run (a CUDA or ROCm GPU must be present; they fail, not
skip, if it is not); those also marked ``two_gpus`` run where torch sees two GPUs. Without it,
Triton kernels are tested in the Triton interpreter on CPU.
``--run-docker``: tests marked ``docker`` run (they start containers; a missing engine fails).
"""

from __future__ import annotations

import os

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-gpu", action="store_true", help="run tests that need a CUDA/ROCm GPU")
    parser.addoption("--run-docker", action="store_true", help="run tests that need a Docker engine")


def pytest_configure(config: pytest.Config) -> None:
    if not config.getoption("--run-gpu"):
        # Must be set before triton.jit decorates any kernel: the kernels then run on CPU.
        os.environ["TRITON_INTERPRET"] = "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    run_gpu, run_docker = config.getoption("--run-gpu"), config.getoption("--run-docker")
    for item in items:
        if "gpu" in item.keywords and not run_gpu:
            item.add_marker(pytest.mark.skip(reason="needs a GPU: run with --run-gpu on a GPU machine"))
        if "docker" in item.keywords and not run_docker:
            item.add_marker(pytest.mark.skip(reason="needs a Docker engine: run with --run-docker"))
        if "gpu" not in item.keywords and run_gpu and "cpu_only" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="interpreter-only test; GPU run covers the compiled kernel"))
        if "two_gpus" in item.keywords and run_gpu and _gpu_count() < 2:
            item.add_marker(pytest.mark.skip(reason="needs two GPUs: run with --run-gpu where torch sees two"))


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


@pytest.fixture
def gpu_device() -> str:
    import torch

    if not torch.cuda.is_available():
        pytest.fail("--run-gpu was given but torch sees no GPU")
    return "cuda"

