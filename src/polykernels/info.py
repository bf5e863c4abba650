"""`polykernels info`: what a user pastes into a bug report.

The platform seen, the build manifest, and which path each op takes here and why.
"""

from __future__ import annotations

import dataclasses
import importlib
import json

from polykernels import _manifest, platform
from polykernels.suites.report import package_versions

FAMILIES = ("polykernels.quant.guards", "polykernels.gated_delta_rule.guards", "polykernels.norm.guards")


def op_choices() -> dict[str, platform.Choice]:
    """Each op family's own describe(): the path each op takes here and why."""
    choices: dict[str, platform.Choice] = {}
    for family in FAMILIES:
        choices.update(importlib.import_module(family).describe())
    return choices


def collect() -> dict[str, object]:
    info = _manifest.load_build_info()
    seen = platform.current()  # queries the device, and checks the wheel's archs against it
    return {
        "platform": dataclasses.asdict(seen),
        "capabilities": {name: fn() for name, fn in platform.CAPABILITIES.items()},
        "versions": package_versions(),
        "build": dataclasses.asdict(info) if info else "source tree (no _build_info.json)",
        "ops": {op: dataclasses.asdict(choice) for op, choice in op_choices().items()},
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
