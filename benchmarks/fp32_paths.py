"""python -m benchmarks.fp32_paths [--shape B,T,H,HV ...] [--dim K] [--out FILE]: fp32 inputs, three ways.

fp32 inputs run the Triton passes with IEEE products on GPUs where K is at most guards.FP32_TRITON_MAX_KEY_DIM
(the exact path: the spec bounds its error at 1e-4), and the chunked torch implementation above it. On sm_90 those
IEEE products unroll into FMA and spill thousands of instructions inside the chunk loop (docs/gdn-performance.md,
item 28), so which is faster is a measurement: this times, per shape, each form in its own process (the path and
the recipes are cached per process), GPU ms under ``do_bench`` and the relative RMS error of o and of the final
state against the fp64 recurrence (for shapes of at most ``--error-tokens`` tokens: it runs token by token).

Forms: ``ieee`` (the default), ``tf32x3`` (the same passes, their fp32 products as three TF32 ones, what the
prepare pass of fp32 inputs takes on NVIDIA), ``torch`` (guards.FP32_TRITON_MAX_KEY_DIM = 0).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks.gdn_accuracy import relative_rms_error
from benchmarks.registry import gdn_shape

REPOSITORY = Path(__file__).resolve().parents[1]
FORMS = ("ieee", "tf32x3", "torch")
SHAPES = ("1,8192,8,8", "4,4096,16,16", "1,16384,2,8", "8,4096,32,32")


def apply(form: str) -> None:
    """Points this process's fp32 inputs at ``form`` (before the op's first call: its path is cached)."""
    from polykernels.gated_delta_rule import guards

    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    if form == "torch":
        guards.FP32_TRITON_MAX_KEY_DIM = 0
    elif form == "tf32x3":
        ieee = guards.dot_precision
        guards.dot_precision = lambda fp32_inputs: "tf32x3" if fp32_inputs else ieee(fp32_inputs)


def measure(form: str, shapes: Sequence[str], dim: int, error_tokens: int) -> list[dict]:
    """Every shape through the op in ``form`` (this process), one JSON row each on stdout."""
    apply(form)
    from triton.testing import do_bench

    from benchmarks.registry import gdn_boundaries, gdn_inputs
    from polykernels.gated_delta_rule import chunk_gated_delta_rule, naive_recurrent_gated_delta_rule

    rows = []
    for spec in shapes:
        name, batch, tokens, heads, value_heads, lengths = gdn_shape(spec)
        cu = gdn_boundaries(lengths, "cuda")
        inputs = [t.float() for t in gdn_inputs(batch, tokens, heads, value_heads, "cuda", dim=dim)]

        def call(inputs: list = inputs, cu: object = cu) -> tuple:
            return chunk_gated_delta_rule(*inputs, output_final_state=True, cu_seqlens=cu)

        o, state = call()
        row: dict = {"form": form, "shape": f"{name} K=V={dim} fp32", "ms": round(do_bench(call, rep=300), 4)}
        if batch * tokens <= error_tokens:
            want_o, want_state = naive_recurrent_gated_delta_rule(*(t.double() for t in inputs),
                                                                  output_final_state=True, cu_seqlens=cu)
            row["o error"] = relative_rms_error(o, want_o)
            row["state error"] = relative_rms_error(state, want_state)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def run(forms: Sequence[str], shapes: Sequence[str], dim: int, error_tokens: int, out: Path | None) -> list[dict]:
    """Each form in a process of its own; the rows of all, and a table of them."""
    rows = []
    for form in forms:
        command = [sys.executable, "-m", "benchmarks.fp32_paths", "--form", form, "--dim", str(dim),
                   "--error-tokens", str(error_tokens), *[arg for spec in shapes for arg in ("--shape", spec)]]
        # The child imports what this process imports (benchmarks and polykernels from the same places).
        done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=REPOSITORY,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)})
        if done.returncode:
            print(f"{form}: exit {done.returncode}\n{done.stderr[-3000:]}", file=sys.stderr)
        rows += [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    print("| shape | form | ms | o error | state error |\n|---|---|---:|---:|---:|")
    for row in sorted(rows, key=lambda row: (row["shape"], FORMS.index(row["form"]))):
        errors = [f"{row[key]:.2e}" if key in row else "" for key in ("o error", "state error")]
        print(f"| {row['shape']} | {row['form']} | {row['ms']:.3f} | {errors[0]} | {errors[1]} |")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fp32_paths", description=__doc__.splitlines()[0])
    parser.add_argument("--shape", action="append", help=f"B,T,H,HV or L1+L2+...,H,HV (default: {SHAPES})")
    parser.add_argument("--dim", type=int, default=128, choices=(64, 128, 256), help="K = V (default 128)")
    parser.add_argument("--forms", nargs="+", choices=FORMS, default=list(FORMS))
    parser.add_argument("--form", choices=FORMS, help=argparse.SUPPRESS)  # one form, in this process
    parser.add_argument("--error-tokens", type=int, default=16384, help="error against fp64 up to these tokens")
    parser.add_argument("--out", type=Path, help="write the rows here as JSON lines")
    args = parser.parse_args(argv)
    shapes = args.shape or list(SHAPES)
    for spec in shapes:
        gdn_shape(spec)  # a bad shape fails before anything is timed
    if args.form:
        measure(args.form, shapes, args.dim, args.error_tokens)
    else:
        run(args.forms, shapes, args.dim, args.error_tokens, args.out)


if __name__ == "__main__":
    main()
