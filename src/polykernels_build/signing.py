"""Gate reports are signed the way git signs commits: SSH signatures (``ssh-keygen -Y sign``),
verified against ``allowed_signers`` files (``ssh-keygen -Y verify``).

Who may sign is data: the repository's ``allowed_signers`` (reviewed like code: the keys of the
GPU hosts whose reports a release accepts) and this host's own gate key, which the gate creates
under build/keys on first use (or takes from ``POLYKERNELS_GATE_KEY``) and lists in
build/keys/allowed_signers. A report signed by neither is refused unless an operator imports it
with an explicit, recorded trust flag.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from polykernels_build.errors import ConfigError, GateError

NAMESPACE = "polykernels-gate-report"
KEY_NAME = "gate_ed25519"
SSH_KEYGEN_TIMEOUT = 30.0  # seconds; every call here answers in milliseconds when it works


def _ssh_keygen(env: Mapping[str, str]) -> str:
    found = shutil.which("ssh-keygen", path=env.get("PATH"))
    if found is None:
        raise ConfigError("ssh-keygen is not installed: gate reports are signed and verified with SSH signatures",
                          hint="apt-get install -y openssh-client")
    return found


def _call(argv: Sequence[str], env: Mapping[str, str], data: bytes | None = None) -> subprocess.CompletedProcess:
    # No terminal and no open stdin: ssh-keygen asks for a passphrase on the controlling terminal
    # when a key is protected, and a runner's terminal would make that question wait until the timeout.
    try:
        return subprocess.run(list(argv), input=data if data is not None else b"", capture_output=True,
                              check=False, timeout=SSH_KEYGEN_TIMEOUT, env=dict(env), start_new_session=True)
    except subprocess.TimeoutExpired:
        raise GateError(f"`{' '.join(map(str, argv[:3]))} ...` did not answer in {SSH_KEYGEN_TIMEOUT:.0f} s",
                        hint="run it by hand on this host to see what it waits for (a passphrase, entropy); "
                        "or sign with a key given by POLYKERNELS_GATE_KEY") from None


@dataclass(frozen=True, kw_only=True)
class Keyring:
    """The keys this host signs with and the allowed_signers files it verifies against."""

    keys_dir: Path  # build/keys: this host's gate key and its allowed_signers line
    repository_signers: Path  # allowed_signers kept in the repository
    key: Path | None = None  # POLYKERNELS_GATE_KEY: sign with this private key instead of build/keys'
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def local_signers(self) -> Path:
        return self.keys_dir / "allowed_signers"

    @property
    def principal(self) -> str:
        return f"gate@{socket.gethostname()}"

    def signing_key(self) -> Path:
        """The private key the gate signs with; created (ed25519, no passphrase) on first use."""
        tool = _ssh_keygen(self.env)
        key = self.key or self.keys_dir / KEY_NAME
        if self.key is not None and not key.is_file():
            raise ConfigError(f"POLYKERNELS_GATE_KEY={key}: no such private key")
        if not key.is_file():
            self.keys_dir.mkdir(parents=True, exist_ok=True)
            made = _call([tool, "-q", "-t", "ed25519", "-N", "", "-C", self.principal, "-f", str(key)], self.env)
            if made.returncode:
                raise GateError(f"could not create the gate key {key}: {made.stderr.decode(errors='replace')}")
        public = _call([tool, "-y", "-f", str(key)], self.env)
        if public.returncode:
            raise GateError(f"{key} is not a usable SSH private key: {public.stderr.decode(errors='replace')}")
        line = f'{self.principal} namespaces="{NAMESPACE}" {public.stdout.decode().strip()}\n'
        lines = self.local_signers.read_text().splitlines(keepends=True) if self.local_signers.is_file() else []
        if line not in lines:
            self.keys_dir.mkdir(parents=True, exist_ok=True)
            self.local_signers.write_text("".join([*lines, line]))
        return key

    def sign(self, data: bytes) -> bytes:
        """An armored SSH signature of ``data`` by this host's gate key."""
        key = self.signing_key()
        signed = _call([_ssh_keygen(self.env), "-Y", "sign", "-q", "-f", str(key), "-n", NAMESPACE], self.env, data)
        if signed.returncode or b"BEGIN SSH SIGNATURE" not in signed.stdout:
            raise GateError(f"signing the gate report with {key} failed: {signed.stderr.decode(errors='replace')}")
        return signed.stdout

    def verify(self, data: bytes, signature: bytes | None, source: str) -> str:
        """The principal that signed ``data``; a GateError when it is unsigned or no allowed signer made it."""
        if not signature:
            raise GateError(f"{source} is not signed", hint="sign reports with the gate (it signs what it writes), "
                            "or import with --trust-unsigned REASON to accept it on your own authority")
        tool = _ssh_keygen(self.env)
        allowed = "".join(p.read_text() + "\n" for p in (self.repository_signers, self.local_signers) if p.is_file())
        with tempfile.TemporaryDirectory() as tmp:
            signers, sig = Path(tmp) / "allowed_signers", Path(tmp) / "report.sig"
            signers.write_text(allowed)
            sig.write_bytes(signature)
            found = _call([tool, "-Y", "find-principals", "-s", str(sig), "-f", str(signers)], self.env)
            principals = found.stdout.decode(errors="replace").split() if found.returncode == 0 else []
            for principal in principals:
                checked = _call([tool, "-Y", "verify", "-f", str(signers), "-I", principal, "-n", NAMESPACE,
                                 "-s", str(sig)], self.env, data)
                if checked.returncode == 0:
                    return principal
        raise GateError(f"{source}: the signature is not from an allowed signer (or the report was changed after "
                        "it was signed)", hint=f"allowed signers: {self.repository_signers} (reviewed keys of gate "
                        f"hosts) and {self.local_signers} (this host's gate); or import with --trust-unsigned REASON")
