"""python -m benchmarks.plan_ab: a plan constant's values, or forced segment counts, in one process.

Where a change is only a plan's (a least chunk count, a form's table), two source trees (``benchmarks.ab_rounds``)
are more than it needs: an assignment to ``gated_delta_rule.launch`` takes effect at the next call (it drops the
cached recipes, and no launch program recorded before it is replayed). For each shape and gate family this
times the op under each value in turn, GPU ms under CUDA-graph replay (``do_bench_cudagraph``), and the largest
difference of o from the first value's. ``--segments`` forces ``num_segments`` instead (``default`` for the
plan's own count).

    python -m benchmarks.plan_ab --set CONCURRENT_PAIRS_MIN_CHUNKS=128,16 --shape 8,1024,2,8 --gates fast slow
    python -m benchmarks.plan_ab --segments default,2,3 --shape 1024+1024+1024+1024,2,8 --gates fast slow mixed
"""

from __future__ import annotations

import argparse
import ast
import json
from collections.abc import Iterator, Sequence
from pathlib import Path

from benchmarks.registry import GDN_GATES, gdn_shape


def parse_values(text: str) -> tuple[str, list[object]]:
    """``NAME=V1,V2,...`` (each value a Python literal) -> (NAME, [V1, V2, ...])."""
    name, _, values = text.partition("=")
    if not name.isidentifier() or not values:
        raise argparse.ArgumentTypeError(f"--set expects NAME=V1,V2,... got {text!r}")
    try:
        parsed = [ast.literal_eval(value) for value in values.split(",")]
    except (ValueError, SyntaxError) as error:
        raise argparse.ArgumentTypeError(f"--set {name}: values must be Python literals, got {values!r}") from error
    return name, parsed


def parse_segments(text: str) -> list[int | None]:
    """``default,2,3`` -> [None, 2, 3]: ``num_segments`` per run (None: the plan's own)."""
    counts: list[int | None] = []
    for part in text.split(","):
        if part == "default":
            counts.append(None)
        elif part.isdigit() and int(part) > 0:
            counts.append(int(part))
        else:
            raise argparse.ArgumentTypeError(f"--segments expects default or positive counts, got {part!r}")
    return counts


def variants(setting: tuple[str, list[object]] | None, segments: Sequence[int | None]) -> Iterator[dict]:
    """Each run's (constant value or forced count), the first the reference for the differences."""
    if setting is not None:
        name, values = setting
        for value in values:
            yield {"constant": name, "value": value, "num_segments": None}
    else:
        for count in segments:
            yield {"num_segments": count}


def run(shapes: Sequence[str], gates: Sequence[str], setting: tuple[str, list[object]] | None,
        segments: Sequence[int | None], out: Path | None) -> list[dict]:
    import torch
    from triton.testing import do_bench_cudagraph

    from benchmarks.registry import gdn_boundaries, gdn_inputs
    from polykernels.gated_delta_rule import chunk_gated_delta_rule, launch

    if setting is not None and not hasattr(launch, setting[0]):
        raise SystemExit(f"--set: gated_delta_rule.launch has no {setting[0]}")
    saved = getattr(launch, setting[0]) if setting is not None else None
    rows: list[dict] = []
    try:
        for spec in shapes:
            name, batch, tokens, heads, value_heads, lengths = gdn_shape(spec)
            cu = gdn_boundaries(lengths, "cuda")
            for family in gates:
                q, k, v, g, beta = gdn_inputs(batch, tokens, heads, value_heads, "cuda", gates=family)
                reference = None
                for variant in variants(setting, segments):
                    if setting is not None:
                        setattr(launch, setting[0], variant["value"])

                    def call(inputs: tuple = (q, k, v, g, beta), cu: torch.Tensor | None = cu,
                             count: int | None = variant["num_segments"]) -> tuple:
                        return chunk_gated_delta_rule(*inputs, output_final_state=True, cu_seqlens=cu,
                                                      num_segments=count)

                    o = call()[0].float()
                    reference = o if reference is None else reference
                    row = {"shape": name, "gates": family, **variant, "ms": do_bench_cudagraph(call, rep=200),
                           "max_difference": (o - reference).abs().max().item()}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        if setting is not None:
            setattr(launch, setting[0], saved)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plan_ab", description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--set", type=parse_values, help="NAME=V1,V2,...: a gated_delta_rule.launch constant's values")
    what.add_argument("--segments", type=parse_segments, help="default,N,...: num_segments forced per run")
    parser.add_argument("--shape", action="append", required=True, help="B,T,H,HV or L1+L2+...,H,HV")
    parser.add_argument("--gates", nargs="+", choices=GDN_GATES, default=["fast"])
    parser.add_argument("--out", type=Path, help="write the rows here as JSON lines")
    args = parser.parse_args(argv)
    for spec in args.shape:
        gdn_shape(spec)  # a bad shape fails before anything is timed
    run(args.shape, args.gates, args.set, args.segments or [None], args.out)


if __name__ == "__main__":
    main()
