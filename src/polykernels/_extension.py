"""Loads the compiled extension (`_C.abi3.so`) once; says why when it cannot."""

from __future__ import annotations

import functools
from pathlib import Path


class ExtensionUnavailableError(RuntimeError):
    pass


@functools.cache
def _load() -> str | None:
    """Returns None on success, else the reason the extension is unavailable."""
    import torch

    candidates = sorted(Path(__file__).parent.glob("_C*.so"))
    if not candidates:
        return "polykernels was installed without its compiled extension (_C.abi3.so is missing)"
    try:
        torch.ops.load_library(str(candidates[0]))
    except OSError as exc:
        return f"loading {candidates[0].name} failed: {exc}"
    return None


def unavailable_reason() -> str | None:
    return _load()


def require() -> None:
    reason = _load()
    if reason is not None:
        raise ExtensionUnavailableError(
            f"{reason}. Reinstall a prebuilt wheel, or build from source with `pip install .`"
        )


def has_kernel(op: str, dispatch_key: str) -> bool:
    """Whether the extension registered a kernel for ``op`` under ``dispatch_key`` (CPU, CUDA)."""
    import torch

    if _load() is not None:
        return False
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"polykernels::{op}", dispatch_key)
