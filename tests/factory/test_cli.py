from __future__ import annotations

from pathlib import Path

from polykernels_build import cli, release, targets
from polykernels_build.backends import Host

ROOT = Path(__file__).resolve().parents[2]


def test_missing_docker_is_one_clear_line(capsys, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    code = cli.main(["images", "--target", "cpu"], env={"PATH": "/nonexistent"})
    err = capsys.readouterr().err
    assert code == 3
    assert "no Docker engine: the `docker` command is not installed" in err
    assert "Traceback" not in err


def test_unknown_target_exit_code_and_hint(capsys, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    assert cli.main(["wheel", "--target", "cuda99"], env={"PATH": "/nonexistent"}) == 2
    err = capsys.readouterr().err
    assert "unknown target 'cuda99'" in err and "cuda13" in err


def test_waiver_needs_a_reason(capsys, monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "targets.toml").write_text((ROOT / "targets.toml").read_text())
    (tmp_path / "docker").symlink_to(ROOT / "docker")
    assert cli.main(["publish", "--waive", "cpu", " "], env={}) == 2
    assert "the reason must say why" in capsys.readouterr().err


def test_auto_targets_follow_the_hardware() -> None:
    matrix = targets.load(ROOT / "targets.toml")
    names = lambda host: [t.name for t in release.resolve_targets(["auto"], matrix, host)]
    assert names(Host(frozenset({"cpu"}))) == ["cpu"]
    assert names(Host(frozenset({"cpu", "nvidia"}))) == ["cpu", "cuda13"]
    assert names(Host(frozenset({"cpu", "gfx950"}))) == ["cpu", "rocm-gfx950"]
    assert len(release.resolve_targets(["all"], matrix, Host())) == len(matrix.targets)
