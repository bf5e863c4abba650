"""polykernels: GPU kernels that install and run on AMD ROCm and NVIDIA CUDA.

Families: ``polykernels.gated_delta_rule`` (Qwen3-Next linear attention), ``polykernels.norm``
(FLUX norm fusions) and ``polykernels.quant`` (INT4 QAT fake quantization).
"""

from __future__ import annotations

from polykernels._version import __version__


def _check_installed_wheel() -> None:
    """The import-time check: torch version and vendor, from ``torch.version`` alone. It touches no
    GPU (fork-based workers started later keep working); the device's arch is checked when a guard
    first asks for the platform, before the first launch, and by `polykernels info`."""
    import torch

    from polykernels import _manifest, platform

    info = _manifest.load_build_info()
    if info is None:
        return
    _manifest.check(info, platform.compiled_for(), torch.__version__)


_check_installed_wheel()

__all__ = ["__version__"]
