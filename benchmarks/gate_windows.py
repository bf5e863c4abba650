"""python -m benchmarks.gate_windows [--max-chunks W] [--log2-bound B] [--tokens T]: how far back each segment
of a cut sequence must look under each gate family, and what dropping the rest changes.

A segment's end state is M_w h_w + s_w: s_w what its last w chunks leave from a zero state, h_w the state
where they start and M_w their transition, the product over their tokens of gamma_t (I - beta_t k_t k_t^T).
Each factor's norm is at most gamma_t max(1, |1 - beta_t ||k_t||^2|), so ||M_w|| <= 2^b, b the sum over the
w chunks of log2 of the chunk's decay and of those factors (docs/gdn-performance.md, item 15). The window is
the fewest last chunks (at most ``max_chunks``) with b <= ``log2_bound``; a segment without one runs whole.

Per bench shape the plan cuts without the lead form (one wave of segments), and per gate family
(registry.GDN_GATES): how many segments find a window and how long the longest is, from the bench's own
inputs (on this CPU). Then, in fp64 at ``tokens`` tokens: the relative RMS difference between the
recurrence and the same recurrence with each segment started from its window's zero state.
"""

from __future__ import annotations

import argparse
import json
import math

import torch

from benchmarks.registry import GDN_GATES, GDN_SHAPES, gdn_inputs
from polykernels.gated_delta_rule.launch import CHUNK, plan_segments


def chunk_log2_bounds(k: torch.Tensor, g: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """[B, chunks, HV]: per chunk and value head, log2 of the bound on its transition's norm (value head i
    reads key head i // (HV // H)); a chunk of fewer tokens counts the tokens it has."""
    batch, tokens, value_heads = g.shape
    squared = k.double().pow(2).sum(-1).repeat_interleave(value_heads // k.shape[2], dim=2)
    growth = (1.0 - beta.double() * squared).abs().clamp_min(1.0).log2()
    per_token = g.double() / math.log(2) + growth
    padded = torch.nn.functional.pad(per_token, (0, 0, 0, -tokens % CHUNK))
    return padded.view(batch, -1, CHUNK, value_heads).sum(2)


def windows(bounds: torch.Tensor, segment_chunks: int, max_chunks: int, log2_bound: float) -> torch.Tensor:
    """[B, segments - 1, HV]: each segment's window in chunks (every segment but each sequence's last, whose
    state no later segment reads), or 0 where none is within ``max_chunks`` chunks."""
    batch, chunks, value_heads = bounds.shape
    found = []
    for first in range(0, chunks - segment_chunks, segment_chunks):
        last = min(first + segment_chunks, chunks)
        tail = bounds[:, max(first, last - max_chunks):last].flip(1).cumsum(1)  # windows of 1, 2, ... chunks
        inside = tail <= log2_bound
        found.append(torch.where(inside.any(1), inside.double().argmax(1) + 1, 0))
    return torch.stack(found, 1) if found else torch.zeros(batch, 0, value_heads, dtype=torch.long)


def windowed_difference(inputs: tuple, segments: int, max_chunks: int, log2_bound: float) -> float:
    """Relative RMS difference (o) between the fp64 recurrence of one sequence and the same with every segment
    after the first started from a zero state at its predecessor's window (the whole past where none)."""
    from polykernels.gated_delta_rule import naive_recurrent_gated_delta_rule

    q, k, v, g, beta = (t.double() for t in inputs)
    tokens = q.shape[1]
    whole, _ = naive_recurrent_gated_delta_rule(q, k, v, g, beta, output_final_state=False)
    segment_chunks = -(-tokens // CHUNK // segments)
    found = windows(chunk_log2_bounds(k, g, beta), segment_chunks, max_chunks, log2_bound)
    cut = torch.empty_like(whole)
    for s in range(segments):
        first, last = s * segment_chunks * CHUNK, min((s + 1) * segment_chunks * CHUNK, tokens)
        for head in range(v.shape[2]):
            window = int(found[0, s - 1, head]) if s else 0
            start = first - window * CHUNK if s and window else 0
            part = (slice(None), slice(start, last))
            key_head = head // (v.shape[2] // q.shape[2])
            o, _ = naive_recurrent_gated_delta_rule(
                q[part][:, :, key_head:key_head + 1], k[part][:, :, key_head:key_head + 1],
                v[part][:, :, head:head + 1], g[part][:, :, head:head + 1], beta[part][:, :, head:head + 1])
            cut[:, first:last, head] = o[:, first - start:, 0]
    return float((cut - whole).pow(2).mean().sqrt() / whole.pow(2).mean().sqrt())


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gate_windows", description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-chunks", type=int, default=32, help="the longest window (default 32)")
    parser.add_argument("--log2-bound", type=float, default=-30.0, help="the bound, log2 (default -30)")
    parser.add_argument("--tokens", type=int, default=8192, help="tokens of the fp64 comparison (default 8192)")
    args = parser.parse_args(argv)
    rows = []
    for name, batch, tokens, heads, value_heads, lengths in GDN_SHAPES:
        plan = plan_segments(batch, batch * tokens, value_heads, 132, register_tiles=(64,))
        if lengths is not None or plan.segments < 2:
            continue
        for gates in GDN_GATES:
            _, k, _, g, beta = gdn_inputs(batch, tokens, heads, value_heads, "cpu", gates=gates)
            found = windows(chunk_log2_bounds(k, g, beta), plan.segment_chunks, args.max_chunks, args.log2_bound)
            rows.append({"shape": name, "gates": gates, "segments": plan.segments,
                         "segment_chunks": plan.segment_chunks, "windows": int((found > 0).sum()),
                         "of": found.numel(), "longest": int(found.max()) if found.numel() else 0})
            print(json.dumps(rows[-1]), flush=True)
    for gates in GDN_GATES:
        inputs = gdn_inputs(1, args.tokens, 2, 8, "cpu", gates=gates)
        difference = windowed_difference(inputs, 4, args.max_chunks, args.log2_bound)
        rows.append({"tokens": args.tokens, "gates": gates, "segments": 4, "o_difference": difference})
        print(json.dumps(rows[-1]), flush=True)
    return rows


if __name__ == "__main__":
    main()
