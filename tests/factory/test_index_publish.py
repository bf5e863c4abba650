from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from polykernels_build import backends, gate, serve
from polykernels_build.dist import GateReport, Wheel, judge, sha256_of
from polykernels_build.errors import ConfigError, GateError, PublishError
from polykernels_build.settings import Settings
from tests.factory.helpers import MATRIX, make_wheel, run_publish, suites_report

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(root=tmp_path)


def gated_wheel(settings: Settings, target: str = "cpu", variant: str = "cpu", passed: bool = True,
                backend: str = "cpu", arch: str | None = None, payload: bytes = b"x", version: str = "0.1.0") -> Wheel:
    wheel = make_wheel(settings.dist_dir / target, target=target, variant=variant, payload=payload, version=version)
    suites = suites_report(passed, backend, arch)
    ok, reason = judge(suites)
    settings.reports.store(GateReport(
        wheel_sha256=wheel.sha256, wheel_name=wheel.name, target=target, variant=variant,
        hardware_class=backends.hardware_class(suites["platform"]), runtime="venv", host="test", passed=ok,
        reason=reason, seconds=1.0, created_at="2026-11-29T00:00:00+00:00", suites=suites))
    return wheel


def test_publish_writes_pep503_and_pep691(settings: Settings) -> None:
    wheel = gated_wheel(settings)
    run_publish(settings)
    project = settings.build_dir / "index" / "cpu" / "simple" / "polykernels"
    page = (project / "index.html").read_text()
    sha = wheel.sha256
    assert sha == sha256_of(wheel.path)
    assert f'href="{wheel.name}#sha256={sha}"' in page and 'data-requires-python="&gt;=3.10"' in page
    data = json.loads((project / "index.json").read_text())
    assert data["meta"]["api-version"] == "1.1" and data["files"][0]["hashes"]["sha256"] == sha
    assert (settings.build_dir / "index" / "cpu").is_symlink()


def test_tampered_wheel_is_refused(settings: Settings) -> None:
    wheel = gated_wheel(settings)
    data = bytearray(wheel.path.read_bytes())
    data[-30] ^= 1  # one byte changed after the gate ran
    wheel.path.write_bytes(bytes(data))
    with pytest.raises(PublishError, match="changed after it was built and gated"):
        run_publish(settings)
    assert not (settings.build_dir / "index" / "cpu").exists()


def test_failing_suite_blocks_and_partial_publishes_the_rest(settings: Settings) -> None:
    gated_wheel(settings)
    gated_wheel(settings, target="cuda13", variant="cu130", passed=False, backend="cuda", arch="sm_90")
    with pytest.raises(PublishError, match=r"cuda13: int4_parity: failed"):
        run_publish(settings)
    assert not (settings.build_dir / "index").exists() or not (settings.build_dir / "index" / "cpu").exists()
    decisions = run_publish(settings, partial=True)
    assert {d.target: d.publish for d in decisions} == {"cpu": True, "cuda13": False}


def test_wrong_hardware_class_is_not_a_pass(settings: Settings) -> None:
    gated_wheel(settings, target="cuda13", variant="cu130", backend="cpu")  # the suites passed, but on a CPU
    with pytest.raises(PublishError, match="report ran on cpu"):
        run_publish(settings)


def test_waiver_is_recorded_in_index_and_notes(settings: Settings) -> None:
    make_wheel(settings.dist_dir / "rocm-gfx950", target="rocm-gfx950", variant="rocm7.2.gfx950")
    run_publish(settings, waivers={"rocm-gfx950": "no MI355X runner this week"})
    live = settings.build_dir / "index" / "rocm7.2.gfx950"
    release = json.loads((live / "release.json").read_text())
    assert release["releases"][-1]["files"][0]["waived"] is True
    assert "no MI355X runner this week" in (live / "RELEASE_NOTES.md").read_text()


def test_same_bytes_twice_is_a_noop_different_bytes_an_error(settings: Settings) -> None:
    gated_wheel(settings)
    run_publish(settings)
    run_publish(settings)  # same bytes again: fine
    shutil.rmtree(settings.dist_dir)
    gated_wheel(settings, payload=b"other bytes, same version")
    with pytest.raises(PublishError, match="already published with different bytes"):
        run_publish(settings)


# Run as a separate process and killed with SIGKILL once its new index version is staged. The
# stand-in for _verify (test code, in the child only) signals "staged" and waits to be killed.
_PUBLISH_AND_HANG = """
import sys, time
from pathlib import Path
from polykernels_build import index, publish, targets
from polykernels_build.settings import Settings

def hang(stage, files, release):
    print("staged", stage, flush=True)
    time.sleep(600)

index._verify = hang
root = Path(sys.argv[1])
publish.publish(Settings(root=root), targets.load(Path(sys.argv[2])), index_root=None, repository_url=None,
                waivers={}, partial=False, log=root / "log")
"""


