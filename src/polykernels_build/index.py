"""A static package index per variant: PEP 503 HTML and PEP 691 JSON, written atomically.

Layout: ``<root>/<variant>`` is a symlink to ``<root>/.versions/<variant>-<stamp>``; a publish
stages a complete new version beside it, verifies every file against its sha256, then swaps
the symlink in one rename. An interrupted publish leaves the previous index untouched.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import time
import uuid
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polykernels_build.dist import Wheel, sha256_of, write_atomically
from polykernels_build.errors import PublishError

PROJECT = "polykernels"


def requires_python(wheel: Path) -> str | None:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        match = re.search(r"^Requires-Python: (.+)$", archive.read(name).decode(), re.M)
    return match.group(1).strip() if match else None


@dataclass(frozen=True)
class IndexedFile:
    path: Path
    sha256: str
    requires_python: str | None

    @property
    def name(self) -> str:
        return self.path.name


def project_dir(root: Path, variant: str) -> Path:
    return root / variant / "simple" / PROJECT


def published(root: Path, variant: str) -> dict[str, str]:
    """filename -> sha256 of what the live index serves now."""
    listing = project_dir(root, variant) / "index.json"
    if not listing.is_file():
        return {}
    return {f["filename"]: f["hashes"]["sha256"] for f in json.loads(listing.read_text())["files"]}


def _project_html(files: list[IndexedFile]) -> str:
    links = []
    for f in files:
        python = f' data-requires-python="{html.escape(f.requires_python)}"' if f.requires_python else ""
        links.append(f'    <a href="{html.escape(f.name)}#sha256={f.sha256}"{python}>{html.escape(f.name)}</a><br/>')
    return ("<!DOCTYPE html>\n<html>\n  <head><meta name=\"pypi:repository-version\" content=\"1.1\">"
            f"<title>Links for {PROJECT}</title></head>\n  <body>\n    <h1>Links for {PROJECT}</h1>\n"
            + "\n".join(links) + "\n  </body>\n</html>\n")


def _project_json(files: list[IndexedFile]) -> dict[str, Any]:
    versions = sorted({f.name.split("-")[1] for f in files})
    return {
        "meta": {"api-version": "1.1"},
        "name": PROJECT,
        "versions": versions,
        "files": [{"filename": f.name, "url": f.name, "hashes": {"sha256": f.sha256},
                   "requires-python": f.requires_python, "size": f.path.stat().st_size} for f in files],
    }


def _root_pages() -> tuple[str, dict[str, Any]]:
    page = ("<!DOCTYPE html>\n<html>\n  <head><meta name=\"pypi:repository-version\" content=\"1.1\">"
            f"<title>Simple index</title></head>\n  <body>\n    <a href=\"{PROJECT}/\">{PROJECT}</a>\n"
            "  </body>\n</html>\n")
    return page, {"meta": {"api-version": "1.1"}, "projects": [{"name": PROJECT}]}


def publish_variant(root: Path, variant: str, wheels: list[Wheel], release: dict[str, Any], notes: str) -> Path:
    """Adds ``wheels`` to the variant's index (keeping what it already serves) and swaps it live.

    The same file name with the same bytes is a no-op; with different bytes it is refused.
    """
    live = published(root, variant)
    _clean_stale_stages(root / ".versions", variant, live_version(root, variant))
    for wheel in wheels:
        digest = wheel.sha256
        if wheel.name in live and live[wheel.name] != digest:
            raise PublishError(f"{variant}: {wheel.name} is already published with different bytes "
                               f"(sha256 {live[wheel.name][:16]}... vs {digest[:16]}...)",
                               hint="a published version is immutable: bump the version to publish new bytes")
    versions = root / ".versions"
    stage = versions / f"{variant}-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
    target_dir = stage / "simple" / PROJECT
    target_dir.mkdir(parents=True)
    current = project_dir(root, variant)
    for name in live:
        shutil.copy2(current / name, target_dir / name)
    for wheel in wheels:
        shutil.copy2(wheel.path, target_dir / wheel.name)
    hashes = {**live, **{w.name: w.sha256 for w in wheels}}
    files = [IndexedFile(p, hashes[p.name], requires_python(p)) for p in sorted(target_dir.glob("*.whl"))]
    (target_dir / "index.html").write_text(_project_html(files))
    (target_dir / "index.json").write_text(json.dumps(_project_json(files), indent=2))
    page, data = _root_pages()
    (stage / "simple" / "index.html").write_text(page)
    (stage / "simple" / "index.json").write_text(json.dumps(data, indent=2))
    previous = json.loads((root / variant / "release.json").read_text()) if (root / variant / "release.json").exists() \
        else {"releases": []}
    (stage / "release.json").write_text(json.dumps({"releases": [*previous["releases"], release]}, indent=2))
    (stage / "RELEASE_NOTES.md").write_text(notes)
    _verify(stage, files)
    link = root / variant
    if link.exists() and not link.is_symlink():
        raise PublishError(f"{link} is a directory, not an index symlink; move it away first")
    previous_version = live_version(root, variant)
    tmp_link = root / f".{variant}.{uuid.uuid4().hex[:8]}"
    tmp_link.symlink_to(stage.relative_to(root))
    os.replace(tmp_link, link)  # the one atomic step
    write_atomically(versions / f".{variant}.previous", previous_version or stage.name)
    _prune(versions, variant, keep={stage.name, previous_version or stage.name})
    return link


def _verify(stage: Path, files: list[IndexedFile]) -> None:
    page = (stage / "simple" / PROJECT / "index.html").read_text()
    for f in files:
        if sha256_of(f.path) != f.sha256 or f"{f.name}#sha256={f.sha256}" not in page:
            raise PublishError(f"staged index failed verification at {f.name}")


def live_version(root: Path, variant: str) -> str | None:
    link = root / variant
    return Path(os.readlink(link)).name if link.is_symlink() else None


def _clean_stale_stages(versions: Path, variant: str, live: str | None) -> None:
    """Stages an interrupted publish left behind (never swapped in). The live version and the one
    it replaced stay; a stage is stale when it is neither and no symlink points at it."""
    _prune(versions, variant, keep={name for name in (live, _previous_of(versions, variant)) if name})


def _previous_of(versions: Path, variant: str) -> str | None:
    marker = versions / f".{variant}.previous"
    return marker.read_text().strip() if marker.is_file() else None


def _prune(versions: Path, variant: str, keep: set[str]) -> None:
    """Keeps the new version and the one it replaced (for rollback); removes the rest."""
    for old in versions.glob(f"{variant}-*"):
        if old.is_dir() and old.name not in keep:
            shutil.rmtree(old, ignore_errors=True)
