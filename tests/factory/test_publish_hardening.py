"""The publish path under concurrency, races, forged reports and bad input: nothing ungated goes
out, nothing published is lost. Concurrency and races run in real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from polykernels_build import cli, gate, index, publish, serve
from polykernels_build.dist import GateReport, built, judge, sha256_of
from polykernels_build.errors import ConfigError, GateError, PublishError
from polykernels_build.settings import Settings
from polykernels_build.signing import Keyring
from tests.factory.helpers import MATRIX, gate_report, make_wheel, report_file, run_publish, suites_report

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src")}


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(root=tmp_path / "repo")


def gated(settings: Settings, **kwargs: object):
    wheel = make_wheel(settings.dist_dir / str(kwargs.get("target", "cpu")), **kwargs)  # type: ignore[arg-type]
    settings.reports.store(gate_report(wheel))
    return wheel


def served(root: Path, variant: str = "cpu") -> dict[str, str]:
    return index.published(root, variant)


# --- 1. concurrent publishes ----------------------------------------------------------------------

_PUBLISH = """
import sys
from pathlib import Path
from polykernels_build import publish, targets
from polykernels_build.settings import Settings
root, index_root, matrix = map(Path, sys.argv[1:4])
publish.publish(Settings(root=root), targets.load(matrix), index_root=index_root, repository_url=None,
                waivers={}, partial=False, log=root / "log", lock_timeout=120)
