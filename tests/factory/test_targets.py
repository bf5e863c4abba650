from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from polykernels_build import targets
from polykernels_build.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_the_real_matrix_loads() -> None:
    matrix = targets.load(ROOT / "targets.toml")
    assert {"cpu", "cuda13", "rocm-gfx942", "rocm-gfx950"} <= set(matrix.targets)
    cuda = matrix.target("cuda13")
    assert cuda.archs == ("8.0", "9.0", "10.0", "12.0+PTX") and cuda.torch_floor == "2.11"
    assert matrix.target("rocm-gfx950").archs == ("gfx950",)
    assert all(t.variant for t in matrix.targets.values())


def test_variant_labels_follow_the_runtime_rule() -> None:
    # The runtime names the wheel a user needs with _manifest.variant_for; the matrix must agree.
    from polykernels import _manifest
    from polykernels.platform import Platform

    matrix = targets.load(ROOT / "targets.toml")
    for target in matrix.targets.values():
        if target.backend == "cuda":
            seen = Platform(backend="cuda", arch="sm_90", device_name="", warp_size=32,
                            runtime_version=target.toolkit)
        elif target.backend == "rocm":
            seen = Platform(backend="rocm", arch=target.archs[0], device_name="", warp_size=64,
                            runtime_version=target.toolkit)
        else:
            seen = Platform(backend="cpu", arch=None, device_name=None, warp_size=1, runtime_version=None)
        assert _manifest.variant_for(seen) == target.variant, target.name


def test_schema_file_is_in_step_with_the_dataclasses() -> None:
    on_disk = json.loads((ROOT / "targets.schema.json").read_text())
    assert on_disk == targets.json_schema(), "run `python -m polykernels_build schema` and commit the result"


def copy_matrix(tmp_path: Path, edit: str, replacement: str) -> Path:
    shutil.copytree(ROOT / "docker", tmp_path / "docker")
    text = (ROOT / "targets.toml").read_text()
    assert edit in text
    (tmp_path / "targets.toml").write_text(text.replace(edit, replacement, 1))
    return tmp_path / "targets.toml"


BAD = {
    "unknown-key": ('hardware = "any"', 'hardware = "any"\nflavour = "vanilla"', r"unknown keys \['flavour'\]"),
    "bad-backend": ('backend = "cpu"', 'backend = "tpu"', r"backend must be one of"),
    "bad-cuda-arch": ('archs = ["8.0", "9.0"', 'archs = ["sm90", "9.0"', r"CUDA archs must look like"),
    "unknown-rocm-arch": ('archs = ["gfx942"]', 'archs = ["gfx9000"]', r"unknown ROCm archs \['gfx9000'\]"),
    "bad-digest": ('digest = "" }\nruntime', 'digest = "latest" }\nruntime', r"digest must be sha256"),
    "no-index-url": ('index_url = "', 'index_urls = "', r"\[build\] has unknown keys \['index_urls'\]"),
    "unknown-bootstrap": ('offline = { recipe = "bookworm" }', 'offline = { recipe = "jessie" }',
                          r"recipe 'jessie' has no \[bootstrap.jessie\]"),
    "duplicate-variant": ('archs = ["gfx950"]\ntoolkit = "7.2"\ntorch_floor = "2.13"\nvariant = "rocm7.2.gfx950"',
                          'archs = ["gfx942"]\ntoolkit = "7.2"\ntorch_floor = "2.13"\nvariant = "rocm7.2.gfx942"',
                          r"variants must be unique"),
    # A label that does not say what is linked: the HIP 7.2 build labelled as bare "rocm7".
    "label-lies": ('variant = "rocm7.2.gfx942"', 'variant = "rocm7.gfx942"',
                   r"does not say what the wheel links: toolkit 7.2 and archs \['gfx942'\] make it 'rocm7.2.gfx942'"),
    "label-lies-cuda": ('variant = "cu130"', 'variant = "cu128"', r"make it 'cu130'"),
    "floor-without-reason": ('python = "cp314"', 'python = "cp314"\nmanylinux = "2_35"',
                             r"manylinux 2_35 is above torch's 2_28: say why in floor_reason"),
    "bad-floor": ('torch_floor = "2.13"', 'torch_floor = "latest"', r"torch_floor must be MAJOR.MINOR"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_matrix_is_a_clear_error(tmp_path: Path, case: str) -> None:
    edit, replacement, message = BAD[case]
    with pytest.raises(ConfigError, match=message):
        targets.load(copy_matrix(tmp_path, edit, replacement))


@pytest.mark.parametrize("case", BAD)
def test_bad_matrix_control_loads(tmp_path: Path, case: str) -> None:
    # The positive row of each case: the same copy with its line left as it was loads, so the
    # error above comes from the edit and nothing else.
    edit, _, _ = BAD[case]
    assert targets.load(copy_matrix(tmp_path, edit, edit)).targets


def test_unknown_target_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as error:
        targets.load(ROOT / "targets.toml").target("cuda99")
    assert "cuda13" in (error.value.hint or "")


def test_not_toml_and_missing_file(tmp_path: Path) -> None:
    (tmp_path / "targets.toml").write_text("[target\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        targets.load(tmp_path / "targets.toml")
    with pytest.raises(ConfigError, match="not found"):
        targets.load(tmp_path / "nope.toml")


def test_a_stale_or_altered_torch_in_the_wheelhouse_is_fetched_again(tmp_path, monkeypatch) -> None:
    # targets.toml pins the build torch by sha256: a wheelhouse file with another hash (an older
    # torch after targets.toml moved on, or an altered file) is never reused.
    import hashlib

    from polykernels_build import images
    from polykernels_build.settings import Settings

    good = b"the pinned torch wheel"
    text = (ROOT / "targets.toml").read_text()
    pinned = hashlib.sha256(good).hexdigest()
    start = text.index("torch_sha256 = [")
    end = text.index("]", start) + 1
    (tmp_path / "targets.toml").write_text(text[:start] + f'torch_sha256 = ["{pinned}"]' + text[end:])
    matrix = targets.load(tmp_path / "targets.toml")
    settings = Settings(root=tmp_path)
    house = settings.build_dir / "wheelhouse"
    house.mkdir(parents=True)
    stale = house / "torch-2.12.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    stale.write_bytes(b"an older torch")
    calls = []

    def fake_pip(argv, **kwargs):
        calls.append(argv)
        assert "--require-hashes" in argv
        (house / "torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(good)
        return ""

    monkeypatch.setattr(images, "run", fake_pip)
    assert images.wheelhouse(settings, matrix, tmp_path / "log") == house
    assert not stale.exists() and len(calls) == 1
    images.wheelhouse(settings, matrix, tmp_path / "log")
    assert len(calls) == 1  # the pinned file is reused as it is
