"""Shared test helpers."""

from __future__ import annotations

import torch


def relative_rms_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """RMS(actual - expected) / RMS(expected), the spec's error measure."""
    diff = (actual.double() - expected.double()).pow(2).mean().sqrt()
    return float(diff / expected.double().pow(2).mean().sqrt().clamp_min(1e-30))


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a tensor, so NaN compares equal to the same NaN."""
    if t.dtype == torch.float32:
        return t.view(torch.int32)
    if t.dtype in (torch.float16, torch.bfloat16):
        return t.view(torch.int16)
    return t


def boundaries(lengths: list[int], device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """Packed sequences' ``cu_seqlens`` from their lengths (int64, as torch makes them, unless told)."""
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device=device, dtype=dtype)