def test_killed_publish_leaves_previous_index_and_next_run_cleans_up(settings: Settings) -> None:
    first = gated_wheel(settings)
    run_publish(settings)
    root = settings.build_dir / "index"
    live = root / "cpu" / "simple" / "polykernels" / "index.html"
    before = live.read_text()
    live_version = Path(os.readlink(root / "cpu")).name
    second = gated_wheel(settings, version="0.1.1")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    argv = [sys.executable, "-c", _PUBLISH_AND_HANG, str(settings.root), str(ROOT / "targets.toml")]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env) as child:
        try:
            line = child.stdout.readline()
            assert line.startswith("staged"), line
            stage = Path(line.split()[1])
            assert stage.is_dir()
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    # The killed publish changed nothing a user sees, and left its stage behind.
    assert live.read_text() == before and Path(os.readlink(root / "cpu")).name == live_version
    assert first.name in before and second.name not in before
    assert stage.is_dir()
    # The next publish removes the stale stage and goes live with both wheels.
    run_publish(settings)
    assert not stage.exists()
    after = live.read_text()
    assert first.name in after and second.name in after
    assert {p.name for p in (root / ".versions").iterdir() if p.is_dir()} == {
        live_version, Path(os.readlink(root / "cpu")).name}


def test_import_report_checks_the_wheel_bytes(settings: Settings, tmp_path: Path) -> None:
    wheel = gated_wheel(settings)
    report_path = settings.reports.path(wheel.sha256)
    outside = tmp_path / "from-gpu-runner.json"
    shutil.copy(report_path, outside)
    shutil.copy(settings.reports.signature_path(wheel.sha256), outside.with_name(outside.name + ".sig"))
    assert gate.import_report(settings, MATRIX, outside).passed
    data = json.loads(outside.read_text())
    data["wheel_sha256"] = "0" * 64
    outside.write_text(json.dumps(data))
    with pytest.raises(GateError, match="not under"):
        gate.import_report(settings, MATRIX, outside)
    data = json.loads(report_path.read_text())
    data["passed"] = not data["passed"]  # a verdict that does not follow from its own results
    outside.write_text(json.dumps(data))
    with pytest.raises(GateError, match="does not follow"):
        gate.import_report(settings, MATRIX, outside)


def test_serve_negotiates_pep691_json(settings: Settings) -> None:
    gated_wheel(settings)
    run_publish(settings)
    server = serve.make_server(settings.build_dir / "index", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/cpu/simple/polykernels/"
        html_page = urllib.request.urlopen(url, timeout=10).read().decode()
        request = urllib.request.Request(url, headers={"Accept": serve.JSON_TYPE})
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.headers["Content-Type"] == serve.JSON_TYPE
            assert json.loads(response.read())["name"] == "polykernels"
        assert "#sha256=" in html_page
    finally:
        server.shutdown()
        server.server_close()


def test_missing_runtime_image_is_one_clear_error(settings: Settings, monkeypatch) -> None:
    from polykernels_build import engine
    from polykernels_build.errors import ImageError

    wheel = make_wheel(settings.dist_dir / "cuda13", target="cuda13", variant="cu130")
    monkeypatch.setattr(engine, "require_engine", lambda tool_env: None)
    monkeypatch.setattr(engine, "image_id", lambda reference, tool_env: None)
    with pytest.raises(ConfigError, match=r"runtime image pytorch/pytorch:.* is not pinned by digest"):
        gate.gate(settings, MATRIX, wheel, runtime="container", profile="vendor", log=settings.build_dir / "log")
    with pytest.raises(ImageError, match=r"image pytorch/pytorch:.* is not present") as error:
        gate.gate(settings, MATRIX, wheel, runtime="container", profile="vendor", log=settings.build_dir / "log",
                  allow_unpinned=True)
    assert "pull" in (error.value.hint or "")


def test_offline_gpu_gate_says_where_to_gate(settings: Settings, monkeypatch) -> None:
    from polykernels_build import engine

    wheel = make_wheel(settings.dist_dir / "cuda13", target="cuda13", variant="cu130")
    monkeypatch.setattr(engine, "require_engine", lambda tool_env: None)
    with pytest.raises(GateError, match="no GPU runtime image") as error:
        gate.gate(settings, MATRIX, wheel, runtime="container", profile="offline", log=settings.build_dir / "log")
    assert "--runtime venv" in (error.value.hint or "")
