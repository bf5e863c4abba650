"""Running outside programs: every command is logged with its argv, and a failure carries both."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from polykernels_build.errors import ToolError


def run(
    argv: Sequence[str],
    *,
    log: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    input_bytes: bytes | None = None,
    hint: str | None = None,
    timeout: float | None = None,
) -> str:
    """Runs ``argv``, appending its command line and output to ``log``; returns the output."""
    argv = [str(a) for a in argv]
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as handle:
        handle.write(f"\n$ {shlex.join(argv)}\n".encode())
        handle.flush()
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=dict(env) if env else None,
                              cwd=cwd, input=input_bytes, timeout=timeout, check=False)
        handle.write(proc.stdout)
    output = proc.stdout.decode(errors="replace")
    if proc.returncode != 0:
        raise ToolError(argv, proc.returncode, output, log=log, hint=hint)
    return output
