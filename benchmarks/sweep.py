"""python -m benchmarks.sweep [gdn|gdn-launch|norm] [--axis TEXT]: the launch choices the kernels' tables come from.

gdn: GPU time per segments-per-sequence choice at the benchmark shapes (plan_segments and
MIN_SEGMENT_CHUNKS in gated_delta_rule/launch.py), the plan's own ("plan") first; --case keeps the shapes
whose name contains the text, --segments the counts to time (default 1,2,4,8,16), --gates the gates' family
(benchmarks.registry.GDN_GATES). gdn-launch: per V tile, warps and stages of the
two passes (launch.py's RECURRENCE_* and PREPARE_LAUNCH), with each kernel's share of the time.
norm: per rows per block, warps, programs per SM and stages (norm/kernels.py: NORM_LAUNCH,
NORM_PERSISTENT).
--axis (repeatable) keeps only the gdn-launch axes whose name contains the text ("BV", "prepare").
"""

from __future__ import annotations

import argparse
import functools
import json

import torch

from benchmarks.registry import GDN_GATES, GDN_SHAPES, gdn_boundaries, gdn_inputs
from benchmarks.timing import graph_ms
from polykernels import platform


def sweep_gdn(device: str, cases: list[str] | None = None, counts: tuple[int, ...] = (1, 2, 4, 8, 16),
              gates: str | None = None) -> list[dict]:
    from polykernels.gated_delta_rule import chunk_gated_delta_rule
    from polykernels.gated_delta_rule.launch import plan_segments, triton_pass_launches

    results = []
    for name, batch, tokens, heads, value_heads, lengths in GDN_SHAPES:
        if cases and not any(case in name for case in cases):
            continue
        q, k, v, g, beta = gdn_inputs(batch, tokens, heads, value_heads, device, gates=gates)
        cu = gdn_boundaries(lengths, device)
        num_seqs = batch if cu is None else len(lengths)
        # "auto": plan_segments' count alone; the recipe (windows, the lead form) may run another: "plan" times it.
        auto = plan_segments(num_seqs, batch * tokens, value_heads, platform.sm_count(torch.device(device)),
                             block_vs=triton_pass_launches(platform.current().arch, 128)[0])
        row = {"shape": name, "gates": gates or "fast", "auto": auto.segments}
        for segments in (None, *counts):
            if segments is not None and segments > tokens // num_seqs // 64:
                continue
            ms = graph_ms(functools.partial(chunk_gated_delta_rule, q, k, v, g, beta, output_final_state=True,
                                            cu_seqlens=cu, num_segments=segments))
            row["plan" if segments is None else str(segments)] = round(ms, 4)
        print(json.dumps(row), flush=True)
        results.append(row)
    return results


def sweep_gdn_launch(device: str, axes: list[str] | None = None) -> list[dict]:
    """GPU time per launch choice of the two passes (launch.py's tables), and where the time goes."""
    from polykernels.gated_delta_rule import chunk_gated_delta_rule, launch

    results = []
    # The tables are read-only: each choice replaces them (which also retires the launch programs
    # recorded under the previous ones), and the originals come back after it. The per-arch tables would
    # shadow them on their archs: they are emptied for the sweep (its rows include their entries' launches).
    tables = ("RECURRENCE_BLOCK_V", "RECURRENCE_LAUNCH", "PREPARE_LAUNCH")
    originals = [getattr(launch, name) for name in tables]
    arch_tables = ("ARCH_RECURRENCE_BLOCK_V", "ARCH_RECURRENCE_LAUNCH", "ARCH_PREPARE_LAUNCH")
    arch_originals = [getattr(launch, name) for name in arch_tables]
    # (wide, narrow) both set to one BV: the V tile is forced whatever plan_segments would pick.
    choices = {"BV x warps x stages": [((bv, bv), (w, st), None) for bv, w, st in
                                       ((64, 4, 3), (64, 8, 3), (32, 4, 3), (32, 4, 2), (32, 8, 3), (16, 4, 3))],
               "prepare BV x warps": [(None, None, (bv, w)) for bv in (64, 128) for w in (4, 8)]}
    if axes:
        kept = {label: configs for label, configs in choices.items() if any(a in label for a in axes)}
        if not kept:
            raise SystemExit(f"--axis {axes}: no gdn-launch axis matches; the axes are {list(choices)}")
        choices = kept
    for table in arch_tables:
        setattr(launch, table, {})
    try:
        # The thin shapes too: there the V tile also sets the segment count (plan_segments), and a
        # 64-wide tile with more segments beat the 32-wide one at 1x32768 2/8 (BENCHMARKS.md).
        for name, batch, tokens, heads, value_heads in (("B1 T32768 H32/32", 1, 32768, 32, 32),
                                                         ("B8 T4096 H32/32", 8, 4096, 32, 32),
                                                         ("1x32768 H2/8", 1, 32768, 2, 8),
                                                         ("1x65536 H2/8", 1, 65536, 2, 8),
                                                         ("1x32768 H4/16", 1, 32768, 4, 16)):
            q, k, v, g, beta = gdn_inputs(batch, tokens, heads, value_heads, device)
            call = functools.partial(chunk_gated_delta_rule, q, k, v, g, beta, output_final_state=True)
            row: dict = {"shape": name}
            for label, configs in choices.items():
                for config in configs:
                    for table, original, value in zip(tables, originals, config, strict=True):
                        if value is not None:
                            setattr(launch, table, {**original, 128: value})
                    row[f"{label}: {config}"] = round(graph_ms(call), 4)
                    for table, original in zip(tables, originals, strict=True):
                        setattr(launch, table, original)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    call()
                torch.cuda.synchronize()
            row["kernels_us"] = {e.key[:40]: round(e.device_time_total / 3, 1) for e in prof.key_averages()
                                 if e.device_time_total > 0}
            print(json.dumps(row), flush=True)
            results.append(row)
    finally:
        for table, original in zip(arch_tables, arch_originals, strict=True):
            setattr(launch, table, original)
    return results


