"""python -m benchmarks.gdn_ab LABEL (--save DIR | --compare DIR) [--case TEXT] [--shape SPEC]: A/B of two trees.

A kernel change is kept or dropped on an A/B run: the tree before it and the tree after it, each
in its own process on the same GPU, at the bench's GDN shapes (``--shape``: others too). The first
run saves its outputs; every later run compares with them (largest |difference| of o and of the
final state, and whether a second call gives the same bits) beside its own times: GPU ms under
CUDA-graph replay, eager ms, and each kernel's time from torch.profiler. One JSON row per run::

    git worktree add ../base <commit before the change>
    PYTHONPATH=../base/src:. python -m benchmarks.gdn_ab base --save build/ab
    PYTHONPATH=src:. python -m benchmarks.gdn_ab change --compare build/ab

Run the pair twice, alternating, before believing a difference of a few percent (BENCHMARKS.md
holds the runs this decided).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from benchmarks.registry import GDN_GATES


def largest_difference(got: torch.Tensor, saved: torch.Tensor) -> float:
    """max |got - saved| (NaN where exactly one of them is NaN counts as infinite)."""
    got, saved = got.detach().cpu().double(), saved.double()
    same_nan = torch.isnan(got) & torch.isnan(saved)
    diff = torch.where(same_nan, 0.0, (got - saved).abs().nan_to_num(nan=float("inf")))
    return float(diff.max()) if diff.numel() else 0.0


def kernel_us(call: object, repeats: int = 5) -> dict[str, float]:
    """Mean GPU time per call of each kernel the call launches (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            call()
        torch.cuda.synchronize()
    return {event.key: round(event.device_time_total / repeats, 1) for event in prof.key_averages()
            if event.key.startswith("gdn_")}


def shapes(cases: list[str] | None, extra: list[str] | None = None) -> list:
    """The bench's shapes whose names hold a ``cases`` text (all of them without cases or ``extra``), then the
    ``extra`` ones (registry.gdn_shape's specs)."""
    from benchmarks.registry import GDN_SHAPES, gdn_shape

    picked = [shape for shape in GDN_SHAPES if (cases and any(text in shape[0] for text in cases))
              or (not cases and not extra)]
    return picked + [gdn_shape(spec) for spec in extra or []]


def run(label: str, folder: Path, save: bool, cases: list[str] | None, gates: str | None = None,
        initial: bool = False, extra: list[str] | None = None) -> dict:
    """One tree's row; ``initial``: every call starts from a random fp32 initial state (a chunked prefill's)."""
    from benchmarks.registry import gdn_boundaries, gdn_inputs
    from benchmarks.timing import graph_ms, median_ms
    from polykernels.gated_delta_rule import chunk_gated_delta_rule

    row: dict = {"label": label, "device": torch.cuda.get_device_name(), "gates": gates or "the bench's",
                 "initial state": initial}
    started = time.perf_counter()
    folder.mkdir(parents=True, exist_ok=True)
    for name, batch, tokens, heads, value_heads, lengths in shapes(cases, extra):
        q, k, v, g, beta = gdn_inputs(batch, tokens, heads, value_heads, "cuda", gates=gates)
        cu = gdn_boundaries(lengths, "cuda")
        sequences = batch if lengths is None else len(lengths)
        h0 = (torch.randn(sequences, value_heads, k.shape[-1], v.shape[-1], device="cuda",
                          generator=torch.Generator(device="cuda").manual_seed(1)) if initial else None)

        def call(q=q, k=k, v=v, g=g, beta=beta, cu=cu, h0=h0):
            return chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu)

        o, state = call()
        torch.cuda.synchronize()
        path = folder / (name.replace(" ", "_").replace("/", "-") + (f"-{gates}" if gates else "")
                         + ("-initial" if initial else "") + ".pt")
        if save:
            torch.save((o.cpu(), state.cpu()), path)
        else:
            saved_o, saved_state = torch.load(path)
            again_o, again_state = call()
            row[f"{name} max|do|"] = largest_difference(o, saved_o)
            row[f"{name} max|dstate|"] = largest_difference(state, saved_state)
            row[f"{name} repeat equal"] = bool(torch.equal(again_o, o) and torch.equal(again_state, state))
        row[f"{name} GPU ms"] = round(graph_ms(call), 4)
        row[f"{name} eager ms"] = round(median_ms(call), 4)
        row.update({f"{name} {kernel} us": us for kernel, us in kernel_us(call).items()})
    row["seconds"] = round(time.perf_counter() - started, 1)
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gdn_ab")
    parser.add_argument("label", help="names this tree in the output row")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--save", type=Path, metavar="DIR", help="keep this tree's outputs here (the base run)")
    where.add_argument("--compare", type=Path, metavar="DIR", help="compare with the outputs saved here")
    parser.add_argument("--case", action="append", help="only the shapes whose name contains this text")
    parser.add_argument("--gates", choices=GDN_GATES, help="the gates' family (benchmarks.registry.GDN_GATES; "
                        "default: the bench's)")
    parser.add_argument("--initial", action="store_true", help="every call from a random initial state")
    parser.add_argument("--shape", action="append", metavar="SPEC", help="also this shape, B,T,H,HV or "
                        "L1+L2+...,H,HV (packed lengths); without --case only these")
    args = parser.parse_args(argv)
    try:
        shapes(args.case, args.shape)
    except ValueError as error:
        parser.error(str(error))
    print(json.dumps(run(args.label, args.save or args.compare, args.save is not None, args.case, args.gates,
                         args.initial, args.shape)), flush=True)


if __name__ == "__main__":
    main()
