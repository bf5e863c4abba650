"""Everything the factory takes from its environment, read once (by the CLI) from an injected
mapping. No other factory module reads os.environ: tests pass a dict.

Variables:
- ``POLYKERNELS_CA_BUNDLE`` (else ``PIP_CERT``, else ``SSL_CERT_FILE``): a CA bundle for TLS-
  intercepting networks, copied only into the download stages of image builds and mounted
  read-only into containers; never baked into a final image.
- ``POLYKERNELS_KEEP_CONTAINER=1``: keep containers after a step, for debugging.
- ``POLYKERNELS_GATE_KEY``: the SSH private key the gate signs its reports with (default: one it
  creates under build/keys on first use); signing.py says who is believed.
- ``TWINE_USERNAME``, ``TWINE_PASSWORD``, ``TWINE_CERT``: passed to twine alone, for
  ``publish --repository-url`` (never to builds or containers).
- ``GITHUB_ACTIONS``, ``GITHUB_STEP_SUMMARY``: log groups and the summary in Actions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from polykernels_build.dist import ReportStore
from polykernels_build.signing import Keyring

_PASSED_TO_TOOLS = ("PATH", "HOME", "DOCKER_HOST", "DOCKER_CONFIG", "LANG", "TMPDIR", "PIP_CERT", "SSL_CERT_FILE",
                    "PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_CONFIG_FILE", "PYTHONPATH",
                    "GH_TOKEN")  # GH_TOKEN: `gh attestation verify` (set only on the steps that verify)
# What twine needs to authenticate to a repository, and nothing else: tokens never reach other tools.
_PASSED_TO_TWINE = ("TWINE_USERNAME", "TWINE_PASSWORD", "TWINE_CERT")


@dataclass(frozen=True, kw_only=True)
class Settings:
    root: Path
    ca_bundle: Path | None = None
    keep_containers: bool = False
    github_actions: bool = False
    tool_env: Mapping[str, str] = field(default_factory=dict)
    twine_credentials: Mapping[str, str] = field(default_factory=dict)
    gate_key: Path | None = None

    @property
    def default_profile(self) -> str:
        """Vendor images where registries are reachable (GitHub's runners), offline elsewhere."""
        return "vendor" if self.github_actions else "offline"

    @property
    def build_dir(self) -> Path:
        return self.root / "build"

    @property
    def dist_dir(self) -> Path:
        return self.build_dir / "dist"

    @property
    def keyring(self) -> Keyring:
        return Keyring(keys_dir=self.build_dir / "keys", repository_signers=self.root / "allowed_signers",
                       key=self.gate_key, env=self.tool_env)

    @property
    def reports(self) -> ReportStore:
        return ReportStore(self.build_dir / "reports", self.keyring)

    @property
    def twine_env(self) -> dict[str, str]:
        return {**self.tool_env, **self.twine_credentials}

    @classmethod
    def from_env(cls, env: Mapping[str, str], root: Path) -> Settings:
        bundle = env.get("POLYKERNELS_CA_BUNDLE") or env.get("PIP_CERT") or env.get("SSL_CERT_FILE")
        return cls(
            root=root,
            ca_bundle=Path(bundle) if bundle and Path(bundle).is_file() else None,
            keep_containers=env.get("POLYKERNELS_KEEP_CONTAINER") == "1",
            github_actions=env.get("GITHUB_ACTIONS") == "true",
            tool_env={k: v for k, v in env.items() if k in _PASSED_TO_TOOLS},
            twine_credentials={k: v for k, v in env.items() if k in _PASSED_TO_TWINE},
            gate_key=Path(env["POLYKERNELS_GATE_KEY"]) if env.get("POLYKERNELS_GATE_KEY") else None,
        )
