"""`polykernels info`: what a user pastes into a bug report.

The platform seen, the build manifest, and which path each op takes here and why.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

from polykernels import _manifest, platform
from polykernels.suites.report import package_versions


def _op_paths() -> dict[str, Callable[[], tuple[str, str]]]:
    from polykernels.gated_delta_rule.guards import describe as gdn_describe
    from polykernels.norm.guards import describe as norm_describe
    from polykernels.quant.guards import choose_path as quant_path

    device = "cuda" if platform.current().is_gpu else "cpu"

    def quant() -> tuple[str, str]:
        choice = quant_path(device)
        return choice.path, choice.reason

    return {"fake_int4_quant": quant, **gdn_describe(), **norm_describe()}


def collect() -> dict[str, object]:
    info = _manifest.load_build_info()
    seen = platform.current()
    paths = {}
    for op, describe in _op_paths().items():
        path, reason = describe()
        paths[op] = {"path": path, "reason": reason}
    return {
        "platform": dataclasses.asdict(seen),
        "capabilities": {name: fn() for name, fn in platform.CAPABILITIES.items()},
        "versions": package_versions(),
        "build": dataclasses.asdict(info) if info else "source tree (no _build_info.json)",
        "ops": paths,
    }


def render(data: dict[str, object]) -> str:
    lines = []
    for section, body in data.items():
        lines.append(f"{section}:")
        if isinstance(body, dict):
            for key, value in body.items():
                if isinstance(value, dict) and "path" in value:
                    lines.append(f"  {key:24} {value['path']:14} {value['reason']}")
                else:
                    lines.append(f"  {key:24} {value}")
        else:
            lines.append(f"  {body}")
    return "\n".join(lines)


def main(as_json: bool = False) -> str:
    data = collect()
    return json.dumps(data, indent=2, default=str) if as_json else render(data)
