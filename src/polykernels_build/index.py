"""A static package index per variant: PEP 503 HTML and PEP 691 JSON, written atomically.

Layout: ``<root>/<variant>`` is a symlink to ``<root>/.versions/<variant>-<stamp>``; a publish
stages a complete new version beside it, verifies every file against its sha256, then swaps
the symlink in one rename. An interrupted publish leaves the previous index untouched.

One publisher at a time: ``publish_lock`` holds an OS file lock (``flock``) on ``<root>/.lock``
for the whole read-stage-swap, so two publishes never build on the same live version or prune
each other's stages (the loser waits, then fails with a clear error after its timeout). A stage
that exists while the lock is free was left by a publisher that died: the next one removes it.
Each wheel is copied into the stage once and that copy is hashed: it must equal the sha256 the
gate passed, which is the one sha the index and release.json name for that file.
"""

from __future__ import annotations

import contextlib
import fcntl
import html
import json
import os
import re
import shutil
import time
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polykernels_build.dist import Wheel, sha256_of, wheel_version, write_atomically
from polykernels_build.errors import FatalError, PublishError

PROJECT = "polykernels"
LOCK_FILE = ".lock"
DEFAULT_LOCK_TIMEOUT = 600.0


@contextlib.contextmanager
def publish_lock(root: Path, timeout: float = DEFAULT_LOCK_TIMEOUT) -> Iterator[None]:
    """Holds the index root's publish lock (an OS file lock, released by the kernel if we die);
    waits up to ``timeout`` seconds for another publisher, then fails naming the holder."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = path.read_text(errors="replace").strip() or "unknown"
                    raise PublishError(f"another publish holds the lock on {root} (held by {holder}; waited "
                                       f"{timeout:g} s)", hint="wait for it to finish, or raise --lock-timeout; "
                                       "the lock is released when its process exits") from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing releases the flock


def requires_python(wheel: Path) -> str | None:
    try:
        with zipfile.ZipFile(wheel) as archive:
            name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
            match = re.search(r"^Requires-Python: (.+)$", archive.read(name).decode(errors="replace"), re.M)
    except (zipfile.BadZipFile, StopIteration, OSError) as exc:
        raise PublishError(f"{wheel.name} is not a wheel with METADATA ({type(exc).__name__})") from None
    return match.group(1).strip() if match else None


def stage_copy(wheel: Wheel, directory: Path) -> Path:
    """Copies ``wheel`` into ``directory`` once and hashes the copy: what goes out is exactly what
    was gated, or nothing does (a file rewritten after the gate is caught here, whenever it happened)."""
    directory.mkdir(parents=True, exist_ok=True)
    copy = directory / wheel.name
    try:
        shutil.copyfile(wheel.path, copy)
    except OSError as exc:
        raise PublishError(f"{wheel.name}: cannot copy {wheel.path} ({exc})") from None
    digest = sha256_of(copy)
    if digest != wheel.sha256:
        copy.unlink()
        raise PublishError(f"{wheel.name} changed after it was built and gated: its bytes now have sha256 "
                           f"{digest[:16]}..., the gate passed {wheel.sha256[:16]}...",
                           hint="rebuild and gate it again; nothing was published")
    return copy


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


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PublishError(f"{path} is corrupt ({type(exc).__name__}: {exc})",
                           hint="restore it from the previous version under .versions/ (the live link's "
                                "target is never edited in place), then publish again") from None


def published(root: Path, variant: str) -> dict[str, str]:
    """filename -> sha256 of what the live index serves now."""
    listing = project_dir(root, variant) / "index.json"
    if (root / variant).is_symlink() and not (root / variant).exists():
        raise PublishError(f"{root / variant} points at a version that is gone",
                           hint="point it at the newest complete version under .versions/ and publish again")
    if not listing.is_file():
        return {}
    data = _read_json(listing)
    try:
        return {str(f["filename"]): str(f["hashes"]["sha256"]) for f in data["files"]}
    except (KeyError, TypeError) as exc:
        raise PublishError(f"{listing} is not a PEP 691 project page ({exc})") from None


def _previous_releases(root: Path, variant: str) -> list[Any]:
    path = root / variant / "release.json"
    if not path.exists():
        return []
    data = _read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("releases"), list):
        raise PublishError(f"{path} is corrupt: expected {{\"releases\": [...]}}",
                           hint="restore it from the previous version under .versions/, then publish again")
    return data["releases"]


def check_immutable(variant: str, live: dict[str, str], wheels: list[Wheel]) -> None:
    """A version once published cannot gain or change an artifact under any file name (another
    build tag, another platform tag): the same file with the same bytes is the only repeat allowed."""
    live_versions: dict[Any, list[str]] = {}
    for name in live:
        try:
            live_versions.setdefault(wheel_version(name), []).append(name)
        except FatalError:
            continue  # not ours to judge; it stays as it is
    for wheel in wheels:
        if wheel.name in live:
            if live[wheel.name] != wheel.sha256:
                raise PublishError(f"{variant}: {wheel.name} is already published with different bytes "
                                   f"(sha256 {live[wheel.name][:16]}... vs {wheel.sha256[:16]}...)",
                                   hint="a published version is immutable: bump the version to publish new bytes")
            continue
        others = live_versions.get(wheel.version)
        if others:
            raise PublishError(f"{variant}: version {wheel.version} is already published as {', '.join(others)}; "
                               f"{wheel.name} would add other bytes to it",
                               hint="a published version is immutable: bump the version to publish new bytes")


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
    The caller holds ``publish_lock(root)``.

    The same file name with the same bytes is a no-op; anything else under a published version is refused.
    """
    versions = root / ".versions"
    _clean_stale_stages(versions, variant, live_version(root, variant))
    live = published(root, variant)
    check_immutable(variant, live, wheels)
    previous_releases = _previous_releases(root, variant)
    stage = versions / f"{variant}-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
    target_dir = stage / "simple" / PROJECT
    target_dir.mkdir(parents=True)
    try:
        current = project_dir(root, variant)
        for name, digest in live.items():
            shutil.copyfile(current / name, target_dir / name)
            if sha256_of(target_dir / name) != digest:
                raise PublishError(f"{variant}: the live {name} no longer matches its published sha256",
                                   hint="the live index was edited in place; restore it from .versions/")
        for wheel in wheels:
            if wheel.name not in live:
                stage_copy(wheel, target_dir)
        hashes = {**live, **{w.name: w.sha256 for w in wheels}}
        files = [IndexedFile(p, hashes[p.name], requires_python(p)) for p in sorted(target_dir.glob("*.whl"))]
        (target_dir / "index.html").write_text(_project_html(files))
        (target_dir / "index.json").write_text(json.dumps(_project_json(files), indent=2))
        page, data = _root_pages()
        (stage / "simple" / "index.html").write_text(page)
        (stage / "simple" / "index.json").write_text(json.dumps(data, indent=2))
        (stage / "release.json").write_text(json.dumps({"releases": [*previous_releases, release]}, indent=2))
        (stage / "RELEASE_NOTES.md").write_text(notes)
        _verify(stage, files, release)
        link = root / variant
        if link.exists() and not link.is_symlink():
            raise PublishError(f"{link} is a directory, not an index symlink; move it away first")
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)  # ours alone: nothing else stages while we hold the lock
        raise
    previous_version = live_version(root, variant)
    tmp_link = root / f".{variant}.{uuid.uuid4().hex[:8]}"
    tmp_link.symlink_to(stage.relative_to(root))
    os.replace(tmp_link, link)  # the one atomic step
    write_atomically(versions / f".{variant}.previous", previous_version or stage.name)
    _prune(versions, variant, keep={stage.name, previous_version or stage.name})
    return link


