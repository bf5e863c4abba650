"""pin-images: tags resolve through the registry API to digests written into targets.toml's lines."""

from __future__ import annotations

from pathlib import Path

from polykernels_build import pin_images, targets, workflow_matrix

ROOT = Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "b" * 64


def _copy(tmp_path: Path) -> targets.Matrix:
    (tmp_path / "targets.toml").write_text((ROOT / "targets.toml").read_text())
    (tmp_path / "docker").symlink_to(ROOT / "docker")
    return targets.load(tmp_path / "targets.toml")


def test_references_follow_dockers_rules() -> None:
    assert pin_images.parse_reference("python:3.11-slim-bookworm") == pin_images.ImageRef(
        registry="registry-1.docker.io", repository="library/python", tag="3.11-slim-bookworm")
    assert pin_images.parse_reference("rocm/pytorch:latest").repository == "rocm/pytorch"
    assert pin_images.parse_reference("ghcr.io/org/img:1.0") == pin_images.ImageRef(
        registry="ghcr.io", repository="org/img", tag="1.0")
    assert pin_images.parse_reference("localhost:5000/img").tag == "latest"


def _registry(requests: list[str]) -> pin_images.Fetch:
    """A registry that wants an anonymous bearer token, as Docker Hub does."""
    def fetch(url: str, headers: dict[str, str], method: str) -> tuple[int, dict[str, str], bytes]:
        requests.append(f"{method} {url}")
        if url.startswith("https://auth.example/token"):
            return 200, {}, b'{"token": "t0k"}'
        if headers.get("Authorization") != "Bearer t0k":
            return 401, {"www-authenticate": 'Bearer realm="https://auth.example/token",service="reg",'
                                             'scope="repository:x:pull"'}, b""
        return 200, {"docker-content-digest": DIGEST}, b""
    return fetch


def test_resolve_answers_the_auth_challenge() -> None:
    requests: list[str] = []
    ref = pin_images.parse_reference("pytorch/manylinux2_28-builder:cuda13.0")
    assert pin_images.resolve(ref, _registry(requests)) == DIGEST
    assert requests[0] == "HEAD https://registry-1.docker.io/v2/pytorch/manylinux2_28-builder/manifests/cuda13.0"
    assert requests[1].startswith("GET https://auth.example/token?service=reg&scope=repository:x:pull")


def test_rewrite_pins_every_image_and_keeps_the_comments(tmp_path) -> None:
    matrix = _copy(tmp_path)
    before = matrix.path.read_text()
    pins = pin_images.pin_images(matrix, _registry([]))
    assert all(p.new == DIGEST for p in pins) and len(pins) == 2 * len(matrix.targets)
    after = matrix.path.read_text()
    assert after.count(f'digest = "{DIGEST}"') == 2 * len(matrix.targets)
    assert [line for line in before.splitlines() if line.startswith("#")] == \
           [line for line in after.splitlines() if line.startswith("#")]
    pinned = targets.load(matrix.path)
    assert all(workflow_matrix.profile_for(t) == "vendor" for t in pinned.targets.values())


def test_an_unreachable_registry_leaves_the_target_unpinned(tmp_path) -> None:
    matrix = _copy(tmp_path)

    def offline(url: str, headers: dict[str, str], method: str) -> tuple[int, dict[str, str], bytes]:
        raise OSError("Network is unreachable")

    pins = pin_images.pin_images(matrix, offline)
    assert all(p.new is None and "Network is unreachable" in p.note for p in pins)
    assert matrix.path.read_text() == (ROOT / "targets.toml").read_text()
    assert workflow_matrix.profile_for(targets.load(matrix.path).target("cuda13")) == "offline"


def test_only_the_named_slot_of_the_named_target_changes() -> None:
    text = (ROOT / "targets.toml").read_text()
    image = targets.load(ROOT / "targets.toml").target("rocm-gfx950").vendor.image
    pin = pin_images.Pin(target="rocm-gfx950", slot="vendor", image=image, old="", new=DIGEST, note="resolved")
    pairs = zip(text.splitlines(), pin_images.rewrite(text, [pin]).splitlines(), strict=True)
    changed = [(a, b) for a, b in pairs if a != b]
    assert len(changed) == 1 and DIGEST in changed[0][1]
    section = text.split("[target.rocm-gfx950]")[1]
    assert changed[0][0] in section
