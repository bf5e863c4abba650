"""python -m benchmarks.sustained [B T H HV] [--calls N] [--replays R]: the gated delta rule (ours and FLA)
replayed back to back from one CUDA graph, with the GPU's SM clock, power and clock-event reasons
sampled by ``nvidia-smi`` alongside.

Why: the bench's GPU column replays a graph of many calls back to back, its eager column runs one call
at a time between cache flushes. A kernel that draws the board's power limit is slowed by the clock
the driver then sets, and only the back-to-back clock shows it. Prints one JSON line per implementation:
the time per call of every replay, and the samples summarized (``summarize``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence

# nvidia-smi's clock-event reason bit for the software power cap (nvmlClocksEventReasonSwPowerCap).
SW_POWER_CAP = 0x4
QUERY = "clocks.sm,power.draw,clocks_event_reasons.active"


def summarize(lines: Sequence[str]) -> dict[str, object]:
    """``nvidia-smi --query-gpu=QUERY --format=csv,noheader`` lines: the SM clock's range, the largest
    power draw, and how many samples had the power cap holding the clock down."""
    clocks, power, capped = [], [], 0
    for line in lines:
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != 3:
            continue
        clocks.append(int(fields[0].split()[0]))
        power.append(float(fields[1].split()[0]))
        capped += bool(int(fields[2], 16) & SW_POWER_CAP)
    if not clocks:
        return {"samples": 0}
    return {"samples": len(clocks), "sm_clock_mhz_min": min(clocks), "sm_clock_mhz_max": max(clocks),
            "power_w_max": max(power), "power_capped_samples": capped}


def sustained(fn: Callable[[], object], calls: int, replays: int) -> dict[str, object]:
    import torch

    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    time.sleep(2.0)  # start from an idle GPU
    sampler = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", "-lms", "50"],
                               stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    per_call = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        per_call.append(round(start.elapsed_time(end) / calls, 4))
    sampler.terminate()
    samples = sampler.communicate()[0].strip().splitlines()
    return {"ms_per_call_mean": round(statistics.mean(per_call), 4), "ms_per_call_min": min(per_call),
            "ms_per_call_max": max(per_call), "ms_per_call": per_call, **summarize(samples)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sustained")
    parser.add_argument("shape", type=int, nargs="*", default=[1, 32768, 32, 32], help="B T H HV")
    parser.add_argument("--calls", type=int, default=16, help="calls captured in the graph")
    parser.add_argument("--replays", type=int, default=60)
    args = parser.parse_args(argv)
    from benchmarks.registry import gdn_inputs
    from polykernels.gated_delta_rule import chunk_gated_delta_rule

    impls = {"polykernels": chunk_gated_delta_rule}
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla

        impls["FLA"] = fla
    except ImportError:
        pass
    q, k, v, g, beta = gdn_inputs(*args.shape, "cuda")
    for name, op in impls.items():
        row = sustained(lambda op=op: op(q, k, v, g, beta, output_final_state=True), args.calls, args.replays)
        print(json.dumps({"impl": name, "shape": args.shape, "calls": args.calls, **row}), flush=True)


if __name__ == "__main__":
    main()