def _verify(stage: Path, files: list[IndexedFile], release: dict[str, Any]) -> None:
    """The staged files, both pages and this release's record name one sha256 per file."""
    page = (stage / "simple" / PROJECT / "index.html").read_text()
    listing = {f["filename"]: f["hashes"]["sha256"]
               for f in json.loads((stage / "simple" / PROJECT / "index.json").read_text())["files"]}
    on_disk = {f.name: sha256_of(f.path) for f in files}
    for f in files:
        if on_disk[f.name] != f.sha256 or listing.get(f.name) != f.sha256 or f"{f.name}#sha256={f.sha256}" not in page:
            raise PublishError(f"staged index failed verification at {f.name}")
    for entry in release.get("files", []):
        if on_disk.get(entry["filename"]) != entry["sha256"]:
            raise PublishError(f"release.json names sha256 {entry['sha256'][:16]}... for {entry['filename']}, "
                               "which is not what the index serves")


def live_version(root: Path, variant: str) -> str | None:
    link = root / variant
    return Path(os.readlink(link)).name if link.is_symlink() else None


def _clean_stale_stages(versions: Path, variant: str, live: str | None) -> None:
    """Stages an interrupted publish left behind (never swapped in). The live version and the one
    it replaced stay. Called under the publish lock: no living publisher has a stage in progress."""
    _prune(versions, variant, keep={name for name in (live, _previous_of(versions, variant)) if name})


def _previous_of(versions: Path, variant: str) -> str | None:
    marker = versions / f".{variant}.previous"
    return marker.read_text().strip() if marker.is_file() else None


def _prune(versions: Path, variant: str, keep: set[str]) -> None:
    """Keeps the new version and the one it replaced (for rollback); removes the rest."""
    for old in versions.glob(f"{variant}-*"):
        if old.is_dir() and old.name not in keep:
            shutil.rmtree(old, ignore_errors=True)
