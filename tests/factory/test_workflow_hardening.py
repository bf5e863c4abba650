"""Every workflow: actions pinned by commit SHA, least permissions, no expression inside a script."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
# -s SESSION, -s "$SESSION", or a parametrized session such as -s "wheel($TARGET)"
NOX_STEP = re.compile(r"^pipx run nox==\d[\w.]* -s ([\w-]+|\"\$[A-Z_]+\"|\"[\w-]+\(\$[A-Z_]+\)\")")


def _load(path: Path) -> dict:
    data = yaml.safe_load(path.read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as True
    return data


def _steps(path: Path) -> list[tuple[str, dict]]:
    return [(name, step) for name, job in _load(path)["jobs"].items() for step in job.get("steps", [])]


@pytest.fixture(params=WORKFLOWS, ids=lambda p: p.name)
def workflow(request) -> Path:
    return request.param


def test_workflows_exist() -> None:
    assert {p.name for p in WORKFLOWS} >= {"ci.yml", "release.yml", "pin-images.yml"}


def test_every_action_is_pinned_by_commit_sha_with_its_version(workflow: Path) -> None:
    uses = re.findall(r"uses:\s*(\S+)(.*)$", workflow.read_text(), re.M)
    assert uses
    for ref, comment in uses:
        assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", ref), f"{workflow.name}: {ref} is not pinned by SHA"
        assert re.fullmatch(r"\s*# v\d+(\.\d+)*", comment), f"{workflow.name}: {ref} lacks its `# vX.Y.Z` comment"


def test_no_floating_images_or_refs(workflow: Path) -> None:
    data = _load(workflow)
    for name, job in data["jobs"].items():
        for key in ("container", "services"):
            assert key not in job, f"{workflow.name}:{name} runs a container image outside the factory"
    assert "@main" not in workflow.read_text() and "@master" not in workflow.read_text()


def test_no_expression_inside_run(workflow: Path) -> None:
    for job, step in _steps(workflow):
        if "run" in step:
            assert "${{" not in step["run"], f"{workflow.name}:{job}: values go through env:, not into the script"


def test_every_run_step_is_a_nox_session(workflow: Path) -> None:
    for job, step in _steps(workflow):
        if "run" in step:
            assert NOX_STEP.match(step["run"].strip()), f"{workflow.name}:{job}: {step['run']!r}"
            assert "\n" not in step["run"].strip()


def test_least_permissions(workflow: Path) -> None:
    data = _load(workflow)
    assert data["permissions"] == {}
    assert "pull_request_target" not in data["on"]
    for name, job in data["jobs"].items():
        assert "permissions" in job, f"{workflow.name}:{name} must state its permissions"
        assert "write-all" not in str(job["permissions"])


def test_checkouts_do_not_persist_credentials(workflow: Path) -> None:
    for job, step in _steps(workflow):
        if step.get("uses", "").startswith("actions/checkout@"):
            assert step.get("with", {}).get("persist-credentials") is False, f"{workflow.name}:{job}"


def test_id_token_only_where_something_is_signed_or_published(workflow: Path) -> None:
    signers = ("actions/attest", "pypa/gh-action-pypi-publish", "actions/deploy-pages")
    for name, job in _load(workflow)["jobs"].items():
        if job["permissions"].get("id-token") == "write":
            assert any(s.get("uses", "").startswith(signers) for s in job["steps"]), f"{workflow.name}:{name}"
