"""A static package index per variant: PEP 503 HTML and PEP 691 JSON, written atomically.

Layout: ``<root>/<variant>`` is a symlink to ``<root>/.versions/<variant>-<stamp>``; a publish
stages a complete new version beside it, verifies every file against its sha256, then swaps
the symlink in one rename. An interrupted publish leaves the previous index untouched.
"""

from __future__ import annotations

import hashlib
import html
import json
import os
import re
import shutil
import tempfile
import time
import uuid
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polykernels_build.errors import PublishError

PROJECT = "polykernels"


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


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
    live = project_dir(root, variant)
    return {p.name: _sha256(p) for p in live.glob("*.whl")} if live.is_dir() else {}


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


def publish_variant(root: Path, variant: str, wheels: list[Path], release: dict[str, Any],
                    notes: str, *, fail_before_swap: bool = False) -> Path:
    """Adds ``wheels`` to the variant's index (keeping what it already serves) and swaps it live.

    The same file name with the same bytes is a no-op; with different bytes it is refused.
    """
    live = published(root, variant)
    for wheel in wheels:
        digest = _sha256(wheel)
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
        shutil.copy2(wheel, target_dir / wheel.name)
    files = [IndexedFile(p, _sha256(p), requires_python(p)) for p in sorted(target_dir.glob("*.whl"))]
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
    if fail_before_swap:  # tests: an interruption after staging must leave the live index alone
        raise PublishError("interrupted before the swap (test hook)")
    link = root / variant
    if link.exists() and not link.is_symlink():
        raise PublishError(f"{link} is a directory, not an index symlink; move it away first")
    previous_version = Path(os.readlink(link)).name if link.is_symlink() else None
    tmp_link = root / f".{variant}.{uuid.uuid4().hex[:8]}"
    tmp_link.symlink_to(stage.relative_to(root))
    os.replace(tmp_link, link)  # the one atomic step
    _prune(versions, variant, keep={stage.name, previous_version or stage.name})
    return link


def _verify(stage: Path, files: list[IndexedFile]) -> None:
    page = (stage / "simple" / PROJECT / "index.html").read_text()
    for f in files:
        if _sha256(f.path) != f.sha256 or f"{f.name}#sha256={f.sha256}" not in page:
            raise PublishError(f"staged index failed verification at {f.name}")


def _prune(versions: Path, variant: str, keep: set[str]) -> None:
    """Keeps the new version and the one it replaced (for rollback); removes the rest."""
    for old in versions.glob(f"{variant}-*"):
        if old.is_dir() and old.name not in keep:
            shutil.rmtree(old, ignore_errors=True)
