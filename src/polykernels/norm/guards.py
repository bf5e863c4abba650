"""Which implementation of a norm fusion runs, decided before the first launch.

The guard consults `polykernels.platform` capabilities and the input contract. The rule that
stops the seed bug: the inline-PTX specialization is chosen only when ``has_inline_ptx()``
is true, so on ROCm it is never compiled, let alone launched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

import torch

from polykernels import platform

MAX_D = 16384
PathName = Literal["ptx", "triton", "torch"]
Preference = Literal["auto", "portable"]
_preference: Preference = "auto"


@dataclass(frozen=True)
class NormPath:
    path: PathName
    reason: str


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


def choose(device_type: str, dtype: torch.dtype, contiguous: bool, exact_epilogue: bool = True) -> NormPath:
    seen = platform.current()
    if device_type != "cuda":
        return NormPath("torch", f"{device_type} tensors run the pure-torch reference")
    if not seen.is_gpu:
        return NormPath("torch", "torch reports no GPU")
    if not platform.has_triton():
        return NormPath("torch", "triton is not installed")
    if not platform.has_inline_ptx():
        return NormPath("triton", f"{seen.backend} {seen.arch}: inline PTX cannot compile here; portable Triton")
    if not exact_epilogue:
        return NormPath("triton", "this op has no PTX specialization")
    if _preference == "portable":
        return NormPath("triton", "portable path requested")
    if dtype not in (torch.float32, torch.float16, torch.bfloat16) or not contiguous:
        return NormPath("triton", "input outside the PTX path's contract (dtype or layout)")
    return NormPath("ptx", f"CUDA {seen.arch}: inline-PTX epilogue, bit-exact with eager fp32 rounding")


def describe() -> dict[str, Callable[[], tuple[str, str]]]:
    device = "cuda" if platform.current().is_gpu else "cpu"

    def for_op(exact: bool) -> Callable[[], tuple[str, str]]:
        def run() -> tuple[str, str]:
            choice = choose(device, torch.bfloat16, contiguous=True, exact_epilogue=exact)
            return choice.path, choice.reason

        return run

    return {
        "layernorm_modulate": for_op(True),
        "rmsnorm_scale_shift": for_op(True),
        "qk_rmsnorm": for_op(False),
    }
