"""Pure-torch INT4 fake quantization: the oracle the C++ kernels must match bit for bit."""

from __future__ import annotations

import torch

# fp32(1/7), fp32(1/15), fp32(1e-5) as bits, exactly as csrc/int4_qat/int4_math.h spells them.
_INV7_BITS = 0x3E124925
_INV15_BITS = 0x3D888889
_MIN_SCALE_BITS = 0x3727C5AC


def _fp32_constant(bits: int, device: torch.device) -> torch.Tensor:
    # Filled on the device, not copied from the host: the reference stays capturable in a CUDA graph.
    return torch.full((1,), bits, dtype=torch.int32, device=device).view(torch.float32)[0]


def fake_int4_quant_reference(
    x: torch.Tensor, group_size: int = 128, symmetric: bool = True, return_codes: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out or int8 codes, scale fp32, zero int8), groups along the last dim, as the spec defines."""
    *lead, n = x.shape
    groups = x.float().reshape(*lead, n // group_size, group_size)
    device = x.device
    min_scale = _fp32_constant(_MIN_SCALE_BITS, device)
    non_finite = (~torch.isfinite(groups)).any(dim=-1)
    if symmetric:
        scale = torch.maximum(groups.abs().amax(dim=-1) * _fp32_constant(_INV7_BITS, device), min_scale)
        zero = torch.zeros_like(scale)
        codes = torch.round(groups / scale[..., None]).clamp(-7, 7)
    else:
        lo, hi = groups.amin(dim=-1), groups.amax(dim=-1)
        scale = torch.maximum((hi - lo) * _fp32_constant(_INV15_BITS, device), min_scale)
        zero = torch.round(-lo / scale).clamp(0, 15)
        zero = torch.where(non_finite, torch.zeros_like(zero), zero)
        codes = (torch.round(groups / scale[..., None]) + zero[..., None]).clamp(0, 15)
    scale = torch.where(non_finite, torch.full_like(scale, float("nan")), scale)
    zero_i8 = torch.where(non_finite, torch.zeros_like(zero), zero).to(torch.int8)
    if return_codes:
        codes = torch.where(non_finite[..., None], torch.zeros_like(codes), codes)
        return codes.to(torch.int8).reshape(x.shape), scale, zero_i8
    out = (codes - zero[..., None]) * scale[..., None]
    out = torch.where(non_finite[..., None], torch.full_like(out, float("nan")), out)
    return out.reshape(x.shape).to(x.dtype), scale, zero_i8
