"""Registers the norm kernels with polykernels.kernel_registry (FLUX's widest rows).

The inline-PTX specializations are allowed exactly where the launcher's guard would pick them
(``guards.ptx_allowed``), asked under each target's platform by the compile matrix.
"""

from polykernels.kernel_registry import KernelSpec, register
from polykernels.norm.guards import ptx_allowed
from polykernels.norm.kernels import NORM_LAUNCH, NORM_PERSISTENT

_MODULE = "polykernels.norm.kernels"
_NORM_SIGNATURE = {
    "X": "*bf16", "Y": "*bf16", "W": "*bf16", "SHIFT": "*bf16", "SCALE": "*bf16", "MEAN": "*fp32", "RSTD": "*fp32",
    "rows": "i32", "L": "i32", "D": "i32", "stride_shift_b": "i32", "stride_shift_l": "i32", "stride_scale_b": "i32",
    "stride_scale_l": "i32", "eps": "fp32", "BLOCK_D": "constexpr", "ROWS": "constexpr", "IS_RMS": "constexpr",
    "EXACT_PTX": "constexpr", "PER_SAMPLE": "constexpr", "STORE_STATS": "constexpr",
    "STAGES": "constexpr",
}
# FLUX's D 3072 on the persistent grid, as the launcher runs it (norm/kernels.py's tables).
_ROWS, _WARPS, _, _STAGES = NORM_PERSISTENT[4096]
_SHAPE = {"BLOCK_D": 4096, "ROWS": _ROWS, "PER_SAMPLE": True, "STORE_STATS": False, "STAGES": _STAGES}
_OPTIONS = {"num_warps": _WARPS, "num_stages": 1}
# FLUX's rows, L, D 3072 and AdaLayerNormZero's chunk strides are multiples of 16: the launcher
# specializes them, and the rows' loads are 16 bytes wide only then.
_NORM_MULTIPLES_OF_16 = ("rows", "L", "D", "stride_shift_b", "stride_shift_l", "stride_scale_b", "stride_scale_l")
_QK_ROWS, _QK_WARPS = NORM_LAUNCH[128]

for _name, _is_rms in (("layernorm_modulate", False), ("rmsnorm_scale_shift", True)):
    register(KernelSpec(name=_name, module=_MODULE, function="norm_modulate_kernel", signature=_NORM_SIGNATURE,
                        constexprs={**_SHAPE, "IS_RMS": _is_rms, "EXACT_PTX": False}, options=_OPTIONS,
                        multiple_of_16=_NORM_MULTIPLES_OF_16))
    register(KernelSpec(name=f"{_name}_ptx", module=_MODULE, function="norm_modulate_kernel",
                        signature=_NORM_SIGNATURE, constexprs={**_SHAPE, "IS_RMS": _is_rms, "EXACT_PTX": True},
                        allowed=ptx_allowed, options=_OPTIONS, multiple_of_16=_NORM_MULTIPLES_OF_16))
register(KernelSpec(
    name="qk_rmsnorm", module=_MODULE, function="qk_rmsnorm_kernel",
    signature={"Q": "*bf16", "K": "*bf16", "WQ": "*bf16", "WK": "*bf16", "QO": "*bf16", "KO": "*bf16",
               "q_rows": "i32", "k_rows": "i32", "head_dim": "i32", "eps": "fp32",
               "ROWS": "constexpr", "BLOCK_D": "constexpr"},
    constexprs={"ROWS": _QK_ROWS, "BLOCK_D": 128},
    options={"num_warps": _QK_WARPS, "num_stages": 1},
    multiple_of_16=("q_rows", "k_rows", "head_dim"),  # FLUX: L 4608 x 24 heads, head_dim 128
))
