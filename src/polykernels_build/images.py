"""Builder images: a vendor image pinned by digest, or an offline base bootstrapped from Debian
packages and PyPI; then the builder recipe (docker/builder/Dockerfile, one for every backend)
on top. The profile only changes the base."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from polykernels_build import engine
from polykernels_build.errors import ConfigError, ImageError
from polykernels_build.settings import Settings
from polykernels_build.targets import Bootstrap, Matrix, Target
from polykernels_build.tools import run

# manylinux images carry every CPython; this is the one the vendor profile builds with.
VENDOR_PYTHON = "cp311"
# The vendor profile's bases are manylinux_2_28 builders, torch's own floor.
VENDOR_MANYLINUX = "2_28"


@dataclass(frozen=True, kw_only=True)
class BuilderImage:
    target: str
    profile: str
    tag: str
    image_id: str
    base: str
    python: str
    manylinux: str  # the floor auditwheel repair enforces: "2_28" -> manylinux_2_28_x86_64
    floor_reason: str = ""  # why, when the floor is above torch's 2_28
    # The exact versions of the bootstrap's Debian packages installed in the image (offline
    # profile; the vendor profile's image is pinned by digest instead): recorded in the manifest.
    debian_packages: tuple[tuple[str, str], ...] = ()

    @property
    def platform_tag(self) -> str:
        return f"manylinux_{self.manylinux}_x86_64"

    @property
    def build_identifier(self) -> str:
        return f"{self.python}-manylinux_x86_64"


def builder_tag(target: Target, profile: str) -> str:
    source = target.offline.recipe if profile == "offline" else "vendor"
    return f"polykernels-builder:{target.backend}-{source}"


def wheelhouse(settings: Settings, matrix: Matrix, log: Path) -> Path:
    """build/wheelhouse holds the torch wheel whose headers and libraries every build uses: a file
    whose sha256 targets.toml lists. Any other torch there (stale after targets.toml changed, or
    altered) is removed and the pinned one fetched with pip's --require-hashes."""
    from polykernels_build.dist import sha256_of

    house = settings.build_dir / "wheelhouse"
    house.mkdir(parents=True, exist_ok=True)
    accepted = set(matrix.build_torch_sha256)
    present = sorted(house.glob("torch-*.whl"))
    for wheel in present:
        if sha256_of(wheel) not in accepted:
            wheel.unlink()
    if not any(house.glob("torch-*.whl")):
        requirement = house / "torch-requirement.txt"
        requirement.write_text(f"{matrix.build_torch} " + " ".join(f"--hash=sha256:{h}" for h in sorted(accepted))
                               + "\n")
        run(["python3", "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--require-hashes", "-d",
             str(house), "-r", str(requirement)], log=log, env=settings.tool_env,
            hint=f"no {matrix.build_torch} file with a sha256 listed in targets.toml [build] torch_sha256 could be "
                 f"fetched; add the hash of the file your index serves, or put the file into {house} by hand")
        requirement.unlink()
    kept = list(house.glob("torch-*.whl"))
    if len(kept) != 1 or sha256_of(kept[0]) not in accepted:
        raise ImageError(f"{house} must hold exactly one torch wheel with a pinned sha256")
    return house


def _context(settings: Settings, house: Path) -> Path:
    """The build context: docker/, the wheelhouse (hard links, no copies of torch), and the CA
    bundle (empty when none), which only download stages copy."""
    context = settings.build_dir / "docker-context"
    if context.exists():
        shutil.rmtree(context)
    shutil.copytree(settings.root / "docker", context)
    bundle = context / "ca-bundle.crt"
    if settings.ca_bundle:
        shutil.copy2(settings.ca_bundle, bundle)
    else:
        bundle.write_text("")
    (context / "wheelhouse").mkdir()
    for wheel in house.glob("*.whl"):
        target = context / "wheelhouse" / wheel.name
        try:
            target.hardlink_to(wheel)
        except OSError:
            shutil.copy2(wheel, target)
    return context


def package_names(bootstrap: Bootstrap) -> tuple[str, ...]:
    """The Debian packages a bootstrap lists (suite and experimental), without apt version globs."""
    names = (p.split("=", 1)[0].strip() for p in (*bootstrap.packages, *bootstrap.experimental))
    return tuple(sorted(set(n for n in names if n)))


DPKG_FORMAT = "${Package}\t${Version}\t${db:Status-Abbrev}\n"


