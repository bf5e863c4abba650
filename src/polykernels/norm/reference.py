"""Pure-torch references for the FLUX norm fusions: statistics in fp32, output in x's dtype.

Same signatures and argument order as the ops. `shift`/`scale` are [B, D], [B, 1, D] or
[B, L, D]; the [B, D] form is broadcast over tokens.
"""

from __future__ import annotations

import torch


def _per_token(mod: torch.Tensor) -> torch.Tensor:
    return mod[:, None, :] if mod.dim() == 2 else mod


def layernorm_modulate_reference(
    x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    xf = x.float()
    normed = torch.nn.functional.layer_norm(xf, (x.shape[-1],), eps=eps)
    return (normed * (1 + _per_token(scale).float()) + _per_token(shift).float()).to(x.dtype)


def rmsnorm_scale_shift_reference(
    x: torch.Tensor, weight: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return (normed * (1 + _per_token(scale).float()) + _per_token(shift).float()).to(x.dtype)


def rmsnorm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def qk_rmsnorm_reference(
    q: torch.Tensor, k: torch.Tensor, weight_q: torch.Tensor, weight_k: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    return rmsnorm_reference(q, weight_q, eps), rmsnorm_reference(k, weight_k, eps)
