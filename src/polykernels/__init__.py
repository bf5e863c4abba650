"""polykernels: GPU kernels that install and run on AMD ROCm and NVIDIA CUDA.

Families: ``polykernels.gated_delta_rule`` (Qwen3-Next linear attention), ``polykernels.norm``
(FLUX norm fusions) and ``polykernels.quant`` (INT4 QAT fake quantization).
"""

from __future__ import annotations

from polykernels._version import __version__


def _check_installed_wheel() -> None:
    import torch

    from polykernels import _manifest, platform

    info = _manifest.load_build_info()
    if info is None:
        return
    if info.backend == "cpu":
        seen = platform.Platform(backend="cpu", arch=None, device_name=None, warp_size=1, runtime_version=None)
    else:
        seen = platform.current()
    _manifest.check(info, seen, torch.__version__)


_check_installed_wheel()

__all__ = ["__version__"]
