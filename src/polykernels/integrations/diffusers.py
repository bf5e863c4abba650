"""Put polykernels' norm fusions into a diffusers FLUX transformer instance.

Swapped per instance (``Patch.restore()`` undoes it): the LayerNorm + modulation of
``AdaLayerNormZero``, ``AdaLayerNormZeroSingle`` and ``AdaLayerNormContinuous`` (when their
LayerNorm has no affine, as in FLUX), and the attention q/k ``RMSNorm`` modules.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from polykernels.integrations._patching import Patch
from polykernels.norm import head_rmsnorm, layernorm_modulate

SUPPORTED_CLASSES = ("FluxTransformer2DModel",)


def _plain_layernorm(norm: Any) -> bool:
    return isinstance(norm, torch.nn.LayerNorm) and norm.weight is None and norm.bias is None


def _ada_zero_forward(self: Any, x: torch.Tensor, timestep: Any = None, class_labels: Any = None,
                      hidden_dtype: Any = None, emb: torch.Tensor | None = None) -> tuple:
    if self.emb is not None:
        emb = self.emb(timestep, class_labels, hidden_dtype=hidden_dtype)
    emb = self.linear(self.silu(emb))
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = emb.chunk(6, dim=1)
    x = layernorm_modulate(x.contiguous(), shift_msa, scale_msa, self.norm.eps)
    return x, gate_msa, shift_mlp, scale_mlp, gate_mlp


def _ada_zero_single_forward(self: Any, x: torch.Tensor, emb: torch.Tensor | None = None) -> tuple:
    emb = self.linear(self.silu(emb))
    shift_msa, scale_msa, gate_msa = emb.chunk(3, dim=1)
    return layernorm_modulate(x.contiguous(), shift_msa, scale_msa, self.norm.eps), gate_msa


def _ada_continuous_forward(self: Any, x: torch.Tensor, conditioning_embedding: torch.Tensor) -> torch.Tensor:
    emb = self.linear(self.silu(conditioning_embedding).to(x.dtype))
    scale, shift = torch.chunk(emb, 2, dim=1)
    return layernorm_modulate(x.contiguous(), shift, scale, self.norm.eps)


class HeadRMSNorm(torch.nn.Module):
    """A drop-in for ``torch.nn.RMSNorm(head_dim)`` on ``[B, L, heads, head_dim]``, sharing its weight."""

    def __init__(self, original: torch.nn.RMSNorm) -> None:
        super().__init__()
        self.weight = original.weight
        self.eps = original.eps if original.eps is not None else torch.finfo(original.weight.dtype).eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4:
            raise ValueError(f"HeadRMSNorm expects [B, L, heads, head_dim], got {tuple(x.shape)}")
        return head_rmsnorm(x.contiguous(), self.weight, self.eps)


_FORWARDS = {
    "AdaLayerNormZero": _ada_zero_forward,
    "AdaLayerNormZeroSingle": _ada_zero_single_forward,
    "AdaLayerNormContinuous": _ada_continuous_forward,
}


def apply_to_flux(model: torch.nn.Module, *, norms: bool = True, qk_norm: bool = True) -> Patch:
    """Swap FLUX's norm fusions for polykernels' ops on ``model`` (a FluxTransformer2DModel).

    Returns a `Patch` that lists what was swapped; ``.restore()`` undoes it.
    """
    if type(model).__name__ not in SUPPORTED_CLASSES:
        raise ValueError(f"unsupported model {type(model).__name__}; supported: {SUPPORTED_CLASSES}")
    patch = Patch("polykernels -> diffusers flux")
    for name, module in model.named_modules():
        kind = type(module).__name__
        if norms and kind in _FORWARDS and _plain_layernorm(getattr(module, "norm", None)):
            if kind == "AdaLayerNormZero" and getattr(module, "emb", None) is not None:
                continue  # the class-embedding variant is not FLUX's; leave it alone
            patch.set(module, "forward", types.MethodType(_FORWARDS[kind], module), f"{name}.forward")
        if qk_norm:
            for attr in ("norm_q", "norm_k", "norm_added_q", "norm_added_k"):
                norm = getattr(module, attr, None)
                if isinstance(norm, torch.nn.RMSNorm) and norm.weight is not None:
                    patch.set(module, attr, HeadRMSNorm(norm), f"{name}.{attr}")
    return patch
