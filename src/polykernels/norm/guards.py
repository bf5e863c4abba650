"""Which implementation of a norm fusion runs, decided before the first launch.

The guard consults `polykernels.platform` capabilities and the input contract. The rule that
stops the seed bug: the inline-PTX specialization is chosen only when ``has_inline_ptx()``
is true, so on ROCm it is never compiled, let alone launched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Literal

import torch

from polykernels import platform
from polykernels.platform import Choice

MAX_D = 16384
PathName = Literal["ptx", "triton", "torch"]
Preference = Literal["auto", "portable"]
_preference: Preference = "auto"


@contextlib.contextmanager
def prefer(preference: Preference) -> Iterator[None]:
    """``prefer("portable")`` runs the portable Triton kernel even where PTX is allowed."""
    global _preference
    if preference not in ("auto", "portable"):
        raise ValueError(f"preference must be 'auto' or 'portable', got {preference!r}")
    previous, _preference = _preference, preference
    try:
        yield
    finally:
        _preference = previous


def preference() -> Preference:
    return _preference


def choose(device_type: str, dtype: torch.dtype, contiguous: bool, exact_epilogue: bool = True) -> Choice:
    """``Choice.path`` is one of ``PathName``."""
    seen = platform.current()
    if device_type != "cuda":
        return Choice("torch", f"{device_type} tensors run the pure-torch reference")
    if not seen.is_gpu:
        return Choice("torch", "torch reports no GPU")
    if not platform.has_triton():
        return Choice("torch", "triton is not installed")
    if not ptx_allowed():
        return Choice("triton", f"{seen.backend} {seen.arch}: inline PTX cannot compile here; portable Triton")
    if not exact_epilogue:
        return Choice("triton", "this op has no PTX specialization")
    if _preference == "portable":
        return Choice("triton", "portable path requested")
    if dtype not in (torch.float32, torch.float16, torch.bfloat16) or not contiguous:
        return Choice("triton", "input outside the PTX path's contract (dtype or layout)")
    return Choice("ptx", f"CUDA {seen.arch}: inline-PTX epilogue, bit-exact with eager fp32 rounding")


def ptx_allowed() -> bool:
    """Where the inline-PTX specialization may be compiled at all (the compile matrix asks this)."""
    return platform.has_inline_ptx()


def describe() -> dict[str, Choice]:
    """The path each op of the family takes here for a typical (bf16, contiguous) input."""
    device = "cuda" if platform.current().is_gpu else "cpu"
    return {op: choose(device, torch.bfloat16, contiguous=True, exact_epilogue=exact)
            for op, exact in (("layernorm_modulate", True), ("rmsnorm_scale_shift", True), ("qk_rmsnorm", False))}
