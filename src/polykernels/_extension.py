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
        return describe_load_failure(candidates[0].name, exc)
    return None


def describe_load_failure(name: str, exc: BaseException) -> str:
    """The dynamic loader's own message (torch wraps it as "Could not load this library" and keeps
    the reason in ``__cause__``), and what to do about the usual causes."""
    reasons = []
    error: BaseException | None = exc
    while error is not None:
        text = str(error).strip()
        if text and text not in reasons:
            reasons.append(text)
        error = error.__cause__ or error.__context__
    loader = reasons[-1] if reasons else type(exc).__name__
    if "libcudart" in loader or "libamdhip64" in loader:
        what = ("it was built for a GPU runtime this environment does not have (a source build picks the "
                "backend of the torch it builds against; set POLYKERNELS_BACKEND=cpu to force a CPU build), "
                "or install the GPU runtime / the wheel of your variant")
    elif "undefined symbol" in loader:
        what = ("it was built against a newer torch than the one installed: upgrade torch, or rebuild "
                "against this torch with `pip install --no-build-isolation .`")
    else:
        what = "reinstall a prebuilt wheel of your variant, or rebuild with `pip install --no-build-isolation .`"
    return f"loading {name} failed: {loader}; {what}"


def unavailable_reason() -> str | None:
    return _load()


def require() -> None:
    reason = _load()
    if reason is not None:
        raise ExtensionUnavailableError(
            reason if reason.startswith("loading ") else
            f"{reason}. Reinstall a prebuilt wheel, or build from source with `pip install .`"
        )


def has_kernel(op: str, dispatch_key: str) -> bool:
    """Whether the extension registered a kernel for ``op`` under ``dispatch_key`` (CPU, CUDA)."""
    import torch

    if _load() is not None:
        return False
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"polykernels::{op}", dispatch_key)
