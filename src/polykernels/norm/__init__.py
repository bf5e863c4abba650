"""FLUX norm fusions (Triton; a CUDA-only inline-PTX epilogue, guarded off ROCm)."""

from polykernels.norm.guards import MAX_D, choose, prefer
from polykernels.norm.ops import head_rmsnorm, layernorm_modulate, qk_rmsnorm, rmsnorm_scale_shift
from polykernels.norm.reference import (
    layernorm_modulate_reference,
    qk_rmsnorm_reference,
    rmsnorm_reference,
    rmsnorm_scale_shift_reference,
)

__all__ = [
    "MAX_D",
    "choose",
    "head_rmsnorm",
    "layernorm_modulate",
    "layernorm_modulate_reference",
    "prefer",
    "qk_rmsnorm",
    "qk_rmsnorm_reference",
    "rmsnorm_reference",
    "rmsnorm_scale_shift",
    "rmsnorm_scale_shift_reference",
]
