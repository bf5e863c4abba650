"""images -> wheel -> checks for one target: the steps `nox -s wheel` and `release` share."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from polykernels_build import checks, images, wheels
from polykernels_build.dist import Wheel
from polykernels_build.errors import CheckError
from polykernels_build.log import Reporter
from polykernels_build.settings import Settings
from polykernels_build.targets import Matrix, Target


def log_path(settings: Settings, target: str, step: str) -> Path:
    return settings.build_dir / "logs" / target / f"{step}.log"


def build_and_check(settings: Settings, matrix: Matrix, target: Target, profile: str, reporter: Reporter, *,
                    index_url: str | None = None, allow_unpinned: bool = False, ccache: bool = True) -> Wheel:
    """Returns the wheel as built and checked: the object the gate and publish receive."""
    with reporter.step(target.name, f"image ({profile})") as row:
        image = images.builder_image(settings, matrix, target, profile, log_path(settings, target.name, "image"),
                                     allow_unpinned=allow_unpinned)
        row.detail = f"{image.tag} {image.image_id[:19]}"
    with reporter.step(target.name, "wheel") as row:
        built = wheels.build_wheel(settings, target, image, log_path(settings, target.name, "wheel"),
                                   root_url=index_url or matrix.index_url, ccache=ccache)
        row.detail = f"{built.path.name} {built.size / 2**20:.2f} MiB sha256 {built.sha256[:12]}"
    with reporter.step(target.name, "checks") as row:
        results = checks.run_checks(built, target, image.tag, image.python, settings.build_dir / "wheelhouse",
                                    settings.build_dir / "work" / target.name,
                                    log_path(settings, target.name, "checks"), settings.tool_env)
        record = built.path.with_suffix(".checks.json")
        record.write_text(json.dumps([asdict(r) for r in results], indent=2))
        failed = [r for r in results if not r.passed]
        row.detail = "; ".join(f"{r.name}: {r.detail}" for r in (failed or results))[:300]
        if failed:
            raise CheckError(f"{target.name}: {', '.join(r.name for r in failed)} check failed: "
                             f"{'; '.join(r.detail for r in failed)}", log=log_path(settings, target.name, "checks"))
    return built
