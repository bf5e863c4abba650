"""Registers the gated-delta-rule kernels with polykernels.kernel_registry (Qwen3-Next's shapes).

Packed sequences (VARLEN), and the recurrence both as the output pass and as the segment-state
pass of context parallelism, are the specializations registered: they compile every branch of
the segment and chunk arithmetic.
"""

import functools

import torch

from polykernels import platform
from polykernels.gated_delta_rule.guards import dot_precision, prepare_precision
from polykernels.gated_delta_rule.launch import (
    COMBINE_LAUNCH,
    HOPPER_CONCURRENT,
    HOPPER_CONCURRENT_PAIRS,
    HOPPER_PREPARE,
    HOPPER_PREPARE_SCORES,
    HOPPER_REGISTER_PAIRS,
    HOPPER_REGISTER_SEGMENT_STAGES,
    HOPPER_REGISTER_STAGES,
    HOPPER_STAGES,
    HOPPER_WARP_BLOCK_INVERSE,
    PREPARE_LAUNCH,
    RECURRENCE_BLOCK_V,
    combine_operator_block,
    hopper_pass,
    triton_pass_launches,
)
from polykernels.kernel_registry import KernelSpec, register

_MODULE = "polykernels.gated_delta_rule.kernels"
_PASSES = "polykernels.gated_delta_rule.recurrence_kernels"
_SHAPE = {"H": 16, "HV": 32, "K": 128, "BT": 64, "BK": 128}
_SEGMENTS = {"VARLEN": True, "LOG_N": 4, "L2NORM": True}
# The launcher's choices for K = V = 128 (launch.py's tables) in the Gluon passes' specs: the narrow V tile of
# the recurrence, the prepare pass's V tile. The Triton passes' specs take their arch's (triton_pass_specs).
_PREPARE_BV = PREPARE_LAUNCH[128][0]
_RECURRENCE_BV = RECURRENCE_BLOCK_V[128][1]


def _arch_launches(block_k: int, fp32_inputs: bool = False) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    return triton_pass_launches(platform.current().arch, block_k, fp32_inputs)


