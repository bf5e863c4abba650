"""python -m benchmarks.profile_target gdn B T H HV: a process for a profiler to attach to.

Runs one op at one shape three times (the first compiles; profile the later ones with
``--launch-skip``) on the bench's inputs, then synchronizes. See ``benchmarks.stall_report``.
"""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> None:
    import torch

    from benchmarks.registry import gdn_inputs
    from polykernels.gated_delta_rule import chunk_gated_delta_rule

    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_target")
    parser.add_argument("op", choices=["gdn"])
    for name in ("batch", "tokens", "heads", "value_heads"):
        parser.add_argument(name, type=int)
    args = parser.parse_args(argv)
    q, k, v, g, beta = gdn_inputs(args.batch, args.tokens, args.heads, args.value_heads, "cuda")
    for _ in range(3):
        chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