"""


def test_concurrent_publishes_lose_nothing_and_never_dangle(tmp_path: Path) -> None:
    # Three publishers, each with its own gated wheel, start together against one index, twelve
    # times. After every round the live link resolves and serves every wheel ever published.
    publishers = []
    for i in range(3):
        settings = Settings(root=tmp_path / f"publisher{i}")
        publishers.append(settings)
    index_root = tmp_path / "index"
    expected: dict[str, str] = {}
    for trial in range(12):
        wheels = [gated(s, version=f"0.{trial}.{i}") for i, s in enumerate(publishers)]
        for s in publishers:  # each round publishes only this round's wheel
            for record in s.dist_dir.glob("*/*.whl.json"):
                if not any(record.name == w.name + ".json" for w in wheels):
                    record.unlink()
        procs = [subprocess.Popen([sys.executable, "-c", _PUBLISH, str(s.root), str(index_root),
                                   str(ROOT / "targets.toml")], env=ENV, stderr=subprocess.PIPE, text=True)
                 for s in publishers]
        errors = [p.communicate(timeout=120)[1] for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0], errors
        expected.update({w.name: w.sha256 for w in wheels})
        link = index_root / "cpu"
        assert link.is_symlink() and link.resolve().is_dir(), f"trial {trial}: the live link dangles"
        assert served(index_root) == expected, f"trial {trial}: a published wheel was lost"
        for name, sha in expected.items():
            assert sha256_of(link / "simple" / "polykernels" / name) == sha
        releases = json.loads((link / "release.json").read_text())["releases"]
        assert sorted(f["filename"] for r in releases for f in r["files"]) == sorted(expected)
        stages = {p.name for p in (index_root / ".versions").iterdir() if p.is_dir()}
        assert link.resolve().name in stages and len(stages) <= 2


def test_a_held_lock_is_a_clear_error_after_the_timeout(settings: Settings) -> None:
    gated(settings)
    root = settings.build_dir / "index"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\nfrom pathlib import Path\nfrom polykernels_build import index\n"
        "with index.publish_lock(Path(sys.argv[1])):\n    print('held', flush=True)\n    time.sleep(60)\n"),
        str(root)], env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        start = time.monotonic()
        with pytest.raises(PublishError, match=r"another publish holds the lock .*pid \d+"):
            run_publish(settings, lock_timeout=0.5)
        assert time.monotonic() - start < 10
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    run_publish(settings, lock_timeout=5)  # the kernel released the dead holder's lock
    assert served(root)


# --- 2. the published bytes are the gated bytes ----------------------------------------------------

_REWRITE = """
import sys, time
from pathlib import Path
path, a, b = Path(sys.argv[1]), Path(sys.argv[2]).read_bytes(), Path(sys.argv[3]).read_bytes()
end = time.monotonic() + float(sys.argv[4])
while time.monotonic() < end:
    for data in (a, b):
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
"""


def test_a_wheel_rewritten_during_publish_never_goes_out_under_the_old_report(settings: Settings,
                                                                              tmp_path: Path) -> None:
    wheel = gated(settings)
    original = tmp_path / "original.whl"
    original.write_bytes(wheel.path.read_bytes())
    other = make_wheel(tmp_path / "other", payload=b"rewritten after the gate")
    writer = subprocess.Popen([sys.executable, "-c", _REWRITE, str(wheel.path), str(original), str(other.path),
                               "8"], env=ENV)
    outcomes = []
    try:
        for trial in range(20):
            root = tmp_path / f"index{trial}"
            try:
                run_publish(settings, index_root=root)
            except PublishError as exc:
                assert "changed after it was built and gated" in str(exc)
                assert not (root / "cpu").exists()
                outcomes.append("refused")
                continue
            assert served(root) == {wheel.name: wheel.sha256}
            assert sha256_of(root / "cpu" / "simple" / "polykernels" / wheel.name) == wheel.sha256
            release = json.loads((root / "cpu" / "release.json").read_text())["releases"][-1]
            assert release["files"][0]["sha256"] == wheel.sha256 == settings.reports.load(wheel.sha256).wheel_sha256
            outcomes.append("published")
    finally:
        writer.kill()
        writer.wait()
    assert "refused" in outcomes


# --- 3. signed reports ------------------------------------------------------------------------------

def other_host(tmp_path: Path) -> Keyring:
    return Keyring(keys_dir=tmp_path / "gpu-host-keys", repository_signers=tmp_path / "none")


def test_a_hand_written_report_claiming_nvidia_is_refused(settings: Settings, tmp_path: Path) -> None:
    wheel = make_wheel(settings.dist_dir / "cuda13", target="cuda13", variant="cu130")
    forged = report_file(tmp_path / "forged.json", gate_report(wheel, backend="cuda", arch="sm_90"))
    with pytest.raises(GateError, match="is not signed"):
        gate.import_report(settings, MATRIX, forged)
    assert not settings.reports.exists(wheel.sha256)
    with pytest.raises(PublishError, match="no gate report"):
        run_publish(settings)


def test_unknown_signer_refused_until_its_key_is_in_allowed_signers(settings: Settings, tmp_path: Path) -> None:
    wheel = make_wheel(settings.dist_dir / "cuda13", target="cuda13", variant="cu130")
    gpu = other_host(tmp_path)
    source = report_file(tmp_path / "r.json", gate_report(wheel, backend="cuda", arch="sm_90"), gpu)
    with pytest.raises(GateError, match="not from an allowed signer"):
        gate.import_report(settings, MATRIX, source)
    # Reviewed into the repository's allowed_signers: now the same file is accepted.
    settings.root.mkdir(parents=True, exist_ok=True)
    (settings.root / "allowed_signers").write_text(gpu.local_signers.read_text())
    assert gate.import_report(settings, MATRIX, source).passed
    decisions = run_publish(settings)
    assert decisions[0].publish and f"signed by {gpu.principal}" in decisions[0].basis


def test_a_report_changed_after_signing_is_refused(settings: Settings, tmp_path: Path) -> None:
    wheel = make_wheel(settings.dist_dir / "cpu")
    source = report_file(tmp_path / "r.json", gate_report(wheel, passed=False), settings.keyring)
    data = json.loads(source.read_text())
    data.update(passed=True, reason="all suites passed", suites=suites_report(True))
    source.write_text(json.dumps(data, indent=2))
    with pytest.raises(GateError, match="not from an allowed signer"):
        gate.import_report(settings, MATRIX, source)


def test_a_report_dropped_into_the_store_unsigned_blocks_publish(settings: Settings) -> None:
    wheel = make_wheel(settings.dist_dir / "cpu")
    settings.reports.store(gate_report(wheel))
    settings.reports.signature_path(wheel.sha256).unlink()
    with pytest.raises(PublishError, match=r"refused: .* is not signed"):
        run_publish(settings, waivers={"cpu": "trying to waive a refused report"})


def test_trust_unsigned_is_explicit_and_recorded(settings: Settings, tmp_path: Path, capsys) -> None:
    wheel = make_wheel(settings.dist_dir / "cuda13", target="cuda13", variant="cu130")
    source = report_file(tmp_path / "r.json", gate_report(wheel, backend="cuda", arch="sm_90"))
    settings.root.mkdir(parents=True, exist_ok=True)
    os.chdir(settings.root)
    (settings.root / "targets.toml").write_text((ROOT / "targets.toml").read_text())
    code = cli.main(["gate", "--import-report", str(source), "--trust-unsigned", "H200 host, key not yet enrolled"],
                    env={"PATH": os.environ["PATH"]})
    assert code == 0
    trust = json.loads(settings.reports.trust_path(wheel.sha256).read_text())
    assert trust["reason"] == "H200 host, key not yet enrolled" and trust["signed"] is False
    run_publish(settings)
    release = json.loads((settings.build_dir / "index" / "cu130" / "release.json").read_text())["releases"][-1]
    assert "UNSIGNED, trusted on import: H200 host, key not yet enrolled" in release["files"][0]["basis"]
    # Editing the trusted report afterwards breaks the trust record.
    stored = settings.reports.path(wheel.sha256)
    stored.write_text(stored.read_text().replace('"host": "test"', '"host": "edited"'))
    assert not publish.decide(settings, MATRIX, [wheel], {})[0].publish


# --- 4. immutability per (name, version), labels ---------------------------------------------------

@pytest.mark.parametrize("renamed", [
    "polykernels-0.1.0+cpu-1-cp310-abi3-manylinux_2_34_x86_64.whl",
    "polykernels-0.1.0+cpu-cp310-abi3-manylinux_2_28_x86_64.whl",
    "polykernels-0.1.0+cpu-py3-none-any.whl",
], ids=["build-tag", "platform-tag", "pure-tag"])
def test_a_published_version_gains_no_artifact_under_another_name(settings: Settings, renamed: str) -> None:
    gated(settings)
    run_publish(settings)
    before = served(settings.build_dir / "index")
    for record in settings.dist_dir.glob("*/*.whl.json"):
        record.unlink()
    gated(settings, name=renamed, payload=b"other bytes, same version")
    with pytest.raises(PublishError, match=r"version 0.1.0\+cpu is already published as"):
        run_publish(settings)
    assert served(settings.build_dir / "index") == before


def test_a_label_that_disagrees_with_the_manifest_is_refused(settings: Settings) -> None:
    wheel = gated(settings, name="polykernels-0.1.0+cu130-cp310-abi3-manylinux_2_34_x86_64.whl")
    with pytest.raises(PublishError, match=r"labelled \+cu130, its manifest says variant 'cpu'"):
        run_publish(settings)
    assert not (settings.build_dir / "index" / "cpu").exists()
    assert wheel.label == "cu130"


# --- 5. waivers -------------------------------------------------------------------------------------

@pytest.mark.parametrize("report", ["failed", "wrong-hardware"])
def test_a_gate_that_ran_cannot_be_waived(settings: Settings, report: str) -> None:
    wheel = make_wheel(settings.dist_dir / "cuda13", target="cuda13", variant="cu130")
    if report == "failed":
        settings.reports.store(gate_report(wheel, passed=False, backend="cuda", arch="sm_90"))
    else:
        settings.reports.store(gate_report(wheel, backend="cpu"))
    with pytest.raises(PublishError, match="a waiver covers only a target with no report"):
        run_publish(settings, waivers={"cuda13": "no GPU runner this week, shipping anyway"})


def test_a_waiver_needs_a_real_reason(settings: Settings) -> None:
    make_wheel(settings.dist_dir / "rocm-gfx950", target="rocm-gfx950", variant=MATRIX.target("rocm-gfx950").variant)
    with pytest.raises(ConfigError, match="must say why in words"):
        run_publish(settings, waivers={"rocm-gfx950": "x"})


def fake_twine(tmp_path: Path) -> tuple[dict[str, str], Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    out = tmp_path / "twine-env.json"
    twine = bin_dir / "twine"
    twine.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                     f"json.dump({{'env': dict(os.environ), 'argv': sys.argv}}, open({str(out)!r}, 'w'))\n")
    twine.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}, out


def test_twine_gets_its_credentials_and_the_upload_records_waivers(tmp_path: Path) -> None:
    path_env, out = fake_twine(tmp_path)
    env = {**path_env, "TWINE_USERNAME": "__token__", "TWINE_PASSWORD": "pypi-secret", "AWS_SECRET_ACCESS_KEY": "no"}
    settings = Settings.from_env(env, tmp_path / "repo")
    gated(settings)
    make_wheel(settings.dist_dir / "rocm-gfx950", target="rocm-gfx950", variant=MATRIX.target("rocm-gfx950").variant)
    run_publish(settings, repository_url="https://packages.example.org/legacy/",
                waivers={"rocm-gfx950": "no MI355X runner this week"})
    seen = json.loads(out.read_text())
    assert seen["env"]["TWINE_USERNAME"] == "__token__" and seen["env"]["TWINE_PASSWORD"] == "pypi-secret"
    assert "AWS_SECRET_ACCESS_KEY" not in seen["env"]
    uploaded = [Path(a) for a in seen["argv"] if a.endswith(".whl")]
    assert len(uploaded) == 2 and all(settings.dist_dir not in p.parents for p in uploaded)  # the staged copies
    record = json.loads(next((settings.build_dir / "uploads").glob("*.json")).read_text())
    waived = [f for f in record["files"] if f["waived"]]
    assert [f["target"] for f in waived] == ["rocm-gfx950"] and "no MI355X runner" in waived[0]["basis"]
    # Credentials never reach the other tools.
    assert "TWINE_PASSWORD" not in settings.tool_env


# --- 6. failure paths: failed imports, malformed input ---------------------------------------------

def in_repo(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.root.mkdir(parents=True, exist_ok=True)
    (settings.root / "targets.toml").write_text((ROOT / "targets.toml").read_text())
    monkeypatch.chdir(settings.root)


def test_a_failed_import_is_stored_and_the_next_import_still_runs(settings: Settings, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    in_repo(settings, monkeypatch)
    failing = make_wheel(settings.dist_dir / "cuda13", target="cuda13", variant="cu130")
    passing = make_wheel(settings.dist_dir / "cpu")
    first = report_file(tmp_path / "a.json", gate_report(failing, passed=False, backend="cuda", arch="sm_90"),
                        settings.keyring)
    second = report_file(tmp_path / "b.json", gate_report(passing), settings.keyring)
    env = {"PATH": os.environ["PATH"]}
    assert cli.main(["gate", "--import-report", str(first), str(second)], env=env) == GateError.return_code
    assert settings.reports.load(failing.sha256).passed is False and settings.reports.load(passing.sha256).passed
    assert "Traceback" not in capsys.readouterr().err
    assert cli.main(["publish", "--partial"], env=env) == 0
    assert served(settings.build_dir / "index") == {passing.name: passing.sha256}


MALFORMED_REPORTS = {
    "not-json": b"{ nope",
    "a-list": b"[1, 2]",
    "passed-string": None,
    "suites-duplicated": None,
    "sha-short": None,
    "binary": b"\xff\xfe\x00garbage",
}


@pytest.mark.parametrize("case", list(MALFORMED_REPORTS))
def test_malformed_reports_are_errors_with_a_code(settings: Settings, tmp_path: Path, case: str,
                                                  monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    in_repo(settings, monkeypatch)
    wheel = make_wheel(settings.dist_dir / "cpu")
    data = gate_report(wheel).__dict__.copy()
    if case == "passed-string":
        data["passed"] = "yes"
    elif case == "suites-duplicated":
        data["suites"] = {**data["suites"], "suites": [{"name": "int4_parity", "status": "failed"},
                                                       *data["suites"]["suites"]]}
    elif case == "sha-short":
        data["wheel_sha256"] = "abc"
    source = tmp_path / "r.json"
    source.write_bytes(MALFORMED_REPORTS[case] or json.dumps(data).encode())
    code = cli.main(["gate", "--import-report", str(source), "--trust-unsigned", "testing malformed input"],
                    env={"PATH": os.environ["PATH"]})
    err = capsys.readouterr().err
    assert code == GateError.return_code and "Traceback" not in err and "error:" in err
    assert not settings.reports.exists(wheel.sha256)


def test_judge_refuses_duplicated_suites() -> None:
    suites = suites_report(True)
    suites["suites"].insert(0, {"name": "int4_parity", "status": "failed"})
    with pytest.raises(GateError, match=r"suites reported more than once: \['int4_parity'\]"):
        judge(suites)


def test_corrupt_release_json_is_a_publish_error(settings: Settings, monkeypatch: pytest.MonkeyPatch,
                                                 capsys) -> None:
    gated(settings)
    run_publish(settings)
    live = settings.build_dir / "index" / "cpu"
    (live / "release.json").write_text("{ truncated")
    gated(settings, version="0.1.1")
    in_repo(settings, monkeypatch)
    assert cli.main(["publish"], env={"PATH": os.environ["PATH"]}) == PublishError.return_code
    err = capsys.readouterr().err
    assert "release.json is corrupt" in err and "Traceback" not in err


@pytest.mark.parametrize("name", ["evil.whl", "other_project-1.0-py3-none-any.whl"])
def test_a_badly_named_wheel_is_an_error_with_a_code(settings: Settings, tmp_path: Path, name: str,
                                                     monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    in_repo(settings, monkeypatch)
    good = make_wheel(tmp_path / "good")
    bad = tmp_path / name
    bad.write_bytes(good.path.read_bytes())
    assert cli.main(["gate", "--wheel", str(bad), "--runtime", "venv"], env={}) == GateError.return_code
    err = capsys.readouterr().err
    assert name in err and "Traceback" not in err
    # ... and as a build record under build/dist
    record_dir = settings.dist_dir / "cpu"
    record_dir.mkdir(parents=True)
    (record_dir / f"{name}.json").write_text(json.dumps({"name": name, "sha256": good.sha256,
                                                         "manifest": good.manifest}))
    with pytest.raises(GateError, match=name.replace(".", r"\.")):
        built(settings.dist_dir)


def test_a_corrupt_build_record_is_an_error(settings: Settings) -> None:
    wheel = make_wheel(settings.dist_dir / "cpu")
    wheel.record.write_text('{"name": 3}')
    with pytest.raises(GateError, match="is not a build record"):
        built(settings.dist_dir)


# --- 7. serve ----------------------------------------------------------------------------------------

def test_serve_hides_staged_versions_and_escapes_client_data(settings: Settings, capsys) -> None:
    gated(settings)
    run_publish(settings)
    root = settings.build_dir / "index"
    (root / ".versions" / "cpu-staged-never-swapped").mkdir()
    server = serve.make_server(root, 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with urllib.request.urlopen(base + "/", timeout=10) as response:
            listing = response.read().decode()
        assert "cpu/" in listing and ".versions" not in listing and ".lock" not in listing
        for path in ["/.versions/", "/.versions/cpu-staged-never-swapped/", "/%2eversions/", "/.lock",
                     f"/.versions/{os.readlink(root / 'cpu').split('/')[-1]}/simple/polykernels/"]:
            with pytest.raises(urllib.error.HTTPError) as error:
                urllib.request.urlopen(base + path, timeout=10)
            error.value.close()
            assert error.value.code == 404, path
        import socket

        with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=10) as conn:
            conn.sendall(b"GET /\x1b[2J\x1b]0;owned\x07 HTTP/1.0\r\n\r\n")
            conn.recv(1024)
    finally:
        server.shutdown()
        server.server_close()
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\\x1b[2J" in out


def test_report_store_round_trip_is_signed(settings: Settings) -> None:
    wheel = make_wheel(settings.dist_dir / "cpu")
    settings.reports.store(gate_report(wheel))
    trusted = settings.reports.trusted(wheel.sha256)
    assert trusted is not None and trusted.signer == settings.keyring.principal
    assert isinstance(trusted.report, GateReport)


def test_a_passphrase_protected_key_fails_at_once_instead_of_asking(tmp_path: Path) -> None:
    # A gate host's key with a passphrase: ssh-keygen would ask on the terminal and wait; the gate
    # gives it no terminal and no stdin, so it refuses the key at once with ssh-keygen's reason.
    key = tmp_path / "protected"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "a passphrase", "-f", str(key)], check=True,
                   capture_output=True)
    keyring = Keyring(keys_dir=tmp_path / "keys", repository_signers=tmp_path / "none", key=key,
                      env=dict(os.environ))
    start = time.monotonic()
    with pytest.raises(GateError, match="is not a usable SSH private key"):
        keyring.sign(b"report")
    assert time.monotonic() - start < 30


def test_an_ssh_keygen_that_never_answers_is_a_clear_error(tmp_path: Path, monkeypatch) -> None:
    from polykernels_build import signing

    tools = tmp_path / "bin"
    tools.mkdir()
    stuck = tools / "ssh-keygen"
    stuck.write_text("#!/bin/sh\nsleep 30\n")
    stuck.chmod(0o755)
    monkeypatch.setattr(signing, "SSH_KEYGEN_TIMEOUT", 1.0)
    keyring = Keyring(keys_dir=tmp_path / "keys", repository_signers=tmp_path / "none",
                      env={**os.environ, "PATH": f"{tools}:{os.environ['PATH']}"})
    start = time.monotonic()
    with pytest.raises(GateError, match=r"ssh-keygen -q -t \.\.\.` did not answer in 1 s"):
        keyring.sign(b"report")
    assert time.monotonic() - start < 10