def _prepare_tile(block_k: int) -> dict[str, int]:
    block_v = _arch_launches(block_k)[2][0]
    return {"BV": block_v, "NV": 128 // block_v}


def _prepare_options(block_k: int) -> dict[str, int]:
    return {"num_warps": _arch_launches(block_k)[2][1]}


def _recurrence_tile(block_k: int, wide: bool) -> dict[str, int]:
    block_v = _arch_launches(block_k)[0][0 if wide else 1]
    return {"BV": block_v, "NV": 128 // block_v}


def _recurrence_options(block_k: int, fp32_inputs: bool = False) -> dict[str, int]:
    num_warps, num_stages = _arch_launches(block_k, fp32_inputs)[1]
    return {"num_warps": num_warps, "num_stages": num_stages}


def _constexpr(*names: str) -> dict[str, str]:
    return dict.fromkeys(names, "constexpr")


def _precision() -> dict[str, str]:
    return {"DOT_PRECISION": dot_precision(fp32_inputs=False)}


def _fp32(signature: dict[str, str]) -> dict[str, str]:
    return {name: "*fp32" if kind == "*bf16" else kind for name, kind in signature.items()}


def _prepare_precision(fp32_inputs: bool) -> dict[str, str]:
    return dict(zip(("DOT_PRECISION", "INVERSE_PRECISION"), prepare_precision(fp32_inputs), strict=True))


_PREPARE_SIGNATURE = {
    "Q_ptr": "*bf16", "K_ptr": "*bf16", "V_ptr": "*bf16", "G_ptr": "*fp32", "BETA_ptr": "*bf16", "W_ptr": "*bf16",
    "U_ptr": "*bf16", "P_ptr": "*bf16", "QS_ptr": "*fp32", "KS_ptr": "*fp32", "DECAY_ptr": "*fp32", "CU": "*i32",
    "T": "i32", "N": "i32", "CHUNKS_PER_SEQ": "i32", "scale": "fp32",
    **_constexpr("H", "HV", "K", "V", "BT", "BK", "BV", "NV", "L2NORM", "VARLEN", "LOG_N", "DOT_PRECISION",
                 "INVERSE_PRECISION"),
}
_RECURRENCE_SIGNATURE = {
    "Q_ptr": "*bf16", "K_ptr": "*bf16", "W_ptr": "*bf16", "U_ptr": "*bf16", "P_ptr": "*bf16", "QS_ptr": "*fp32",
    "KS_ptr": "*fp32", "DECAY_ptr": "*fp32", "HINIT_ptr": "*fp32", "HT_ptr": "*fp32", "O_ptr": "*bf16",
    "HLOC_ptr": "*fp32", "M_ptr": "*fp32", "CU": "*i32", "T": "i32", "N": "i32",
    "SEGS_PER_SEQ": "i32", "SEG_TOKENS": "i64",
    **_constexpr("H", "HV", "K", "V", "BT", "BK", "BV", "NV", "VARLEN", "LOG_N", "HAS_INITIAL", "SEGMENT_STATE",
                 "STORE_FINAL", "DOT_PRECISION"),
}


def _precision_fp32() -> dict[str, str]:
    return {"DOT_PRECISION": dot_precision(fp32_inputs=True)}


def triton_pass_specs(block_k: int = 128) -> list[KernelSpec]:
    """The Triton passes' specs at K = ``block_k`` (V = 128), with the V tile, warps and stages the launcher
    takes on the platform asked about (launch.triton_pass_launches): the prepare pass, the sequential passes
    at both V tiles (the wide one is the narrow one where the arch runs no wide tile), and fp32 inputs. At
    K = 128 they are the registry's; tests compile the others. fp32 inputs: their products' precision is per
    target (guards), and their pipeline stages take twice the shared memory (three do not fit an H200 at K =
    128; the launcher then drops one, and the matrix shows how many fit on each target)."""
    suffix = "" if block_k == 128 else f"_k{block_k}"
    shape = {**_SHAPE, "K": block_k, "BK": block_k}
    specs = [KernelSpec(
        name=f"{name}{suffix}", module=_PASSES, function="gdn_prepare_kernel",
        signature=_fp32(_PREPARE_SIGNATURE) if fp32_inputs else _PREPARE_SIGNATURE,
        constexprs={**shape, **_SEGMENTS, "V": 128},
        platform_constexprs=lambda fp32_inputs=fp32_inputs: {**_prepare_precision(fp32_inputs),
                                                             **_prepare_tile(block_k)},
        options={"num_stages": 1},
        platform_options=lambda: _prepare_options(block_k),
    ) for name, fp32_inputs in (("gdn_prepare", False), ("gdn_prepare_fp32", True))]
    # launch.SEGMENT_WINDOWS: the prepare pass storing each chunk's growth term, and the segment-state pass
    # taking each segment's last chunks alone where the gates allow.
    specs.append(KernelSpec(
        name=f"gdn_prepare_growth{suffix}", module=_PASSES, function="gdn_prepare_kernel",
        signature={**_PREPARE_SIGNATURE, "GROWTH": "constexpr"}, constexprs={**shape, **_SEGMENTS, "V": 128,
                                                                            "GROWTH": True},
        platform_constexprs=lambda: {**_prepare_precision(False), **_prepare_tile(block_k)},
        options={"num_stages": 1}, platform_options=lambda: _prepare_options(block_k),
    ))
    specs += [KernelSpec(
        name=f"{name}{suffix}", module=_PASSES, function="gdn_recurrence_kernel",
        signature=_fp32(_RECURRENCE_SIGNATURE) if fp32 else _RECURRENCE_SIGNATURE,
        constexprs={**shape, "V": 128, "VARLEN": True, "LOG_N": 4, "HAS_INITIAL": True,
                    "SEGMENT_STATE": segment_state, "STORE_FINAL": True},
        platform_constexprs=lambda fp32=fp32, wide=wide: {**(_precision_fp32() if fp32 else _precision()),
                                                          **_recurrence_tile(block_k, wide)},
        platform_options=lambda fp32=fp32: _recurrence_options(block_k, fp32),
    ) for name, segment_state, fp32, wide in (
        ("gdn_recurrence", False, False, False),
        ("gdn_segment_state", True, False, False),
        ("gdn_recurrence_wide", False, False, True),
        ("gdn_segment_state_wide", True, False, True),
        ("gdn_recurrence_fp32", False, True, False))]
    specs.append(KernelSpec(
        name=f"gdn_segment_state_window{suffix}", module=_PASSES, function="gdn_recurrence_kernel",
        signature={**_RECURRENCE_SIGNATURE, "SEGMENT_WINDOW": "constexpr"},
        constexprs={**shape, "V": 128, "VARLEN": True, "LOG_N": 4, "HAS_INITIAL": False, "SEGMENT_STATE": True,
                    "STORE_FINAL": False, "SEGMENT_WINDOW": True},
        platform_constexprs=lambda: {**_precision(), **_recurrence_tile(block_k, False)},
        platform_options=lambda: _recurrence_options(block_k),
    ))
    return specs


for _spec in triton_pass_specs():
    register(_spec)
register(KernelSpec(
    name="gdn_combine", module=_MODULE, function="gdn_combine_kernel",
    signature={"H0_ptr": "*fp32", "HLOC_ptr": "*fp32", "M_ptr": "*fp32", "HINIT_ptr": "*fp32", "CU": "*i32",
               "N": "i32", "SEGS_PER_SEQ": "i32", "SEG_TOKENS": "i64",
               **_constexpr("HV", "K", "V", "BK", "BV", "KB", "HAS_INITIAL", "VARLEN", "DOT_PRECISION")},
    constexprs={"HV": 32, "K": 128, "V": 128, "BK": 128, "BV": COMBINE_LAUNCH["block_v"],
                "KB": combine_operator_block(128, COMBINE_LAUNCH["whole_k"]), "HAS_INITIAL": True, "VARLEN": True},
    platform_constexprs=_precision,
    options={"num_warps": COMBINE_LAUNCH["num_warps"], "num_stages": COMBINE_LAUNCH["num_stages"]},
))


def _on_hopper() -> bool:
    return hopper_pass(platform.current(), torch.bfloat16, key_dim=128)


# The Gluon sequential pass (sm_90 only: wgmma), both as the output pass and the segment-state pass, at
# the narrow V tile and at the wide one (which the cut sequences of the thin Qwen3.5 shapes run).
_WIDE_BV = RECURRENCE_BLOCK_V[128][0]
for _name, _segment_state, _block_v in (
    ("gdn_recurrence_hopper", False, _RECURRENCE_BV), ("gdn_segment_state_hopper", True, _RECURRENCE_BV),
    ("gdn_recurrence_hopper_wide", False, _WIDE_BV), ("gdn_segment_state_hopper_wide", True, _WIDE_BV),
):
    register(KernelSpec(
        name=_name, module="polykernels.gated_delta_rule.hopper_kernels", function="gdn_recurrence_hopper_kernel",
        signature={**_RECURRENCE_SIGNATURE, "STAGES": "constexpr"},
        constexprs={**_SHAPE, "V": 128, "BV": _block_v, "NV": 128 // _block_v, "VARLEN": True,
                    "LOG_N": 4, "HAS_INITIAL": True, "SEGMENT_STATE": _segment_state, "STORE_FINAL": True,
                    "STAGES": HOPPER_STAGES[_block_v]},
        allowed=_on_hopper, platform_constexprs=_precision,
        options={"num_warps": 4},
    ))
# The Gluon prepare pass (sm_90 only: wgmma), with the register cap the launcher gives it at K = 128;
# also its form that raises each chunk's ready flag for a sequential pass running beside it
# (launch._recipe's concurrent and lead beside the prepare pass; batch rows), with the
# inverse's levels whole and per warp (launch.concurrent_warp_blocks).
_PREPARE_CAP = HOPPER_PREPARE.get(128)
_PREPARE_SCORES_CAP = HOPPER_PREPARE_SCORES.get(128, _PREPARE_CAP)  # the forms storing the score exponents
for _name, _concurrent, _warp_blocks in (("gdn_prepare_hopper", False, HOPPER_WARP_BLOCK_INVERSE),
                                         ("gdn_prepare_hopper_concurrent", True, False),
                                         ("gdn_prepare_hopper_concurrent_warp", True, HOPPER_WARP_BLOCK_INVERSE)):
    register(KernelSpec(
        name=_name, module="polykernels.gated_delta_rule.hopper_prepare_kernels",
        function="gdn_prepare_hopper_kernel",
        signature={**{name: kind for name, kind in _PREPARE_SIGNATURE.items() if kind != "constexpr"},
                   "FLAGS": "*i32", "SEQUENTIAL_PROGRAMS": "i32",
                   **{name: kind for name, kind in _PREPARE_SIGNATURE.items() if kind == "constexpr"},
                   "CONCURRENT": "constexpr", "WARP_BLOCKS": "constexpr"},
        constexprs={**_SHAPE, **_SEGMENTS, "V": 128, "BV": _PREPARE_BV, "NV": 128 // _PREPARE_BV,
                    "VARLEN": not _concurrent, "CONCURRENT": _concurrent, "WARP_BLOCKS": _warp_blocks},
        allowed=_on_hopper, platform_constexprs=functools.partial(_prepare_precision, False),
        options={"num_warps": 4, **({"maxnreg": _PREPARE_CAP} if _PREPARE_CAP else {})},
    ))
# The Gluon sequential pass with the state in registers (sm_90 only), at its one V tile (64 columns):
# the output pass (of uncut sequences, and of cut ones' segments from their initial states), and the
# segment-state pass of cut sequences.
# Also its two-warpgroup form (two neighbouring V tiles per program), and the form that waits for
# each chunk's ready flag beside the prepare pass (batch rows; packed sequences: the pairs' entries below).
_RS_SIGNATURE = {**{name: kind for name, kind in _RECURRENCE_SIGNATURE.items() if kind != "constexpr"},
                 "FLAGS": "*i32", "WS_ptr": "*fp32",
                 **{name: kind for name, kind in _RECURRENCE_SIGNATURE.items() if kind == "constexpr"},
                 "STAGES": "constexpr", "AWAIT": "constexpr"}
for _name, _warpgroups, _stages, _await, _segment_state in (
    ("gdn_recurrence_hopper_rs", 1, HOPPER_REGISTER_STAGES[_WIDE_BV], False, False),
    ("gdn_recurrence_hopper_rs_pair", 2, HOPPER_REGISTER_PAIRS[_WIDE_BV], False, False),
    ("gdn_recurrence_hopper_rs_concurrent", *HOPPER_CONCURRENT[128], True, False),
    ("gdn_segment_state_hopper_rs", 1, HOPPER_REGISTER_SEGMENT_STAGES[_WIDE_BV], False, True),
):
    register(KernelSpec(
        name=_name, module="polykernels.gated_delta_rule.hopper_register_kernels",
        function="gdn_recurrence_hopper_rs_kernel", signature=_RS_SIGNATURE,
        constexprs={**_SHAPE, "V": 128, "BV": _warpgroups * _WIDE_BV, "NV": 128 // (_warpgroups * _WIDE_BV),
                    "VARLEN": not _await, "LOG_N": 4, "HAS_INITIAL": not _segment_state,
                    "SEGMENT_STATE": _segment_state, "STORE_FINAL": not _segment_state, "STAGES": _stages,
                    "AWAIT": _await},
        allowed=_on_hopper, platform_constexprs=_precision,
        options={"num_warps": 4 * _warpgroups},
    ))
# launch.SEGMENT_WINDOWS (sm_90): the prepare pass storing each chunk's growth bound, and the register-state
# segment-state pass taking each segment's last chunks alone where the gates have decayed the rest away.
register(KernelSpec(
    name="gdn_prepare_hopper_growth", module="polykernels.gated_delta_rule.hopper_prepare_kernels",
    function="gdn_prepare_hopper_kernel",
    signature={**{name: kind for name, kind in _PREPARE_SIGNATURE.items() if kind != "constexpr"},
               "FLAGS": "*i32", "SEQUENTIAL_PROGRAMS": "i32",
               **{name: kind for name, kind in _PREPARE_SIGNATURE.items() if kind == "constexpr"},
               **_constexpr("CONCURRENT", "STORE_T", "WARP_BLOCKS", "GROWTH")},
    constexprs={**_SHAPE, **_SEGMENTS, "V": 128, "BV": _PREPARE_BV, "NV": 128 // _PREPARE_BV, "VARLEN": True,
                "CONCURRENT": False, "STORE_T": False, "WARP_BLOCKS": HOPPER_WARP_BLOCK_INVERSE, "GROWTH": True},
    allowed=_on_hopper, platform_constexprs=functools.partial(_prepare_precision, False),
    options={"num_warps": 4, **({"maxnreg": _PREPARE_CAP} if _PREPARE_CAP else {})},
))
register(KernelSpec(
    name="gdn_segment_state_hopper_rs_window", module="polykernels.gated_delta_rule.hopper_register_kernels",
    function="gdn_recurrence_hopper_rs_kernel",
    signature={**_RS_SIGNATURE, **_constexpr("FROM_V", "LEAD", "AFTER_LEAD", "FIRST_TAKES_REST", "SEGMENT_WINDOW")},
    constexprs={**_SHAPE, "V": 128, "BV": _WIDE_BV, "NV": 128 // _WIDE_BV, "VARLEN": True, "LOG_N": 4,
                "HAS_INITIAL": False, "SEGMENT_STATE": True, "STORE_FINAL": False,
                "STAGES": HOPPER_REGISTER_SEGMENT_STAGES[_WIDE_BV], "AWAIT": False, "FROM_V": False, "LEAD": False,
                "AFTER_LEAD": False, "FIRST_TAKES_REST": False, "SEGMENT_WINDOW": True},
    allowed=_on_hopper, platform_constexprs=_precision,
    options={"num_warps": 4},
))
# launch.HOPPER_SCAN_WINDOWS (sm_90): the output pass after the windowed segment states, each program scanning
# them back to the last window (no combine pass); batch rows without an initial state, packed sequences with one.
for _name, _packed in (("gdn_recurrence_hopper_rs_after_windows", False),
                       ("gdn_recurrence_hopper_rs_after_windows_packed", True)):
    register(KernelSpec(
        name=_name, module="polykernels.gated_delta_rule.hopper_register_kernels",
        function="gdn_recurrence_hopper_rs_kernel",
        signature={**_RS_SIGNATURE, **_constexpr("FROM_V", "LEAD", "AFTER_LEAD", "FIRST_TAKES_REST",
                                                 "AFTER_WINDOWS")},
        constexprs={**_SHAPE, "V": 128, "BV": _WIDE_BV, "NV": 128 // _WIDE_BV, "VARLEN": _packed,
                    "LOG_N": 4 if _packed else 1, "HAS_INITIAL": _packed, "SEGMENT_STATE": False, "STORE_FINAL": True,
                    "STAGES": HOPPER_REGISTER_STAGES[_WIDE_BV], "AWAIT": False, "FROM_V": False, "LEAD": False,
                    "AFTER_LEAD": False, "FIRST_TAKES_REST": False, "AFTER_WINDOWS": True},
        allowed=_on_hopper, platform_constexprs=_precision,
        options={"num_warps": 4},
    ))
# launch.HOPPER_PAIRS_FROM_V (sm_90, K = 128): the prepare pass storing T and k's factor in w, and the
# two-warpgroup register-state pass forming v_new from v and T.
# Also their form beside the prepare pass (launch.HOPPER_CONCURRENT_PAIRS): the pairs waiting for each chunk's
# ready flag, the prepare pass raising them; batch rows, and packed sequences (launch.HOPPER_CONCURRENT_PACKED).
for _suffix, _concurrent, _stages, _packed in (("", False, HOPPER_REGISTER_PAIRS[_WIDE_BV], True),
                                               ("_concurrent", True, HOPPER_CONCURRENT_PAIRS[128], False),
                                               ("_concurrent_packed", True, HOPPER_CONCURRENT_PAIRS[128], True)):
    register(KernelSpec(
        name="gdn_prepare_hopper_t" + _suffix, module="polykernels.gated_delta_rule.hopper_prepare_kernels",
        function="gdn_prepare_hopper_kernel",
        signature={**{name: ("*fp32" if name == "U_ptr" else kind) for name, kind in _PREPARE_SIGNATURE.items()
                      if kind != "constexpr"},
                   "FLAGS": "*i32", "SEQUENTIAL_PROGRAMS": "i32",
                   **{name: kind for name, kind in _PREPARE_SIGNATURE.items() if kind == "constexpr"},
                   "CONCURRENT": "constexpr", "STORE_T": "constexpr", "WARP_BLOCKS": "constexpr"},
        constexprs={**_SHAPE, **_SEGMENTS, "V": 128, "BV": _PREPARE_BV, "NV": 128 // _PREPARE_BV,
                    "VARLEN": _packed, "CONCURRENT": _concurrent, "STORE_T": True,
                    "WARP_BLOCKS": HOPPER_WARP_BLOCK_INVERSE},
        allowed=_on_hopper, platform_constexprs=functools.partial(_prepare_precision, False),
        options={"num_warps": 4, **({"maxnreg": _PREPARE_CAP} if _PREPARE_CAP else {})},
    ))
    register(KernelSpec(
        name="gdn_recurrence_hopper_rs_pair_from_v" + _suffix,
        module="polykernels.gated_delta_rule.hopper_register_kernels",
        function="gdn_recurrence_hopper_rs_kernel", signature={**_RS_SIGNATURE, "FROM_V": "constexpr"},
        constexprs={**_SHAPE, "V": 128, "BV": 2 * _WIDE_BV, "NV": 128 // (2 * _WIDE_BV), "VARLEN": _packed,
                    "LOG_N": 4, "HAS_INITIAL": True, "SEGMENT_STATE": False, "STORE_FINAL": True, "STAGES": _stages,
                    "AWAIT": _concurrent, "FROM_V": True},
        allowed=_on_hopper, platform_constexprs=_precision,
        options={"num_warps": 8},
    ))
# launch.HOPPER_PAIRS_SCORES: the same pair after the prepare pass, the pairs forming P from q and k and the
# exponents the prepare pass stores in its place (two fp32 per token), so P's part of the workspace is fp32.
register(KernelSpec(
    name="gdn_prepare_hopper_t_scores", module="polykernels.gated_delta_rule.hopper_prepare_kernels",
    function="gdn_prepare_hopper_kernel",
    signature={**{name: ("*fp32" if name in ("U_ptr", "P_ptr") else kind) for name, kind in _PREPARE_SIGNATURE.items()
                  if kind != "constexpr"},
               "FLAGS": "*i32", "SEQUENTIAL_PROGRAMS": "i32",
               **{name: kind for name, kind in _PREPARE_SIGNATURE.items() if kind == "constexpr"},
               "CONCURRENT": "constexpr", "STORE_T": "constexpr", "WARP_BLOCKS": "constexpr",
               "GROWTH": "constexpr", "SCORE_FACTORS": "constexpr"},
    constexprs={**_SHAPE, **_SEGMENTS, "V": 128, "BV": _PREPARE_BV, "NV": 128 // _PREPARE_BV, "VARLEN": False,
                "CONCURRENT": False, "STORE_T": True, "WARP_BLOCKS": HOPPER_WARP_BLOCK_INVERSE, "GROWTH": False,
                "SCORE_FACTORS": True},
    allowed=_on_hopper, platform_constexprs=functools.partial(_prepare_precision, False),
    options={"num_warps": 4, **({"maxnreg": _PREPARE_SCORES_CAP} if _PREPARE_SCORES_CAP else {})},
))
# launch.HOPPER_PAIRS_TMA: the same pairs copying their tiles by TMA (the "_tma" entries, here and below).
for _suffix, _tma in (("", False), ("_tma", True)):
    register(KernelSpec(
        name="gdn_recurrence_hopper_rs_pair_from_v_scores" + _suffix,
        module="polykernels.gated_delta_rule.hopper_register_kernels",
        function="gdn_recurrence_hopper_rs_kernel",
        signature={**{name: ("*fp32" if name == "P_ptr" else kind) for name, kind in _RS_SIGNATURE.items()},
                   "FROM_V": "constexpr", "LEAD": "constexpr", "AFTER_LEAD": "constexpr",
                   "FIRST_TAKES_REST": "constexpr", "SEGMENT_WINDOW": "constexpr", "AFTER_WINDOWS": "constexpr",
                   "SCORES": "constexpr", "TMA": "constexpr"},
        constexprs={**_SHAPE, "V": 128, "BV": 2 * _WIDE_BV, "NV": 128 // (2 * _WIDE_BV), "VARLEN": False, "LOG_N": 4,
                    "HAS_INITIAL": True, "SEGMENT_STATE": False, "STORE_FINAL": True,
                    "STAGES": HOPPER_REGISTER_PAIRS[_WIDE_BV], "AWAIT": False, "FROM_V": True, "LEAD": False,
                    "AFTER_LEAD": False, "FIRST_TAKES_REST": False, "SEGMENT_WINDOW": False, "AFTER_WINDOWS": False,
                    "SCORES": True, "TMA": _tma},
        allowed=_on_hopper, platform_constexprs=_precision,
        options={"num_warps": 8},
    ))
# launch.HOPPER_WINDOWED_PAIRS (sm_90, batch rows cut into pairs) and HOPPER_WINDOWED_PACKED_PAIRS (packed
# sequences, from an initial state): the prepare pass storing T, the score exponents and each chunk's growth bound;
# the windowed segment states in FlashInfer's order (no outputs); the pairs after them, each scanning back to the
# last window and forming P.
for _name, _packed in (("gdn_prepare_hopper_t_scores_growth", False),
                       ("gdn_prepare_hopper_t_scores_growth_packed", True)):
    register(KernelSpec(
        name=_name, module="polykernels.gated_delta_rule.hopper_prepare_kernels",
        function="gdn_prepare_hopper_kernel",
        signature={**{name: ("*fp32" if name in ("U_ptr", "P_ptr") else kind)
                      for name, kind in _PREPARE_SIGNATURE.items() if kind != "constexpr"},
                   "FLAGS": "*i32", "SEQUENTIAL_PROGRAMS": "i32",
                   **{name: kind for name, kind in _PREPARE_SIGNATURE.items() if kind == "constexpr"},
                   **_constexpr("CONCURRENT", "STORE_T", "WARP_BLOCKS", "GROWTH", "SCORE_FACTORS")},
        constexprs={**_SHAPE, **_SEGMENTS, "V": 128, "BV": _PREPARE_BV, "NV": 128 // _PREPARE_BV, "VARLEN": _packed,
                    "CONCURRENT": False, "STORE_T": True, "WARP_BLOCKS": HOPPER_WARP_BLOCK_INVERSE, "GROWTH": True,
                    "SCORE_FACTORS": True},
        allowed=_on_hopper, platform_constexprs=functools.partial(_prepare_precision, False),
        options={"num_warps": 4, **({"maxnreg": _PREPARE_SCORES_CAP} if _PREPARE_SCORES_CAP else {})},
    ))
for _name, _segment_state, _packed, _tma in (
    ("gdn_segment_state_hopper_rs_pair_from_v_window", True, False, False),
    ("gdn_recurrence_hopper_rs_pair_from_v_scores_after_windows", False, False, False),
    ("gdn_recurrence_hopper_rs_pair_from_v_scores_after_windows_tma", False, False, True),
    ("gdn_segment_state_hopper_rs_pair_from_v_window_packed", True, True, False),
    ("gdn_recurrence_hopper_rs_pair_from_v_scores_after_windows_packed", False, True, False),
    ("gdn_recurrence_hopper_rs_pair_from_v_scores_after_windows_packed_tma", False, True, True),
):
    register(KernelSpec(
        name=_name, module="polykernels.gated_delta_rule.hopper_register_kernels",
        function="gdn_recurrence_hopper_rs_kernel",
        signature={**{name: ("*fp32" if name == "P_ptr" else kind) for name, kind in _RS_SIGNATURE.items()},
                   **_constexpr("FROM_V", "LEAD", "AFTER_LEAD", "FIRST_TAKES_REST", "SEGMENT_WINDOW",
                                "AFTER_WINDOWS", "SCORES", "TMA", "CHUNK_SCALES")},
        constexprs={**_SHAPE, "V": 128, "BV": 2 * _WIDE_BV, "NV": 128 // (2 * _WIDE_BV), "VARLEN": _packed,
                    "LOG_N": 4 if _packed else 1, "HAS_INITIAL": _packed and not _segment_state,
                    "SEGMENT_STATE": _segment_state,
                    "STORE_FINAL": not _segment_state, "STAGES": HOPPER_REGISTER_PAIRS[_WIDE_BV], "AWAIT": False,
                    "FROM_V": True, "LEAD": False, "AFTER_LEAD": False, "FIRST_TAKES_REST": False,
                    "SEGMENT_WINDOW": _segment_state, "AFTER_WINDOWS": not _segment_state,
                    "SCORES": not _segment_state, "TMA": _tma, "CHUNK_SCALES": _segment_state},
        allowed=_on_hopper, platform_constexprs=_precision,
        options={"num_warps": 8},
    ))
# launch.HOPPER_LEAD_SEGMENT (sm_90, cut sequences): each sequence's first segment's output pass (LEAD), the
# segment-state pass of the segments after it as that launch's programmatic dependent, and the output
# pass of the segments after the first (AFTER_LEAD), each program scanning the segment states up to its own.
# Also the form beside the prepare pass (launch.HOPPER_LEAD_BESIDE_PREPARE): the lead and the segment states
# waiting for ready flags, the first segment the longer one in all three; and packed sequences' form (the lead
# at each sequence's first slot, the passes after it numbering only the segments after each first).
for _name, _lead, _segment_state, _beside, _packed in (
    ("gdn_recurrence_hopper_rs_lead", True, False, False, False),
    ("gdn_segment_state_hopper_rs_after_lead", False, True, False, False),
    ("gdn_recurrence_hopper_rs_after_lead", False, False, False, False),
    ("gdn_recurrence_hopper_rs_lead_beside_prepare", True, False, True, False),
    ("gdn_segment_state_hopper_rs_after_lead_beside_prepare", False, True, True, False),
    ("gdn_recurrence_hopper_rs_after_lead_beside_prepare", False, False, True, False),
    ("gdn_recurrence_hopper_rs_lead_packed", True, False, False, True),
    ("gdn_segment_state_hopper_rs_after_lead_packed", False, True, False, True),
    ("gdn_recurrence_hopper_rs_after_lead_packed", False, False, False, True),
):
    register(KernelSpec(
        name=_name, module="polykernels.gated_delta_rule.hopper_register_kernels",
        function="gdn_recurrence_hopper_rs_kernel",
        signature={**_RS_SIGNATURE, **_constexpr("FROM_V", "LEAD", "AFTER_LEAD", "FIRST_TAKES_REST")},
        constexprs={**_SHAPE, "V": 128, "BV": _WIDE_BV, "NV": 128 // _WIDE_BV, "VARLEN": _packed,
                    "LOG_N": 4 if _packed else 1, "HAS_INITIAL": not _segment_state, "SEGMENT_STATE": _segment_state,
                    "STORE_FINAL": not _segment_state and (_packed or not _lead),
                    "STAGES": (HOPPER_REGISTER_SEGMENT_STAGES if _segment_state else HOPPER_REGISTER_STAGES)[_WIDE_BV],
                    "AWAIT": _beside and (_lead or _segment_state), "FROM_V": False, "LEAD": _lead,
                    "AFTER_LEAD": not _lead, "FIRST_TAKES_REST": _beside},
        allowed=_on_hopper, platform_constexprs=_precision,
        options={"num_warps": 4},
    ))
