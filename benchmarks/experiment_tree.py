"""python -m benchmarks.experiment_tree DEST [--base REV] [--patch FILE ...] [--set MODULE.NAME=VALUE ...]:
a source tree for ``benchmarks.ab_rounds --also LABEL=DEST``, made from a kept experiment.

Experiments that did not land live as patches in docs/experiments (branches do not last), and an A/B
needs each as a tree of its own: ``DEST/src``, the package of the working tree (or of revision
``--base``) with each ``--patch`` applied to its ``src/`` part, then each ``--set`` rewriting one
module-level constant of the package (``gated_delta_rule.launch.HOPPER_CONCURRENT_PACE=8``: the
launch tables are such constants). The working tree's built extension is copied in beside the
package, so the tree runs where it was made::

    python -m benchmarks.experiment_tree build/trees/pace8 \\
        --patch docs/experiments/concurrent-from-v.patch \\
        --set gated_delta_rule.launch.HOPPER_CONCURRENT_FROM_V=False \\
        --set gated_delta_rule.launch.HOPPER_CONCURRENT_PACE=8
    python -m benchmarks.ab_rounds HEAD --also pace8=build/trees/pace8 --case "B1 T32768"
"""

from __future__ import annotations

import argparse
import ast
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Sequence
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
PACKAGE = "polykernels"


class TreeError(ValueError):
    """A tree that cannot be made as asked: what was asked, and why."""


def copy_package(destination: Path, base: str | None) -> Path:
    """``destination/src``: the working tree's ``src`` (without caches), or revision ``base``'s."""
    if destination.exists():
        if not (destination / "src" / PACKAGE).is_dir():
            raise TreeError(f"{destination} exists and is not an experiment tree (no src/{PACKAGE}): not replaced")
        shutil.rmtree(destination)
    destination.mkdir(parents=True)
    source = destination / "src"
    if base is None:
        shutil.copytree(REPOSITORY / "src", source, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        return source
    archive = subprocess.run(["git", "archive", "--format=tar", base, "src"], cwd=REPOSITORY, capture_output=True,
                             check=False)
    if archive.returncode != 0:
        raise TreeError(f"--base {base!r}: git archive failed: {archive.stderr.decode(errors='replace').strip()}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        # The "data" filter (no links out, no devices) where this Python has it; the archive is git's own.
        tar.extractall(destination, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    for built in (REPOSITORY / "src" / PACKAGE).glob("_C*.so"):  # the extension does not change with the kernels
        shutil.copy2(built, source / PACKAGE / built.name)
    return source


def apply_patch(source: Path, patch: Path) -> None:
    """Applies ``patch``'s changes under ``src/`` (a ``git format-patch`` file of this repository) to the tree."""
    if not patch.is_file():
        raise TreeError(f"--patch {patch}: no such file")
    # Inside a git work tree (a tree under build/), git apply would take the patch's paths as the enclosing
    # repository's and skip those outside the tree's folder without failing: the tree is its own root here.
    outside = {name: value for name, value in os.environ.items() if name not in ("GIT_DIR", "GIT_WORK_TREE")}
    outside["GIT_CEILING_DIRECTORIES"] = str(source.parent.resolve().parent)
    done = subprocess.run(["git", "apply", "--verbose", "--include=src/*", "-p1", str(patch.resolve())],
                          cwd=source.parent, capture_output=True, text=True, check=False, env=outside)
    if done.returncode != 0:
        raise TreeError(f"--patch {patch} does not apply to this tree (apply it to its base, the table in "
                        f"docs/experiments/README.md): {done.stderr.strip()}")
    if "Applied patch" not in done.stderr:
        raise TreeError(f"--patch {patch} changes nothing under src/: {done.stderr.strip() or 'no files'}")


_SETTING = re.compile(r"(?P<module>[A-Za-z_][\w.]*)\.(?P<name>[A-Z][A-Z0-9_]*)=(?P<value>.+)", re.S)


def set_constant(source: Path, setting: str) -> str:
    """Rewrites one module-level constant, ``MODULE.NAME=VALUE`` (MODULE under the package, VALUE a Python
    literal), where the module assigns it on one line; returns the new line."""
    match = _SETTING.fullmatch(setting)
    if match is None:
        raise TreeError(f"--set {setting!r}: expected MODULE.NAME=VALUE, e.g. "
                        "gated_delta_rule.launch.HOPPER_CONCURRENT_PACE=8")
    try:
        ast.literal_eval(match["value"])
    except (ValueError, SyntaxError) as error:
        raise TreeError(f"--set {setting!r}: {match['value']!r} is not a Python literal ({error})") from None
    module = source / PACKAGE / Path(*match["module"].split(".")).with_suffix(".py")
    if not module.is_file():
        raise TreeError(f"--set {setting!r}: no module {PACKAGE}.{match['module']} in this tree")
    text = module.read_text()
    assignment = re.compile(rf"^{match['name']}(?:: [^=\n]+)? = [^\n]*$", re.M)
    found = assignment.findall(text)
    if len(found) != 1:
        raise TreeError(f"--set {setting!r}: {PACKAGE}.{match['module']} assigns {match['name']} on one line "
                        f"{len(found)} times, where one is needed")
    if found[0].rstrip().endswith(("(", "[", "{", "\\", ",")):
        raise TreeError(f"--set {setting!r}: {match['name']}'s assignment goes on past its line; edit it by hand")
    line = f"{match['name']} = {match['value']}"
    module.write_text(assignment.sub(lambda _: line, text))
    return line


def make_tree(destination: Path, base: str | None, patches: Sequence[Path], settings: Sequence[str]) -> list[str]:
    """The tree at ``destination``; returns what was done to it, a line each."""
    source = copy_package(destination, base)
    done = [f"src from {base or 'the working tree'}"]
    for patch in patches:
        apply_patch(source, patch)
        done.append(f"applied {patch}")
    done += [f"set {set_constant(source, setting)}" for setting in settings]
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.experiment_tree", description=__doc__.split("\n\n")[1])
    parser.add_argument("destination", type=Path, help="the tree's folder (an earlier tree there is replaced)")
    parser.add_argument("--base", help="take src from this git revision instead of the working tree")
    parser.add_argument("--patch", type=Path, action="append", default=[], help="a patch to apply (repeatable)")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="MODULE.NAME=VALUE",
                        help="a module-level constant of the package to rewrite (repeatable)")
    args = parser.parse_args(argv)
    try:
        done = make_tree(args.destination, args.base, args.patch, args.settings)
    except TreeError as error:
        parser.error(str(error))
    print(f"{args.destination}: " + "; ".join(done), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
