"""The >2^31-element check on a GPU: one long run vs the same tokens in chained pieces.

HV = 32, K = V = 128: q, k, v and o [1, T, 32, 128] pass 2^31 elements beyond 524,288 tokens.
An int32 offset there reads out of bounds or wraps. The long run takes the context-parallel
(segmented) path; each piece is below 2^31 elements, so the chained run is a reference that
needs no dense fp64 recurrence.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from polykernels import platform


def run_large_index_check(tokens: int = 2**31 // (32 * 128) + 4096, device: str = "cuda", segments: int = 4) -> dict:
    from polykernels.gated_delta_rule import chunk_gated_delta_rule
    from polykernels.gated_delta_rule.chunk import plan_segments

    heads, dim = 32, 128
    gen = torch.Generator(device=device).manual_seed(0)
    shape = (1, tokens, heads, dim)
    q = torch.randn(shape, device=device, dtype=torch.bfloat16, generator=gen)
    k = torch.nn.functional.normalize(torch.randn(shape, device=device, generator=gen), dim=-1).bfloat16()
    v = torch.randn(shape, device=device, dtype=torch.bfloat16, generator=gen)
    g = torch.nn.functional.logsigmoid(torch.randn(1, tokens, heads, device=device, generator=gen)) * 0.1
    beta = torch.rand(1, tokens, heads, device=device, generator=gen).sigmoid().bfloat16()
    start = time.perf_counter()
    full_o, full_state = chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)
    torch.cuda.synchronize()
    full_seconds = time.perf_counter() - start
    step = -(-tokens // segments // 64) * 64
    state, errors, sq_ref = None, 0.0, 0.0
    for begin in range(0, tokens, step):
        end = min(tokens, begin + step)
        o, state = chunk_gated_delta_rule(q[:, begin:end], k[:, begin:end], v[:, begin:end], g[:, begin:end],
                                          beta[:, begin:end], initial_state=state, output_final_state=True)
        errors += float((o.double() - full_o[:, begin:end].double()).pow(2).sum())
        sq_ref += float(o.double().pow(2).sum())
    plan = plan_segments(1, tokens, heads, platform.sm_count(torch.device(device)),
                         key_dim=dim, value_dim=dim)
    return {
        "tokens": tokens,
        "elements": tokens * heads * dim,
        "segments": plan.segments,
        "o_error": (errors / sq_ref) ** 0.5,
        "state_error": float((state - full_state).pow(2).mean().sqrt() / full_state.pow(2).mean().sqrt()),
        "full_run_seconds": round(full_seconds, 3),
        "device": torch.cuda.get_device_name(0),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=2**31 // (32 * 128) + 4096)
    print(json.dumps(run_large_index_check(parser.parse_args().tokens)))
