"""targets.toml, loaded once into frozen dataclasses; unknown keys and bad values are errors."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from polykernels_build import backends
from polykernels_build.errors import ConfigError

PROFILES = ("vendor", "offline")
HARDWARE = ("any", "nvidia", "gfx942", "gfx950")
VARIANT = re.compile(r"^[a-z0-9]+(\.[a-z0-9]+)*$")
DIGEST = re.compile(r"^(sha256:[0-9a-f]{64})?$")


@dataclass(frozen=True, kw_only=True)
class VendorImage:
    image: str
    digest: str  # "" = not pinned yet

    @property
    def reference(self) -> str:
        return f"{self.image}@{self.digest}" if self.digest else self.image


@dataclass(frozen=True, kw_only=True)
class OfflineRecipe:
    recipe: str


@dataclass(frozen=True, kw_only=True)
class Bootstrap:
    name: str
    suite: str
    packages: tuple[str, ...]
    python: str  # cibuildwheel interpreter tag, e.g. cp311
    # Installed from Debian experimental on top of the suite (apt version globs pin them), e.g. a
    # ROCm HIP stack newer than the suite's own. Optional.
    experimental: tuple[str, ...] = ()
    # The manylinux floor the recipe's host code reaches (auditwheel repair enforces it), and why
    # when it is above torch's own 2_28 (recorded in every manifest built on it).
    manylinux: str = "2_28"
    floor_reason: str = ""


@dataclass(frozen=True, kw_only=True)
class Target:
    name: str
    backend: str  # a key of backends.BACKENDS
    archs: tuple[str, ...]
    toolkit: str
    torch_floor: str
    variant: str
    hardware: str
    size_budget_mib: float
    runners: tuple[str, ...]
    vendor: VendorImage
    runtime: VendorImage
    offline: OfflineRecipe
    # The one target PyPI serves as plain `pip install polykernels` ([release] pypi): built without a
    # local version label, because PyPI refuses labels. Its variant index serves the same file.
    pypi: bool = False


@dataclass(frozen=True, kw_only=True)
class Matrix:
    path: Path
    build_torch: str
    build_torch_sha256: tuple[str, ...]  # the torch wheel files accepted for build_torch
    index_url: str  # root URL of the variant indexes, recorded in every manifest (overridable per release)
    targets: Mapping[str, Target]
    bootstraps: Mapping[str, Bootstrap] = field(default_factory=dict)

    def target(self, name: str) -> Target:
        if name not in self.targets:
            raise ConfigError(f"unknown target {name!r}", hint=f"choose one of: {', '.join(self.targets)}")
        return self.targets[name]

    def bootstrap_for(self, target: Target) -> Bootstrap:
        return self.bootstraps[target.offline.recipe]


_TARGET_KEYS = {f.name for f in dataclasses.fields(Target)} - {"name", "pypi"}
_BOOTSTRAP_KEYS = {f.name for f in dataclasses.fields(Bootstrap)} - {"name"}
_BOOTSTRAP_OPTIONAL = {"experimental", "manylinux", "floor_reason"}
MANYLINUX = re.compile(r"^2_\d+$")


def _require(table: Mapping[str, Any], keys: set[str], where: str, path: Path,
             optional: frozenset[str] | set[str] = frozenset()) -> None:
    unknown = set(table) - keys
    if unknown:
        raise ConfigError(f"{path}: [{where}] has unknown keys {sorted(unknown)}; allowed: {sorted(keys)}")
    missing = keys - set(table) - set(optional)
    if missing:
        raise ConfigError(f"{path}: [{where}] is missing {sorted(missing)}")


def _check(ok: bool, path: Path, where: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{path}: [{where}] {message}")


def _target(name: str, table: Mapping[str, Any], path: Path, bootstraps: Mapping[str, Bootstrap]) -> Target:
    where = f"target.{name}"
    _require(table, _TARGET_KEYS, where, path)
    backend = table["backend"]
    _check(backend in backends.BACKENDS, path, where,
           f"backend must be one of {tuple(backends.BACKENDS)}, got {backend!r}")
    archs = tuple(table["archs"])
    problem = backends.BACKENDS[backend].arch_problem(archs)
    _check(problem is None, path, where, str(problem))
    _check(table["hardware"] in HARDWARE, path, where, f"hardware must be one of {HARDWARE}")
    _check(bool(VARIANT.match(table["variant"])), path, where,
           f"variant {table['variant']!r} must be lowercase letters/digits separated by dots")
    _check(bool(re.match(r"^\d+\.\d+$", table["torch_floor"])), path, where, "torch_floor must be MAJOR.MINOR")
    label = backends.BACKENDS[backend].variant_label(str(table["toolkit"]), archs)
    _check(table["variant"] == label, path, where,
           f"variant {table['variant']!r} does not say what the wheel links: toolkit {table['toolkit']} and archs "
           f"{list(archs)} make it {label!r}")
    vendor = table["vendor"]
    _require(vendor, {"image", "digest"}, f"{where}.vendor", path)
    _check(bool(DIGEST.match(vendor["digest"])), path, f"{where}.vendor", "digest must be sha256:<64 hex> or empty")
    runtime = table["runtime"]
    _require(runtime, {"image", "digest"}, f"{where}.runtime", path)
    _check(bool(DIGEST.match(runtime["digest"])), path, f"{where}.runtime", "digest must be sha256:<64 hex> or empty")
    offline = table["offline"]
    _require(offline, {"recipe"}, f"{where}.offline", path)
    _check(offline["recipe"] in bootstraps, path, f"{where}.offline",
           f"recipe {offline['recipe']!r} has no [bootstrap.{offline['recipe']}] table")
    return Target(
        name=name, backend=backend, archs=archs, toolkit=str(table["toolkit"]), torch_floor=table["torch_floor"],
        variant=table["variant"], hardware=table["hardware"], size_budget_mib=float(table["size_budget_mib"]),
        runners=tuple(table["runners"]),
        vendor=VendorImage(image=vendor["image"], digest=vendor["digest"]),
        runtime=VendorImage(image=runtime["image"], digest=runtime["digest"]),
        offline=OfflineRecipe(recipe=offline["recipe"]),
    )


def load(path: Path = Path("targets.toml")) -> Matrix:
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path} not found", hint="run from the repository root") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    release = data.pop("release", {})
    _require(data, {"schema", "build", "target", "bootstrap"}, "top level", path)
    _check(data["schema"] == 1, path, "top level", f"schema {data['schema']} is not supported (expected 1)")
    _require(data["build"], {"torch", "torch_sha256", "index_url"}, "build", path)
    hashes = data["build"]["torch_sha256"]
    _check(isinstance(hashes, list) and bool(hashes) and all(isinstance(h, str) and re.match(r"^[0-9a-f]{64}$", h)
                                                             for h in hashes),
           path, "build", "torch_sha256 must be a non-empty list of sha256 hex digests")
    bootstraps = {}
    for name, table in data["bootstrap"].items():
        _require(table, _BOOTSTRAP_KEYS, f"bootstrap.{name}", path, _BOOTSTRAP_OPTIONAL)
        manylinux = str(table.get("manylinux", "2_28"))
        _check(bool(MANYLINUX.match(manylinux)), path, f"bootstrap.{name}", "manylinux must look like 2_28")
        _check(manylinux == "2_28" or bool(table.get("floor_reason")), path, f"bootstrap.{name}",
               f"manylinux {manylinux} is above torch's 2_28: say why in floor_reason")
        bootstraps[name] = Bootstrap(name=name, suite=table["suite"], packages=tuple(table["packages"]),
                                     python=table["python"], experimental=tuple(table.get("experimental", ())),
                                     manylinux=manylinux, floor_reason=str(table.get("floor_reason", "")))
    targets = {name: _target(name, table, path, bootstraps) for name, table in data["target"].items()}
    _check(set(release) <= {"pypi"}, path, "release", f"has unknown keys {sorted(set(release) - {'pypi'})}")
    pypi = release.get("pypi")
    if pypi is not None:
        _check(pypi in targets, path, "release", f"pypi names unknown target {pypi!r}; targets: {', '.join(targets)}")
        targets[pypi] = dataclasses.replace(targets[pypi], pypi=True)
    variants = [t.variant for t in targets.values()]
    _check(len(set(variants)) == len(variants), path, "target", f"variants must be unique, got {variants}")
    return Matrix(path=path, build_torch=data["build"]["torch"], build_torch_sha256=tuple(hashes),
                  index_url=data["build"]["index_url"],
                  targets=targets, bootstraps=bootstraps)


def json_schema() -> dict[str, Any]:
    """A JSON schema of targets.toml for editors, generated from the dataclasses above."""
    string_list = {"type": "array", "items": {"type": "string"}}
    image = {"type": "object", "additionalProperties": False, "required": ["image", "digest"],
             "properties": {"image": {"type": "string"}, "digest": {"type": "string", "pattern": DIGEST.pattern}}}
    target_properties: dict[str, Any] = {
        "backend": {"enum": list(backends.BACKENDS)},
        "archs": string_list,
        "toolkit": {"type": "string"},
        "torch_floor": {"type": "string", "pattern": r"^\d+\.\d+$"},
        "variant": {"type": "string", "pattern": VARIANT.pattern},
        "hardware": {"enum": list(HARDWARE)},
        "size_budget_mib": {"type": "number"},
        "runners": string_list,
        "vendor": image,
        "runtime": image,
        "offline": {"type": "object", "additionalProperties": False, "required": ["recipe"],
                    "properties": {"recipe": {"type": "string"}}},
    }
    bootstrap_properties = {"suite": {"type": "string"}, "packages": string_list, "python": {"type": "string"},
                            "experimental": string_list,
                            "manylinux": {"type": "string", "pattern": MANYLINUX.pattern},
                            "floor_reason": {"type": "string"}}
    assert set(target_properties) == _TARGET_KEYS and set(bootstrap_properties) == _BOOTSTRAP_KEYS
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "polykernels targets.toml",
        "type": "object",
        "additionalProperties": False,
        "required": ["schema", "build", "target", "bootstrap"],
        "properties": {
            "schema": {"const": 1},
            "release": {"type": "object", "additionalProperties": False,
                        "properties": {"pypi": {"type": "string"}}},
            "build": {"type": "object", "additionalProperties": False,
                      "required": ["index_url", "torch", "torch_sha256"],
                      "properties": {"torch": {"type": "string"}, "index_url": {"type": "string"},
                                     "torch_sha256": {"type": "array", "minItems": 1, "items": {
                                         "type": "string", "pattern": "^[0-9a-f]{64}$"}}}},
            "target": {"type": "object", "additionalProperties": {
                "type": "object", "additionalProperties": False, "required": sorted(_TARGET_KEYS),
                "properties": target_properties}},
            "bootstrap": {"type": "object", "additionalProperties": {
                "type": "object", "additionalProperties": False,
                "required": sorted(_BOOTSTRAP_KEYS - _BOOTSTRAP_OPTIONAL), "properties": bootstrap_properties}},
        },
    }
