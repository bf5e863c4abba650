"""python -m benchmarks.gdn_latency: each pass's GPU us at shapes chosen to time one chunk's latency.

One head, K = V = 128, bf16, uncut (``num_segments=1``), torch.profiler per kernel: 132 chunks give one
prepare program per SM of an H200 (the launch's time is about one chunk's prepare latency), 396 give
three per SM, and the sequential pass's two programs run alone on their SMs (its time over the chunks
is the state chain's time per chunk). What a fused forward's two halves would each take
(docs/gdn-performance.md, Next item 6).
"""

from __future__ import annotations

import json

import torch
from torch.profiler import ProfilerActivity, profile

SHAPES = (("132 chunks H1", 64 * 132, 1), ("396 chunks H1", 64 * 396, 1), ("512 chunks H1", 64 * 512, 1),
          ("132 chunks H2", 64 * 132, 2))


def main() -> dict[str, dict[str, float]]:
    from polykernels.gated_delta_rule import chunk_gated_delta_rule

    out: dict[str, dict[str, float]] = {}
    for name, tokens, heads in SHAPES:
        torch.manual_seed(0)
        q = torch.randn(1, tokens, heads, 128, device="cuda", dtype=torch.bfloat16)
        k, v = torch.randn_like(q), torch.randn_like(q)
        g = -torch.rand(1, tokens, heads, device="cuda") * 0.1
        beta = torch.rand(1, tokens, heads, device="cuda", dtype=torch.bfloat16)

        def call(q=q, k=k, v=v, g=g, beta=beta) -> object:
            return chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True, use_qk_l2norm_in_kernel=True,
                                          num_segments=1)

        for _ in range(3):
            call()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                call()
            torch.cuda.synchronize()
        out[name] = {event.key: round(event.device_time_total / event.count, 1) for event in prof.key_averages()
                     if event.key.startswith("gdn_")}
    return out


if __name__ == "__main__":
    print(json.dumps(main()))