def parse_dpkg_versions(output: str, names: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """``dpkg-query -W -f DPKG_FORMAT``'s output as (package, version) pairs, one per name; a
    listed package that is not installed is an error (the recipe and the image disagree)."""
    found: dict[str, str] = {}
    for line in output.splitlines():
        fields = line.split("\t")
        if len(fields) == 3 and fields[2].strip() == "ii" and fields[1]:
            found.setdefault(fields[0].split(":", 1)[0], fields[1])
    missing = [n for n in names if n not in found]
    if missing:
        raise ImageError(f"the image has no installed Debian package {', '.join(missing)}",
                         hint="the bootstrap's package list and its recipe disagree; rebuild the image")
    return tuple((n, found[n]) for n in names)


def debian_package_versions(settings: Settings, image: str, names: tuple[str, ...], log: Path) -> tuple[
        tuple[str, str], ...]:
    """The installed version of each named package, read with dpkg-query inside ``image``."""
    output = run(["docker", "run", "--rm", "--pull=never", "--network=none", "--entrypoint", "dpkg-query", image,
                  "-W", "-f", DPKG_FORMAT, *names], log=log, env=settings.tool_env, check=False, stderr_to_log=True)
    return parse_dpkg_versions(output, names)


def debian_base(settings: Settings, suite: str, packages: tuple[str, ...], tag: str, log: Path) -> str:
    """A Debian root filesystem from the distribution archive, imported as an image."""
    existing = engine.image_id(tag, settings.tool_env)
    if existing:
        return existing
    if shutil.which("mmdebstrap") is None:
        raise ImageError("the offline profile needs mmdebstrap to make its Debian base",
                         hint="apt-get install -y mmdebstrap (or use --profile vendor where registries are reachable)")
    argv = ["mmdebstrap", "--variant=minbase", "--aptopt=Acquire::Check-Valid-Until \"false\"",
            f"--include={','.join(packages)}", suite, "-"]
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as handle:
        handle.write(f"\n$ {' '.join(argv)} | docker import - {tag}\n".encode())
        handle.flush()
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=handle, env=dict(settings.tool_env)) as debootstrap:
            imported = subprocess.run(["docker", "import", "-", tag], stdin=debootstrap.stdout, stdout=handle,
                                      stderr=handle, check=False, env=dict(settings.tool_env))
    if debootstrap.returncode or imported.returncode:
        raise ImageError(f"bootstrapping the Debian {suite} base failed", log=log,
                         hint="check that the Debian archive is reachable (apt-get update works)")
    return engine.require_image(tag, "docker import left no image", settings.tool_env)


def debian_base_for(settings: Settings, bootstrap: Bootstrap, log: Path) -> str:
    """The recipe's Debian base; recipes with the same suite and packages share one."""
    digest = hashlib.sha256(" ".join(sorted(bootstrap.packages)).encode()).hexdigest()[:10]
    return debian_base(settings, bootstrap.suite, bootstrap.packages, f"polykernels-base:{bootstrap.suite}-{digest}",
                       log)


def build_context(settings: Settings, matrix: Matrix, log: Path) -> Path:
    """A fresh build context with the wheelhouse in it."""
    return _context(settings, wheelhouse(settings, matrix, log))


def builder_image(settings: Settings, matrix: Matrix, target: Target, profile: str, log: Path, *,
                  allow_unpinned: bool = False) -> BuilderImage:
    if profile not in ("vendor", "offline"):
        raise ConfigError(f"unknown profile {profile!r}", hint="use --profile vendor or --profile offline")
    engine.require_engine(settings.tool_env)
    house = wheelhouse(settings, matrix, log)
    context = _context(settings, house)
    if profile == "vendor":
        if not target.vendor.digest and not allow_unpinned:
            raise ConfigError(
                f"{target.name}: the vendor image {target.vendor.image} is not pinned by digest in {matrix.path}",
                hint="pull it on a trusted host, put `docker image inspect --format '{{index .RepoDigests 0}}'`'s "
                     "sha256 into the target's vendor.digest, or pass --allow-unpinned for a local experiment",
            )
        base, python, manylinux, floor_reason = target.vendor.reference, VENDOR_PYTHON, VENDOR_MANYLINUX, ""
        names: tuple[str, ...] = ()
    else:
        bootstrap = matrix.bootstrap_for(target)
        debian = debian_base_for(settings, bootstrap, log)
        base = f"polykernels-toolchain:{bootstrap.name}"
        engine.build(context / "bootstrap" / f"{bootstrap.name}.Dockerfile", context, base,
                     build_args={"BASE_IMAGE": debian, "PYTHON_TAG": bootstrap.python,
                                 "CUDA_VERSION": target.toolkit, "TOOLKIT": target.toolkit,
                                 "EXPERIMENTAL_PACKAGES": " ".join(bootstrap.experimental)},
                     log=log, tool_env=settings.tool_env)
        python, manylinux, floor_reason = bootstrap.python, bootstrap.manylinux, bootstrap.floor_reason
        names = package_names(bootstrap)
    tag = builder_tag(target, profile)
    image_id = engine.build(context / "builder" / "Dockerfile", context, tag,
                            build_args={"BASE_IMAGE": base, "PYTHON_TAG": python, "BACKEND": target.backend}, log=log,
                            tool_env=settings.tool_env)
    packages = debian_package_versions(settings, image_id, names, log) if names else ()
    return BuilderImage(target=target.name, profile=profile, tag=tag, image_id=image_id, base=base, python=python,
                        manylinux=manylinux, floor_reason=floor_reason, debian_packages=packages)
