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
    env: Mapping[str, str],
    cwd: Path | None = None,
    input_bytes: bytes | None = None,
    hint: str | None = None,
    timeout: float | None = None,
    check: bool = True,
    stderr_to_log: bool = False,
) -> str:
    """Runs ``argv`` with exactly ``env`` (the injected tool environment, never the process's),
    appending its command line and output to ``log``; returns the output. ``check=False``: a
    failure returns its output instead of raising (for probes). ``stderr_to_log``: stderr goes to
    the log only, so the output is stdout alone (machine-read output such as ``git ls-files -z``)."""
    argv = [str(a) for a in argv]
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as handle:
        handle.write(f"\n$ {shlex.join(argv)}\n".encode())
        handle.flush()
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=handle if stderr_to_log else subprocess.STDOUT,
                              env=dict(env),
                              cwd=cwd, input=input_bytes, timeout=timeout, check=False)
        handle.write(proc.stdout)
    output = proc.stdout.decode(errors="replace")
    if proc.returncode != 0 and check:
        raise ToolError(argv, proc.returncode, output, log=log, hint=hint)
    return output
