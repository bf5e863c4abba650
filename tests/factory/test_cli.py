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


def test_failed_suites_exit_with_the_gate_code(capsys, monkeypatch, tmp_path) -> None:
    # errors.py: GateError is 7. A report whose suites failed, kept with `gate --import-report`,
    # makes the verb exit 7 (not 1), and the run still ends with its summary table.
    import json

    from polykernels_build.dist import GateReport, judge
    from polykernels_build.errors import GateError
    from polykernels_build.settings import Settings
    from tests.factory.helpers import make_wheel, suites_report

    monkeypatch.chdir(tmp_path)
    (tmp_path / "targets.toml").write_text((ROOT / "targets.toml").read_text())
    settings = Settings(root=tmp_path)
    wheel = make_wheel(settings.dist_dir / "cpu")
    suites = suites_report(passed=False)
    passed, reason = judge(suites)
    report = GateReport(wheel_sha256=wheel.sha256, wheel_name=wheel.name, target="cpu", variant="cpu",
                        hardware_class="cpu", runtime="venv", host="elsewhere", passed=passed, reason=reason,
                        seconds=1.0, created_at="2026-11-30T00:00:00+00:00", suites=suites)
    source = tmp_path / "from-runner.json"
    source.write_text(json.dumps(report.__dict__))
    source.with_name(source.name + ".sig").write_bytes(settings.keyring.sign(source.read_bytes()))
    assert cli.main(["gate", "--import-report", str(source)], env={}) == GateError.return_code == 7
    err = capsys.readouterr().err
    assert "int4_parity: failed" in err and "gate" in err


def test_every_verb_option_is_declared_once() -> None:
    from polykernels_build.settings import Settings

    options = cli._options(Settings(root=ROOT))
    used = {o for verb in cli.VERBS.values() for o in verb.options} | {
        o for verb in cli.VERBS.values() for names, _ in verb.exclusive for o in names}
    assert used == set(options), "an option no verb takes, or a verb naming an undeclared option"
