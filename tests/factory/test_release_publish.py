"""The publish job: a gated target needs a verified gate attestation; the rest need a waiver."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest

from polykernels_build import attestations, release_publish, targets, workflow_matrix
from polykernels_build.dist import GateReport, Wheel
from polykernels_build.errors import GateError, PublishError
from polykernels_build.settings import Settings
from tests.factory.helpers import make_wheel, suites_report

ROOT = Path(__file__).resolve().parents[2]
REPO = "owner/polykernels"


@pytest.fixture
def setup(tmp_path):
    settings = Settings(root=tmp_path)
    matrix = targets.load(ROOT / "targets.toml")
    artifacts = tmp_path / "artifacts"
    wheels = {name: make_wheel(artifacts / f"wheel-{name}", target=name, variant=t.variant)
              for name, t in matrix.targets.items()}
    return settings, matrix, artifacts, wheels


def _gate_statement(wheel: Wheel, target: str, passed: bool = True) -> dict:
    variant = targets.load(ROOT / "targets.toml").target(target).variant
    report = GateReport(wheel_sha256=wheel.sha256, wheel_name=wheel.name, target=target, variant=variant,
                             hardware_class="nvidia" if target == "cuda13" else "cpu", runtime="venv", host="r",
                             passed=passed, reason="ok", seconds=1.0, created_at="2026-12-01T00:00:00+00:00",
                             suites=suites_report(passed, backend="cuda" if target == "cuda13" else "cpu"))
    return {"predicateType": workflow_matrix.GATE_PREDICATE_TYPE, "predicate": asdict(report),
            "subject": [{"digest": {"sha256": wheel.sha256}}]}


def _fake_gh(monkeypatch, gate_passes: bool = True, provenance: bool = True) -> None:
    def verified(settings, wheel, repo, predicate_type, log):
        assert repo == REPO
        if predicate_type == attestations.SLSA_PROVENANCE:
            if not provenance:
                raise GateError("no provenance")
            return [{"predicateType": predicate_type}]
        return [_gate_statement(wheel, wheel.target, gate_passes)]
    monkeypatch.setattr(attestations, "verified_statements", verified)


def _run(settings, matrix, artifacts, waivers):
    plan = workflow_matrix.plan(matrix, waivers=waivers, dry_run=False)
    return release_publish.release_publish(settings, matrix, plan, artifacts=artifacts, repo=REPO,
                                           previous_index="", pages=settings.build_dir / "pages",
                                           pypi_dir=settings.build_dir / "pypi",
                                           log=settings.build_dir / "publish.log")


def test_gated_waived_and_held_back(setup, monkeypatch) -> None:
    settings, matrix, artifacts, wheels = setup
    _fake_gh(monkeypatch)
    outcomes = {o.target: o for o in _run(settings, matrix, artifacts, {"rocm-gfx942": "no MI300X runner yet"})}
    assert outcomes["cuda13"].published and outcomes["cuda13"].pypi
    assert outcomes["cpu"].published and not outcomes["cpu"].pypi
    assert "WAIVED" in outcomes["rocm-gfx942"].verdict and outcomes["rocm-gfx942"].published
    assert not outcomes["rocm-gfx950"].published
    pages = settings.build_dir / "pages"
    assert (pages / "cu130" / "simple" / "polykernels" / wheels["cuda13"].name).exists()
    assert not (pages / matrix.target("rocm-gfx950").variant).exists()
    assert [p.name for p in (settings.build_dir / "pypi").iterdir()] == [wheels["cuda13"].name]
    notes = (pages / "RELEASE_NOTES.md").read_text()
    for name, wheel in wheels.items():
        assert wheel.sha256 in notes and name in notes
    assert "no MI300X runner yet" in notes and "vendor image not pinned yet" not in notes  # synthetic wheels
    assert "held back" in notes


def test_a_failed_gate_attestation_blocks_the_release(setup, monkeypatch) -> None:
    settings, matrix, artifacts, _ = setup
    _fake_gh(monkeypatch, gate_passes=False)
    with pytest.raises(PublishError, match="no passing report"):
        _run(settings, matrix, artifacts, {})
    assert not (settings.build_dir / "pypi").exists()


def test_a_wheel_without_our_provenance_is_refused(setup, monkeypatch) -> None:
    settings, matrix, artifacts, _ = setup
    _fake_gh(monkeypatch, provenance=False)
    with pytest.raises(GateError, match="no provenance"):
        _run(settings, matrix, artifacts, {})


def test_a_waived_pypi_target_never_reaches_pypi(setup, monkeypatch) -> None:
    settings, matrix, artifacts, _ = setup
    _fake_gh(monkeypatch)
    outcomes = {o.target: o for o in _run(settings, matrix, artifacts, {"cuda13": "H100 runner down this week"})}
    assert outcomes["cuda13"].published and not outcomes["cuda13"].pypi
    assert list((settings.build_dir / "pypi").iterdir()) == []


def test_a_missing_build_is_an_error(setup, monkeypatch) -> None:
    settings, matrix, artifacts, _ = setup
    shutil.rmtree(artifacts / "wheel-cpu")
    _fake_gh(monkeypatch)
    with pytest.raises(PublishError, match="no wheel arrived"):
        _run(settings, matrix, artifacts, {})


def test_gate_predicate_is_the_report_of_the_exact_wheel(tmp_path) -> None:
    settings = Settings(root=tmp_path)
    matrix = targets.load(ROOT / "targets.toml")
    wheel = make_wheel(tmp_path / "build" / "dist" / "cpu")
    with pytest.raises(GateError, match="no gate report"):
        attestations.gate_predicate(settings, matrix.target("cpu"))
    settings.reports.store(GateReport(**_gate_statement(wheel, "cpu")["predicate"]))
    path = attestations.gate_predicate(settings, matrix.target("cpu"))
    assert json.loads(path.read_text())["wheel_sha256"] == wheel.sha256


def test_verify_command_pins_repository_and_workflow(tmp_path) -> None:
    argv = attestations.verify_command(tmp_path / "w.whl", REPO, workflow_matrix.GATE_PREDICATE_TYPE)
    assert argv[argv.index("--signer-workflow") + 1] == f"{REPO}/.github/workflows/release.yml"
    assert argv[argv.index("--predicate-type") + 1] == "urn:polykernels:gate-report:v1"


def test_a_record_that_travelled_with_the_artifact_is_not_trusted(setup, monkeypatch) -> None:
    settings, matrix, artifacts, wheels = setup
    record = wheels["cpu"].record
    record.write_text(json.dumps({**json.loads(record.read_text()), "sha256": "0" * 64}))
    _fake_gh(monkeypatch)
    outcomes = {o.target: o for o in _run(settings, matrix, artifacts, {"rocm-gfx942": "no MI300X runner yet"})}
    assert outcomes["cpu"].sha256 == wheels["cpu"].sha256 and outcomes["cpu"].published
