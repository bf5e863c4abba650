"""python -m benchmarks.gdn_accuracy [MAX_TOKENS] [--case TEXT] [--keys FAMILY]: bf16 error of ours and
FLA against the fp64 recurrence.

Relative RMS error (the spec's measure) of o and the final state at every benchmark shape, both
implementations on the same inputs; the goal is ours <= 1.5x FLA's. ``--keys``: the bench's random
keys, or keys that point one way under slowly decaying gates (registry.GDN_KEYS).
"""

from __future__ import annotations

import argparse
import importlib.util
import json

import torch

from benchmarks.registry import GDN_KEYS, GDN_SHAPES, gdn_boundaries, gdn_inputs


def relative_rms_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    diff = (actual.double() - expected.double()).pow(2).mean().sqrt()
    return float(diff / expected.double().pow(2).mean().sqrt().clamp_min(1e-30))


def main(max_tokens: int, cases: list[str] | None = None, keys: str = "random") -> list[dict]:
    from polykernels.gated_delta_rule import chunk_gated_delta_rule, naive_recurrent_gated_delta_rule

    fla = None
    if importlib.util.find_spec("fla") is not None:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla
    rows = []
    for name, batch, tokens, heads, value_heads, lengths in GDN_SHAPES:
        if batch * tokens > max_tokens or (cases and not any(text in name for text in cases)):
            continue
        inputs = gdn_inputs(batch, tokens, heads, value_heads, "cuda", keys=keys)
        cu = gdn_boundaries(lengths, "cuda")
        want_o, want_s = naive_recurrent_gated_delta_rule(*(t.double() for t in inputs), output_final_state=True,
                                                          cu_seqlens=cu)
        row = {"shape": name, "keys": keys}
        impls = {"polykernels": chunk_gated_delta_rule}
        if fla is not None:
            impls["FLA"] = fla
        for impl, fn in impls.items():
            o, state = fn(*inputs, output_final_state=True, cu_seqlens=cu)
            row[f"{impl} o"] = f"{relative_rms_error(o, want_o):.2e}"
            row[f"{impl} state"] = f"{relative_rms_error(state, want_s):.2e}"
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gdn_accuracy")
    parser.add_argument("max_tokens", nargs="?", type=int, default=1 << 30, help="skip shapes with more tokens")
    parser.add_argument("--case", action="append", help="only the shapes whose name contains this text")
    parser.add_argument("--keys", choices=GDN_KEYS, default="random", help="the inputs' key family")
    args = parser.parse_args()
    main(args.max_tokens, args.case, args.keys)
