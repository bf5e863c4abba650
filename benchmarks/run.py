"""python -m benchmarks.run [--only int4|norm|gdn] [--case TEXT] [--out DIR]: time every row, write table + plot.

Each row is appended to DIR/rows.jsonl as soon as it is measured (after one line describing the run:
device, versions, copy roofline, launch floor), so a run cut short (a time limit on a lent GPU) keeps
what it measured; ``--case`` (repeatable) runs the cases whose name contains the text, to split one
family over several runs. ``--render DIR [DIR ...]`` writes the table and plot from those logs
instead of timing anything: one table from runs split by a time limit, on one device and versions.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import torch

from benchmarks.registry import FAMILIES
from benchmarks.timing import copy_bandwidth_gbs, graph_ms, host_us, launch_floor_us, median_ms


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": sys.version.split()[0], "cuda": torch.version.cuda,
                                    "hip": getattr(torch.version, "hip", None)}
    for name in ("torch", "triton", "polykernels", "fla-core", "liger-kernel"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def _time(fn: object, clock: object, label: str) -> float | None:
    try:
        return clock(fn)
    except Exception as exc:  # a peer that fails to run (or to be captured) is reported, not fatal
        print(f"{label}: {type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr)
        return None


def bench_command(argv: list[str]) -> str:
    """The command as a record states it: what chose the rows, not the folder they went to (a host's path)."""
    kept = [arg for i, arg in enumerate(argv) if arg != "--out" and not arg.startswith("--out=")
            and (i == 0 or argv[i - 1] != "--out")]
    return " ".join(["nox -s bench", *(["--", *kept] if kept else [])])


def run(families: list[str], device: str, cases: list[str] | None = None,
        rows_log: Path | None = None) -> dict[str, object]:
    copy = copy_bandwidth_gbs(device)
    floor = launch_floor_us(device)
    about = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "device": torch.cuda.get_device_name(0),
             "versions": versions(), "copy_gb_per_s": round(copy, 1), "launch_floor_host_us": round(floor, 1),
             "command": bench_command(sys.argv[1:])}
    if rows_log is not None:
        with rows_log.open("a") as log:
            log.write(json.dumps({"run": about}) + "\n")
    rows = []
    for family in families:
        for case in FAMILIES[family](device):
            if cases and not any(text in case.name for text in cases):
                continue
            times = {}
            for impl, fn in case.implementations.items():
                label = f"{case.family} {case.name} {impl}"
                times[impl] = (_time(fn, median_ms, label + " (eager)"), _time(fn, graph_ms, label + " (graph)"),
                               _time(fn, host_us, label + " (host)"))
            ours_eager, ours_graph, _ = times.get("polykernels", (None, None, None))
            for impl, (eager, graph, host) in times.items():
                best = graph or eager
                if best is None:
                    continue
                gbs = case.bytes_moved / (best * 1e-3) / 1e9
                rows.append({
                    "family": case.family, "case": case.name, "impl": impl,
                    "eager_ms": round(eager, 4) if eager else None, "graph_ms": round(graph, 4) if graph else None,
                    "host_us": round(host, 1) if host else None,
                    "gb_per_s": round(gbs, 1), "pct_of_copy": round(100 * gbs / copy, 1),
                    "tflop_per_s": round(case.flops / (best * 1e-3) / 1e12, 1) if case.flops else None,
                    "polykernels_speedup_eager": round(eager / ours_eager, 2) if eager and ours_eager else None,
                    "polykernels_speedup_graph": round(graph / ours_graph, 2) if graph and ours_graph else None,
                })
                if rows_log is not None:
                    with rows_log.open("a") as log:
                        log.write(json.dumps({**rows[-1], "copy_gb_per_s": round(copy, 1),
                                              "launch_floor_host_us": round(floor, 1),
                                              "date": datetime.now(timezone.utc).isoformat(timespec="seconds")})
                                  + "\n")
                print(f"{case.family:22} {case.name:36} {impl:32} eager {eager or float('nan'):8.4f} ms  "
                      f"graph {graph or float('nan'):8.4f} ms  host {host or float('nan'):6.1f} us {gbs:8.1f} GB/s",
                      flush=True)
            torch.cuda.empty_cache()
    return {**about, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "rows": rows}


_RUN_FIELDS = ("copy_gb_per_s", "launch_floor_host_us", "date")  # what each row line repeats of its run


