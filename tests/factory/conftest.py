"""The factory is not installed (it never ships): make src/polykernels_build importable.

Appended, not prepended: `import polykernels` keeps finding the installed package first.
"""

from __future__ import annotations

import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
if str(SRC) not in sys.path:
    sys.path.append(str(SRC))
