from __future__ import annotations

from types import SimpleNamespace

import pytest

from polykernels import platform


def fake_torch(*, hip: str | None, cuda: str | None, available: bool, **props: object) -> SimpleNamespace:
    device = SimpleNamespace(**props)
    return SimpleNamespace(
        version=SimpleNamespace(hip=hip, cuda=cuda),
        cuda=SimpleNamespace(is_available=lambda: available, get_device_properties=lambda index: device),
    )


H100 = fake_torch(hip=None, cuda="13.0", available=True, name="NVIDIA H100", major=9, minor=0, warp_size=32)
MI300X = fake_torch(hip="7.0.1", cuda=None, available=True, name="AMD Instinct MI300X",
                    gcnArchName="gfx942:sramecc+:xnack-", warp_size=64, major=9, minor=4)
MI355X = fake_torch(hip="7.0.1", cuda=None, available=True, name="AMD Instinct MI355X",
                    gcnArchName="gfx950:sramecc+:xnack-", warp_size=64, major=9, minor=5)
CPU_ONLY = fake_torch(hip=None, cuda=None, available=False)

EXPECTED = {  # torch, backend, arch, warp size, inline PTX, TF32 dots
    "H100": (H100, "cuda", "sm_90", 32, True, True),
    "MI300X": (MI300X, "rocm", "gfx942", 64, False, True),
    "MI355X": (MI355X, "rocm", "gfx950", 64, False, False),
    "CPU": (CPU_ONLY, "cpu", None, 1, False, False),
}


@pytest.mark.parametrize("name", EXPECTED)
def test_detect_and_capabilities(name: str) -> None:
    torch_module, backend, arch, warp, inline_ptx, tf32 = EXPECTED[name]
    seen = platform.detect(torch_module)
    assert (seen.backend, seen.arch, seen.warp_size) == (backend, arch, warp)
    with platform.use(seen):
        assert platform.backend() == backend
        assert platform.arch() == arch
        assert platform.warp_size() == warp
        assert platform.has_inline_ptx() is inline_ptx
        assert platform.has_tf32_dots() is tf32
        for capability in platform.CAPABILITIES.values():
            assert isinstance(capability(), bool)
        assert platform.has_triton_gpu() is (backend != "cpu")


def test_use_restores_previous_platform() -> None:
    before = platform.current()
    with platform.use(platform.detect(MI300X)):
        assert platform.backend() == "rocm"
    assert platform.current() == before


def test_capabilities_are_functions_not_constants() -> None:
    # The seed bug class: `if platform.has_inline_ptx:` is always true. Capabilities must be
    # called; a function object is never a valid capability value.
    for name, capability in platform.CAPABILITIES.items():
        assert callable(capability), name


def test_import_touches_no_vendor_module() -> None:
    import subprocess
    import sys

    code = (
        "import sys, polykernels.platform, torch; "
        "print(any(m.startswith('triton') for m in sys.modules), torch.cuda.is_initialized())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_dram_bandwidth_is_not_known_off_cuda() -> None:
    import torch

    assert platform.dram_gbps(torch.device("cpu")) is None


@pytest.mark.gpu
def test_gpu_dram_bandwidth_places_the_measured_hoppers_either_side_of_the_plans_line(gpu_device: str) -> None:
    # launch.HOPPER_CONCURRENT_WARP_BLOCKS_GBPS lies between the H100 (3.35 TB/s) and the H200 (4.8) measured.
    import torch

    from polykernels.gated_delta_rule.launch import HOPPER_CONCURRENT_WARP_BLOCKS_GBPS

    device = torch.device(gpu_device)
    gbps = platform.dram_gbps(device)
    assert gbps is not None and 100 < gbps < 20_000, gbps
    name = torch.cuda.get_device_name(device)
    if "H200" in name:
        assert gbps >= HOPPER_CONCURRENT_WARP_BLOCKS_GBPS, (name, gbps)
    elif "H100" in name and "HBM3" in name:  # the SXM part measured (H100 NVL and PCIe differ)
        assert gbps < HOPPER_CONCURRENT_WARP_BLOCKS_GBPS, (name, gbps)