def render(logs: list[Path]) -> dict[str, object]:
    """One result from the rows.jsonl of one or more runs (``run``'s logs), as ``run`` returns it.

    The runs must share a device and versions: a table mixes no GPUs and no releases. Rows keep the
    roofline percentages of their own run; the result lists every run (its date, roofline, launch
    floor and command)."""
    runs: list[dict] = []
    rows: list[dict] = []
    for log in logs:
        lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        if not lines or "run" not in lines[0]:
            raise ValueError(f"{log}: not a rows log of benchmarks.run (its first line describes the run)")
        for line in lines:
            if "run" in line:
                runs.append(line["run"])
            else:
                rows.append({key: value for key, value in line.items() if key not in _RUN_FIELDS})
    for field in ("device", "versions"):
        seen = {json.dumps(run_[field], sort_keys=True) for run_ in runs}
        if len(seen) > 1:
            raise ValueError(f"the logs come from runs with different {field}: {sorted(seen)}")
    if not rows:
        raise ValueError(f"no rows measured in {[str(log) for log in logs]}")
    return {"date": max(run_["date"] for run_ in runs), "device": runs[0]["device"], "versions": runs[0]["versions"],
            "copy_gb_per_s": max(run_["copy_gb_per_s"] for run_ in runs),
            "launch_floor_host_us": max(run_["launch_floor_host_us"] for run_ in runs),
            "command": "; ".join(dict.fromkeys(run_["command"] for run_ in runs)), "runs": runs, "rows": rows}


def _cell(value: object) -> str:
    return "" if value is None else str(value)


def to_markdown(result: dict[str, object]) -> str:
    runs: list[dict] = list(result.get("runs") or [])  # type: ignore[call-overload]
    split = [f"Rows from {len(runs)} runs on one device, each row's % of copy from its own run: "
             + "; ".join(f"{run_['date']} (copy {run_['copy_gb_per_s']} GB/s, launch floor "
                         f"{run_['launch_floor_host_us']} us)" for run_ in runs) + ".", ""] if len(runs) > 1 else []
    lines = [*split,
        f"Measured {result['date']} on {result['device']}; versions {json.dumps(result['versions'])}; "
        f"copy roofline {result['copy_gb_per_s']} GB/s; host time of a one-kernel torch op "
        f"{result['launch_floor_host_us']} us (the launch floor); same run. Command: `{result['command']}`.",
        "GB/s, % of copy and TFLOP/s from the CUDA-graph (GPU) time; speedup = peer time / polykernels time.",
        "",
        "| op | case | implementation | eager ms | GPU ms | host us | GB/s | % of copy | TFLOP/s "
        "| polykernels speedup (eager) | (GPU) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["rows"]:  # type: ignore[union-attr]
        cells = [row["family"], row["case"], row["impl"], row["eager_ms"], row["graph_ms"], row["host_us"],
                 row["gb_per_s"], row["pct_of_copy"], row["tflop_per_s"], row["polykernels_speedup_eager"],
                 row["polykernels_speedup_graph"]]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def plot(result: dict[str, object], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]  # type: ignore[assignment]
    labels = [f"{r['family']}\n{r['case']}\n{r['impl']}" for r in rows]
    values = [r["gb_per_s"] for r in rows]
    colors = ["tab:blue" if r["impl"].startswith("polykernels") else "tab:gray" for r in rows]
    fig, ax = plt.subplots(figsize=(max(8, 0.5 * len(rows)), 6))
    ax.bar(range(len(rows)), values, color=colors)
    ax.axhline(result["copy_gb_per_s"], color="tab:red", linestyle="--", label="device copy (roofline)")
    ax.set_xticks(range(len(rows)), labels, rotation=90, fontsize=6)
    ax.set_ylabel("achieved GB/s (bytes a perfect kernel moves / time)")
    ax.set_title(f"{result['device']} — {result['date']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run")
    parser.add_argument("--only", action="append", choices=sorted(FAMILIES))
    parser.add_argument("--case", action="append", help="run only the cases whose name contains this text")
    parser.add_argument("--out", type=Path, default=Path("build/bench"))
    parser.add_argument("--render", nargs="+", type=Path, metavar="DIR",
                        help="write the table and plot from these runs' DIR/rows.jsonl; time nothing")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.render:
        try:
            result = render([folder / "rows.jsonl" for folder in args.render])
        except (OSError, ValueError) as error:
            parser.error(str(error))
        return _write(result, args.out)
    if not torch.cuda.is_available():
        print("bench needs a CUDA or ROCm GPU; torch sees none", file=sys.stderr)
        return 2
    return _write(run(args.only or list(FAMILIES), "cuda", args.case, args.out / "rows.jsonl"), args.out)


def _write(result: dict[str, object], out: Path) -> int:
    (out / "results.json").write_text(json.dumps(result, indent=2))
    (out / "results.md").write_text(to_markdown(result))
    written = "results.json, results.md"
    if importlib.util.find_spec("matplotlib") is not None:
        plot(result, out / "bandwidth.png")
        written += ", bandwidth.png"
    else:  # a build host rendering fetched logs may lack it; the GPU host's bench has it
        print("no bandwidth.png: matplotlib is not installed here", file=sys.stderr)
    print(f"wrote {out}: {written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
