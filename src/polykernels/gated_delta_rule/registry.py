"""Registers the gated-delta-rule kernels with polykernels.kernel_registry (Qwen3-Next's shapes)."""

from polykernels.gated_delta_rule.guards import dot_precision
from polykernels.kernel_registry import KernelSpec, register

_SHAPE = {"H": 16, "HV": 32, "K": 128, "V": 128, "BT": 64, "BK": 128}
_MODULE = "polykernels.gated_delta_rule.kernels"

register(KernelSpec(
    name="gdn_prepare", module=_MODULE, function="gdn_prepare_kernel",
    signature={"K_ptr": "*bf16", "V_ptr": "*bf16", "G_ptr": "*fp32", "BETA_ptr": "*bf16", "W_ptr": "*bf16",
               "U_ptr": "*bf16", "GC_ptr": "*fp32", "CHUNKS": "*i64", **dict.fromkeys(
                   ("H", "HV", "K", "V", "BT", "BK", "BV", "NV", "L2NORM", "DOT_PRECISION"), "constexpr")},
    constexprs={**_SHAPE, "BV": 64, "NV": 2, "L2NORM": True, },
    platform_constexprs=lambda: {"DOT_PRECISION": dot_precision(fp32_inputs=False)},
))
register(KernelSpec(
    name="gdn_scan", module=_MODULE, function="gdn_scan_kernel",
    signature={"K_ptr": "*bf16", "W_ptr": "*bf16", "U_ptr": "*bf16", "GC_ptr": "*fp32", "H0_ptr": "*fp32",
               "HT_ptr": "*fp32", "HS_ptr": "*bf16", "VNEW_ptr": "*bf16", "SEQS": "*i64", "CHUNK_STARTS": "*i64",
               **dict.fromkeys(("H", "HV", "K", "V", "BT", "BK", "BV", "L2NORM", "HAS_INITIAL", "STORE_FINAL",
                                "DOT_PRECISION"), "constexpr")},
    constexprs={**_SHAPE, "BV": 32, "L2NORM": True, "HAS_INITIAL": True, "STORE_FINAL": True,
                },
    platform_constexprs=lambda: {"DOT_PRECISION": dot_precision(fp32_inputs=False)},
))
register(KernelSpec(
    name="gdn_output", module=_MODULE, function="gdn_output_kernel",
    signature={"Q_ptr": "*bf16", "K_ptr": "*bf16", "GC_ptr": "*fp32", "HS_ptr": "*bf16", "VNEW_ptr": "*bf16",
               "O_ptr": "*bf16", "CHUNKS": "*i64", "scale": "fp32",
               **dict.fromkeys(("H", "HV", "K", "V", "BT", "BK", "BV", "L2NORM", "DOT_PRECISION"), "constexpr")},
    constexprs={**_SHAPE, "BV": 128, "L2NORM": True},
    platform_constexprs=lambda: {"DOT_PRECISION": dot_precision(fp32_inputs=False)},
))
