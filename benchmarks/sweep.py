"""python -m benchmarks.sweep [gdn|norm]: the launch choices the tables in the kernels come from.

GDN: GPU time per segments-per-sequence choice at the benchmark shapes (what PROGRAMS_PER_SM and
MIN_SEGMENT_CHUNKS in gated_delta_rule/chunk.py encode). Norms: GPU time per (rows per program,
num_warps) at each FLUX row width (norm/kernels.py: NORM_LAUNCH).
"""

from __future__ import annotations

import functools
import json
import sys

import torch

from benchmarks.registry import GDN_SHAPES, gdn_inputs
from benchmarks.timing import graph_ms


def sweep_gdn(device: str) -> list[dict]:
    from polykernels.gated_delta_rule import chunk_gated_delta_rule
    from polykernels.gated_delta_rule.chunk import plan_segments

    results = []
    for name, batch, tokens, heads, value_heads, lengths in GDN_SHAPES:
        q, k, v, g, beta = gdn_inputs(batch, tokens, heads, value_heads, device)
        cu = None
        if lengths is not None:
            cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device=device, dtype=torch.int32)
        num_seqs = batch if cu is None else len(lengths)
        auto = plan_segments(num_seqs, batch * tokens, value_heads,
                             torch.cuda.get_device_properties(device).multi_processor_count)
        row = {"shape": name, "auto": auto.segments}
        for segments in (1, 2, 4, 8, 16):
            if segments > tokens // num_seqs // 64:
                continue
            ms = graph_ms(functools.partial(chunk_gated_delta_rule, q, k, v, g, beta, output_final_state=True,
                                            cu_seqlens=cu, num_segments=segments))
            row[str(segments)] = round(ms, 4)
        print(json.dumps(row), flush=True)
        results.append(row)
    return results


def sweep_gdn_launch(device: str) -> list[dict]:
    """GPU time per (BV, num_warps, num_stages) of the fused kernels, and where the time goes."""
    from polykernels.gated_delta_rule import chunk, chunk_gated_delta_rule

    results = []
    original = dict(chunk.FUSED_LAUNCH)
    shapes = [("B8 T4096 H32/32", 8, 4096, 32, 32, 1), ("1x32768 H2/8", 1, 32768, 2, 8, 8),
              ("B1 T32768 H32/32", 1, 32768, 32, 32, 4)]
    for name, batch, tokens, heads, value_heads, segments in shapes:
        q, k, v, g, beta = gdn_inputs(batch, tokens, heads, value_heads, device)
        call = functools.partial(chunk_gated_delta_rule, q, k, v, g, beta, output_final_state=True,
                                 num_segments=segments)
        row = {"shape": name, "segments": segments}
        for config in ((64, 4, 1), (64, 4, 2), (64, 8, 1), (32, 4, 1)):
            chunk.FUSED_LAUNCH[128] = config
            row["x".join(map(str, config))] = round(graph_ms(call), 4)
        chunk.FUSED_LAUNCH.update(original)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                call()
            torch.cuda.synchronize()
        row["kernels_us"] = {e.key[:40]: round(e.device_time_total / 3, 1) for e in prof.key_averages()
                             if e.device_time_total > 0}
        print(json.dumps(row), flush=True)
        results.append(row)
    return results


def sweep_norm(device: str) -> list[dict]:
    from polykernels.norm import kernels, layernorm_modulate, qk_rmsnorm

    results = []
    original = dict(kernels.NORM_LAUNCH)
    dim = 3072
    for batch, tokens in ((1, 4608), (4, 4608), (1, 1024)):
        x = torch.randn(batch, tokens, dim, device=device, dtype=torch.bfloat16)
        emb = torch.randn(batch, 6 * dim, device=device, dtype=torch.bfloat16)
        shift, scale = emb.chunk(6, dim=1)[:2]
        row = {"shape": f"layernorm_modulate B{batch} L{tokens} D{dim}"}
        for rows in (1, 2, 4):
            for warps in (4, 8, 16):
                kernels.NORM_LAUNCH[4096] = (rows, warps)
                row[f"{rows}x{warps}"] = round(graph_ms(functools.partial(layernorm_modulate, x, shift, scale)), 4)
        kernels.NORM_LAUNCH.update(original)
        print(json.dumps(row), flush=True)
        results.append(row)
    q = torch.randn(1, 4608, 24, 128, device=device, dtype=torch.bfloat16)
    w = torch.randn(128, device=device, dtype=torch.bfloat16)
    row = {"shape": "qk_rmsnorm B1 L4608 H24 D128"}
    for rows in (4, 8, 16, 32, 64):
        for warps in (2, 4, 8):
            kernels.NORM_LAUNCH[128] = (rows, warps)
            row[f"{rows}x{warps}"] = round(graph_ms(lambda: qk_rmsnorm(q, q, w, w)), 4)
    kernels.NORM_LAUNCH.update(original)
    print(json.dumps(row), flush=True)
    results.append(row)
    return results


if __name__ == "__main__":
    which = sys.argv[1:] or ["gdn", "norm"]
    out = {}
    if "gdn" in which:
        out["gdn"] = sweep_gdn("cuda")
    if "norm" in which:
        out["norm"] = sweep_norm("cuda")
    if "gdn-launch" in which:
        out["gdn-launch"] = sweep_gdn_launch("cuda")
    print(json.dumps(out))