def sweep_norm(device: str) -> list[dict]:
    """GPU time per (rows per block, warps, programs per SM or 0 for one per block, stages) at D 3072."""
    from polykernels.norm import guards, kernels, layernorm_modulate, ops, qk_rmsnorm, rmsnorm_scale_shift

    results = []
    launch, persistent = dict(kernels.NORM_LAUNCH), dict(kernels.NORM_PERSISTENT)
    caps = dict(kernels.NORM_MAX_REGISTERS_CUDA)
    threshold = kernels.PERSISTENT_MIN_ROWS_PER_SM
    dim = 3072
    # The portable row beside the exact one where the exact epilogue was slower than torch.compile.
    # The uncapped row beside the register-capped launch (NORM_MAX_REGISTERS_CUDA) where the cap matters.
    for op, batch, tokens, preference, capped in (
            ("layernorm_modulate", 1, 4608, "auto", True), ("layernorm_modulate", 4, 4608, "auto", True),
            ("layernorm_modulate", 2, 4096, "auto", True), ("layernorm_modulate", 1, 1024, "auto", True),
            ("layernorm_modulate", 1, 1024, "auto", False), ("rmsnorm_scale_shift", 4, 4608, "auto", True),
            ("rmsnorm_scale_shift", 1, 1024, "auto", True), ("rmsnorm_scale_shift", 1, 1024, "auto", False),
            ("rmsnorm_scale_shift", 1, 1024, "portable", True)):
        kernels.NORM_MAX_REGISTERS_CUDA.clear()
        kernels.NORM_MAX_REGISTERS_CUDA.update(caps if capped else {})
        x = torch.randn(batch, tokens, dim, device=device, dtype=torch.bfloat16)
        emb = torch.randn(batch, 6 * dim, device=device, dtype=torch.bfloat16)
        shift, scale = emb.chunk(6, dim=1)[:2]
        weight = torch.randn(dim, device=device, dtype=torch.bfloat16)
        call = (functools.partial(layernorm_modulate, x, shift, scale) if op == "layernorm_modulate"
                else functools.partial(rmsnorm_scale_shift, x, weight, shift, scale))
        row = {"shape": f"{op} B{batch} L{tokens} D{dim}" + (" (portable)" if preference == "portable" else "")
                 + ("" if capped else " (no register cap)")}
        for rows, warps, per_sm, stages in ((4, 8, 0, 1), (2, 8, 0, 1), (1, 8, 0, 1), (4, 16, 0, 1), (2, 16, 0, 1),
                                            (1, 4, 0, 1), (2, 4, 0, 1), (4, 8, 2, 2), (4, 8, 1, 3),
                                            (2, 8, 2, 2), (2, 8, 2, 3), (2, 8, 4, 2), (1, 8, 4, 2)):
            kernels.NORM_LAUNCH[4096] = (rows, warps)
            kernels.NORM_PERSISTENT[4096] = (rows, warps, per_sm, stages)
            kernels.PERSISTENT_MIN_ROWS_PER_SM = 0 if per_sm else 2**40
            ops.forget_plans()  # launch plans are kept per class of call
            with guards.prefer(preference):
                row[f"{rows}x{warps} {per_sm}/SM x{stages}"] = round(graph_ms(call), 4)
        kernels.NORM_LAUNCH.update(launch)
        kernels.NORM_PERSISTENT.clear()
        kernels.NORM_PERSISTENT.update(persistent)
        kernels.PERSISTENT_MIN_ROWS_PER_SM = threshold
        kernels.NORM_MAX_REGISTERS_CUDA.update(caps)
        ops.forget_plans()
        print(json.dumps(row), flush=True)
        results.append(row)
    q = torch.randn(1, 4608, 24, 128, device=device, dtype=torch.bfloat16)
    w = torch.randn(128, device=device, dtype=torch.bfloat16)
    row = {"shape": "qk_rmsnorm B1 L4608 H24 D128"}
    for rows in (4, 8, 16, 32, 64):
        for warps in (2, 4, 8):
            kernels.NORM_LAUNCH[128] = (rows, warps)
            ops.forget_plans()
            row[f"{rows}x{warps}"] = round(graph_ms(lambda: qk_rmsnorm(q, q, w, w)), 4)
    kernels.NORM_LAUNCH.update(launch)
    ops.forget_plans()
    print(json.dumps(row), flush=True)
    results.append(row)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sweep")
    parser.add_argument("which", nargs="*", choices=["gdn", "gdn-launch", "norm"], default=["gdn", "norm"])
    parser.add_argument("--axis", action="append", help="gdn-launch: keep the axes whose name contains this")
    parser.add_argument("--case", action="append", help="gdn: keep the shapes whose name contains this")
    parser.add_argument("--segments", type=lambda text: tuple(int(n) for n in text.split(",")),
                        default=(1, 2, 4, 8, 16),
                        help="gdn: the segment counts to time beside the plan's, comma-separated")
    parser.add_argument("--gates", choices=GDN_GATES, help="gdn: the gates' family (default: the bench's)")
    args = parser.parse_args()
    which = args.which
    out = {}
    if "gdn" in which:
        out["gdn"] = sweep_gdn("cuda", args.case, args.segments, args.gates)
    if "norm" in which:
        out["norm"] = sweep_norm("cuda")
    if "gdn-launch" in which:
        out["gdn-launch"] = sweep_gdn_launch("cuda", args.axis)
    print(json.dumps(out))
