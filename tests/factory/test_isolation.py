from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_factory_imports_without_torch_or_the_payload() -> None:
    # The factory reaches the payload only through subprocesses and built wheels.
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['polykernels'] = None\n"
        "import polykernels_build.cli, polykernels_build.release, polykernels_build.gate, "
        "polykernels_build.publish, polykernels_build.index, polykernels_build.checks, "
        "polykernels_build.compile_matrix\n"
        "print('ok')"
    )
    src = str(Path(__file__).resolve().parents[2] / "src")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False,
                         env={**os.environ, "PYTHONPATH": src})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
