"""`nox -s pin-images`: resolve each vendor image tag in targets.toml to its digest and write it back.

It asks the registries directly (the OCI distribution API, anonymous pull tokens), so it needs no
Docker engine; where a registry cannot be reached (an offline build host) the target stays unpinned
and is reported, and the release builds it with the offline profile. A scheduled workflow runs
this on GitHub's runners and opens a pull request with the change: a digest moves only by review.
targets.toml is edited as text, one `digest = "..."` at a time, so its comments survive.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from polykernels_build.errors import ConfigError
from polykernels_build.targets import DIGEST, Matrix

MANIFEST_TYPES = ", ".join([
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
])

# (url, headers, method) -> (status, headers, body); injected so tests need no network.
Fetch = Callable[[str, dict[str, str], str], tuple[int, dict[str, str], bytes]]


@dataclass(frozen=True, kw_only=True)
class ImageRef:
    registry: str
    repository: str
    tag: str


@dataclass(frozen=True, kw_only=True)
class Pin:
    target: str
    slot: str  # vendor | runtime
    image: str
    old: str
    new: str | None  # None: could not be resolved here
    note: str


def parse_reference(image: str) -> ImageRef:
    """Docker's rules: no registry host means Docker Hub, and a bare name lives under library/."""
    name, _, tag = image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", "latest")
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        registry, repository = first, rest
    else:
        registry, repository = "registry-1.docker.io", name if "/" in name else f"library/{name}"
    return ImageRef(registry=registry, repository=repository, tag=tag)


def _urllib_fetch(url: str, headers: dict[str, str], method: str) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


def _bearer_token(challenge: str, fetch: Fetch) -> str:
    params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    if not challenge.lower().startswith("bearer") or "realm" not in params:
        raise ConfigError(f"unsupported registry auth challenge {challenge!r}")
    query = "&".join(f"{k}={v}" for k, v in params.items() if k in ("service", "scope"))
    status, _, body = fetch(f"{params['realm']}?{query}", {}, "GET")
    if status != 200:
        raise ConfigError(f"token request to {params['realm']} answered {status}")
    data = json.loads(body)
    return data.get("token") or data["access_token"]


def resolve(ref: ImageRef, fetch: Fetch = _urllib_fetch) -> str:
    """The digest the registry serves for ref's tag (the multi-arch index when there is one)."""
    url = f"https://{ref.registry}/v2/{ref.repository}/manifests/{ref.tag}"
    headers = {"Accept": MANIFEST_TYPES}
    status, reply, _ = fetch(url, headers, "HEAD")
    if status == 401 and "www-authenticate" in reply:
        headers["Authorization"] = f"Bearer {_bearer_token(reply['www-authenticate'], fetch)}"
        status, reply, _ = fetch(url, headers, "HEAD")
    digest = reply.get("docker-content-digest", "")
    if status != 200 or not DIGEST.match(digest) or not digest:
        raise ConfigError(f"{ref.registry}/{ref.repository}:{ref.tag}: registry answered {status}, digest {digest!r}")
    return digest


def resolve_all(matrix: Matrix, fetch: Fetch = _urllib_fetch) -> list[Pin]:
    pins = []
    for target in matrix.targets.values():
        for slot, image in (("vendor", target.vendor), ("runtime", target.runtime)):
            try:
                new, note = resolve(parse_reference(image.image), fetch), "resolved"
            except (ConfigError, OSError) as exc:  # unreachable registry: stays as it is, said out loud
                new, note = None, f"not resolved here: {exc}"
            pins.append(Pin(target=target.name, slot=slot, image=image.image, old=image.digest, new=new, note=note))
    return pins


def rewrite(text: str, pins: list[Pin]) -> str:
    """Sets each resolved digest on its `<slot> = { image = "...", digest = "..." }` line of its target."""
    for pin in pins:
        if pin.new is None or pin.new == pin.old:
            continue
        section = re.search(rf'^\[target\.{re.escape(pin.target)}\]\s*$(.*?)(?=^\[|\Z)', text, re.M | re.S)
        if not section:
            raise ConfigError(f"targets.toml has no [target.{pin.target}] table to rewrite")
        line = re.compile(rf'^({pin.slot}\s*=\s*\{{\s*image\s*=\s*"{re.escape(pin.image)}"\s*,\s*digest\s*=\s*")'
                          rf'[^"]*(")', re.M)
        body, count = line.subn(rf"\g<1>{pin.new}\g<2>", section.group(1))
        if count != 1:
            raise ConfigError(f"[target.{pin.target}] {pin.slot}: expected one inline table for {pin.image}")
        text = text[:section.start(1)] + body + text[section.end(1):]
    return text


def pin_images(matrix: Matrix, fetch: Fetch = _urllib_fetch, *, write: bool = True) -> list[Pin]:
    pins = resolve_all(matrix, fetch)
    path: Path = matrix.path
    new_text = rewrite(path.read_text(), pins)
    if write and new_text != path.read_text():
        path.write_text(new_text)
    return pins
