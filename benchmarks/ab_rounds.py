"""python -m benchmarks.ab_rounds BASE [--also LABEL=TREE ...] [--rounds N] [--case TEXT] [--shape SPEC] [--out DIR]:
the working tree (and other trees) against a commit.

A kernel change lands on an A/B run on the GPU (README, "Changing a kernel"): the tree before it and
the tree after it, on the same GPU, alternating, two rounds at least. This runs one: BASE (any git
revision) is checked out into a worktree of its own, or BASE is a folder that already holds the
tree (``git archive REV src | tar -x -C FOLDER``: a GPU host given a copy of the files and not the
repository's history), then ``benchmarks.gdn_ab`` runs base, change, base, change, ... each in its
own process (the first base run saves its outputs, every later run is compared with them). The
table gives each shape's GPU ms for both trees (lowest and highest over the rounds), the change in
percent of the base's best, how far the change's outputs moved, and each kernel's best us in both
trees (torch.profiler): a change that slows one pass shows there. Raw rows go to DIR/rows.jsonl.

``--also LABEL=TREE`` (repeatable) adds a tree to every round, after the working tree: a git revision
or a folder, as BASE is. Forms of one idea, or two ideas and their sum, then run side by side on the
same GPU and against the same base outputs, and each gets its own table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.registry import GDN_GATES, gdn_shape

REPOSITORY = Path(__file__).resolve().parents[1]
GPU_MS = " GPU ms"
KERNEL_US = " us"  # gdn_ab's torch.profiler columns: "<shape> <kernel> us"


@dataclass(frozen=True)
class ShapeResult:
    shape: str
    base_ms: tuple[float, float]  # lowest, highest over the rounds
    change_ms: tuple[float, float]
    largest_output_difference: float  # max |d o| and |d state| of the change's runs against the base's outputs
    kernel_us: dict[str, tuple[float | None, float | None]]  # kernel -> (base's best, change's best)

    @property
    def change_percent(self) -> float:
        """The change's best against the base's best: negative is faster."""
        return 100.0 * (self.change_ms[0] / self.base_ms[0] - 1.0)


def summarize(rows: Sequence[dict], change: str = "change") -> list[ShapeResult]:
    """Per shape, the GPU ms of the rows labelled ``base-*`` and ``<change>-*`` (gdn_ab's JSON rows)."""
    def of(tree: str) -> list[dict]:
        picked = [row for row in rows if row["label"].rsplit("-", 1)[0] == tree]
        if not picked:
            raise ValueError(f"no rows labelled {tree}-<round> among {[row['label'] for row in rows]}")
        return picked

    base_rows, change_rows = of("base"), of(change)
    results = []
    for key in (key for key in base_rows[0] if key.endswith(GPU_MS)):
        shape = key.removesuffix(GPU_MS)
        base_ms = [row[key] for row in base_rows]
        change_ms = [row[key] for row in change_rows if key in row]
        if not change_ms:
            raise ValueError(f"the change's rows have no {key!r}: were both trees run with the same --case?")
        moved = max((value for row in change_rows for name, value in row.items()
                     if name.startswith(shape + " max|d")), default=0.0)
        results.append(ShapeResult(shape, (min(base_ms), max(base_ms)), (min(change_ms), max(change_ms)), moved,
                                   _kernel_us(shape, base_rows, change_rows)))
    return results


def _kernel_us(shape: str, base_rows: Sequence[dict], change_rows: Sequence[dict]) -> dict:
    """Each kernel's best us at this shape in either tree (a kernel only one tree launches has None in the other)."""
    def best(rows: Sequence[dict]) -> dict[str, float]:
        found: dict[str, float] = {}
        for row in rows:
            for name, value in row.items():
                if name.startswith(shape + " ") and name.endswith(KERNEL_US):
                    kernel = name.removeprefix(shape + " ").removesuffix(KERNEL_US)
                    found[kernel] = min(value, found.get(kernel, value))
        return found

    base, change = best(base_rows), best(change_rows)
    return {kernel: (base.get(kernel), change.get(kernel)) for kernel in sorted(base.keys() | change.keys())}


def table(results: Sequence[ShapeResult]) -> str:
    lines = ["| shape | base GPU ms | change GPU ms | change | largest output difference | kernel us |",
             "|---|---:|---:|---:|---:|---|"]
    for result in results:
        kernels = ", ".join(f"{kernel} {_us(base)} -> {_us(change)}"
                            for kernel, (base, change) in result.kernel_us.items())
        lines.append(f"| {result.shape} | {_span(result.base_ms)} | {_span(result.change_ms)} | "
                     f"{result.change_percent:+.1f}% | {result.largest_output_difference:.3g} | {kernels} |")
    return "\n".join(lines)


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _span(values: tuple[float, float]) -> str:
    low, high = values
    return f"{low:.3f}" if low == high else f"{low:.3f}-{high:.3f}"


def checkout(revision: str, folder: Path) -> Path:
    """A detached worktree of ``revision`` at ``folder`` (replaced if there); returns its source folder."""
    if folder.exists():  # an earlier run's worktree, or what is left of one whose registration was pruned
        shutil.rmtree(folder)
    subprocess.run(["git", "worktree", "prune"], cwd=REPOSITORY, check=True)
    subprocess.run(["git", "worktree", "add", "--detach", str(folder), revision], cwd=REPOSITORY, check=True,
                   stdout=subprocess.DEVNULL)
    return folder / "src"


def base_source(base: str, folder: Path, name: str = "BASE") -> Path:
    """The package folder of a tree named on the command line (``name``: BASE, or an ``--also``
    label): a folder holding a tree (with ``src/polykernels``) as it is, else a git revision checked
    out into ``folder``."""
    given = Path(base)
    if (given / "src" / "polykernels").is_dir():
        return given.resolve() / "src"
    if given.exists():
        raise ValueError(f"{name} {base!r} is a folder without src/polykernels: not a tree of this repository")
    return checkout(base, folder)


_LABEL = re.compile(r"[A-Za-z0-9_.]+")


def other_trees(entries: Sequence[str]) -> list[tuple[str, str]]:
    """``--also`` entries as (label, tree); a label names one tree's rows, so it must be new and plain."""
    trees: list[tuple[str, str]] = []
    for entry in entries:
        label, equals, tree = entry.partition("=")
        if not equals or not tree:
            raise ValueError(f"--also takes LABEL=TREE (a git revision or a folder), got {entry!r}")
        if not _LABEL.fullmatch(label):
            raise ValueError(f"--also label {label!r} must be letters, digits, '_' or '.'")
        if label in ("base", "change") or label in (seen for seen, _ in trees):
            raise ValueError(f"--also label {label!r} is taken: 'base', 'change' and each label name one tree")
        trees.append((label, tree))
    return trees


def run_tree(label: str, source: Path, outputs: Path, save: bool, cases: Sequence[str],
             gates: str | None = None, initial: bool = False, extra: Sequence[str] = ()) -> dict:
    """One ``benchmarks.gdn_ab`` run of the tree whose package is under ``source``, in its own process
    (the benchmarks themselves come from this repository)."""
    path = os.pathsep.join(filter(None, [str(source), str(REPOSITORY), os.environ.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "benchmarks.gdn_ab", label, "--save" if save else "--compare", str(outputs)]
    command += [argument for case in cases for argument in ("--case", case)]
    command += ["--gates", gates] if gates else []
    command += ["--initial"] if initial else []
    command += [argument for spec in extra for argument in ("--shape", spec)]
    done = subprocess.run(command, check=False, env={**os.environ, "PYTHONPATH": path}, cwd=REPOSITORY,
                          capture_output=True, text=True)
    rows = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not rows:
        raise RuntimeError(f"{label}: benchmarks.gdn_ab failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(rows[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ab_rounds", description=__doc__.split("\n\n")[1])
    parser.add_argument("base", help="the git revision the working tree is compared with (e.g. HEAD~1, main), "
                                         "or a folder holding that tree's src/")
    parser.add_argument("--also", action="append", default=[], metavar="LABEL=TREE",
                        help="another tree to run in every round (a git revision or a folder), labelled LABEL")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every tree, base first (default 2)")
    parser.add_argument("--case", action="append", default=[], help="only the shapes whose name contains this text")
    parser.add_argument("--out", type=Path, default=REPOSITORY / "build" / "ab")
    parser.add_argument("--gates", choices=GDN_GATES, help="the gates' family in every run (benchmarks.registry."
                        "GDN_GATES; default: the bench's)")
    parser.add_argument("--initial", action="store_true", help="every call from a random initial state (a chunked "
                        "prefill's)")
    parser.add_argument("--shape", action="append", default=[], metavar="SPEC", help="also this shape, B,T,H,HV "
                        "or L1+L2+...,H,HV (packed lengths); without --case only these")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    try:
        for spec in args.shape:
            gdn_shape(spec)
    except ValueError as error:
        parser.error(str(error))

    args.out = args.out.resolve()  # git and the runs work from the repository's root
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        also = other_trees(args.also)
        trees = [("base", base_source(args.base, args.out / "base-tree")), ("change", REPOSITORY / "src")]
        trees += [(label, base_source(tree, args.out / f"{label}-tree", f"--also {label}")) for label, tree in also]
    except ValueError as error:
        parser.error(str(error))
    rows = []
    with (args.out / "rows.jsonl").open("w") as raw:
        for round_number in range(1, args.rounds + 1):
            for tree, source in trees:
                save = tree == "base" and round_number == 1
                row = run_tree(f"{tree}-{round_number}", source, args.out / "outputs", save, args.case, args.gates,
                               args.initial, args.shape)
                rows.append(row)
                raw.write(json.dumps(row) + "\n")
                raw.flush()
                print(f"{row['label']}: {row['seconds']} s", file=sys.stderr, flush=True)
    for label, _ in trees[1:]:
        name = "the working tree" if label == "change" else f"{label} ({dict(also)[label]})"
        print(f"base {args.base} against {name}, {args.rounds} rounds on {rows[0]['device']}:")
        print(table(summarize(rows, label)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
