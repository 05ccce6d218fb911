"""Builds ``.gpu-kit/``: what a GPU host without a package index needs to run ffdl's GPU
checks (``make gpu-kit``, then ``bash .gpu-kit/run.sh`` there, from the project's root).

The host is expected to run a CUDA build of PyTorch on its own Python (3.12 by default) with
the scientific stack around it (``host-packages.txt`` lists what the kit takes from the
host). The kit holds:

- wheels, for the host's Python, of every package ffdl needs to run its GPU tests and
  benchmarks that the host does not provide, at the versions installed in ``.venv`` (so
  the host runs what CI runs). The list is worked out from the installed packages'
  metadata each time, so it follows ``pyproject.toml`` as dependencies change;
- ``bwrap`` from Debian's bubblewrap package and the libraries it links (learners run
  sandboxed, and such hosts seldom have it);
- PostgreSQL's server (the ``pgserver`` wheel, a relocatable build of PostgreSQL), for the
  fleet benchmark, which ``run.sh fleet`` runs with the control plane pinned to two of the
  host's cores and the simulated learners on the others;
- ``run.sh``, which installs all that and runs the checks, logging into ``$OUT``.

Run with the project's environment: ``.venv/bin/python tools/gpu-kit/prepare.py``.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.requirements import Requirement

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
KIT = ROOT / ".gpu-kit"
# ffdl's extras the GPU checks use; the test runner and the live-server helper's packages
# (from the dev extra).
EXTRAS = ("examples", "postgres")
TEST_RUNNER = ("pytest", "pytest-timeout", "websocket-client")
# A self-contained PostgreSQL server build, for the fleet step (about 11 MiB).
POSTGRES_SERVER = "pgserver==0.1.4"
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_26_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def listed(name: str) -> set[str]:
    """The package names in one of this directory's lists (``#`` starts a comment)."""
    names = (line.split("#")[0].strip() for line in (HERE / name).read_text().splitlines())
    return {normalise(name) for name in names if name}


def _applies(requirement: Requirement, python: str, extras: set[str]) -> bool:
    if requirement.marker is None:
        return True
    environment = {"python_version": python, "sys_platform": "linux", "platform_system": "Linux"}
    if not extras:
        return requirement.marker.evaluate({**environment, "extra": ""})
    return any(requirement.marker.evaluate({**environment, "extra": e}) for e in extras)


def needed(python: str, provided: set[str]) -> dict[str, str]:
    """name -> installed version of everything the checks need beyond the host's packages."""
    found: dict[str, str] = {}
    roots = [
        Requirement(text)
        for text in metadata.requires("ffdl") or []
        if _applies(Requirement(text), python, set(EXTRAS))
    ]
    roots += [Requirement(name) for name in TEST_RUNNER]
    pending: list[tuple[Requirement, set[str]]] = [(r, set(r.extras)) for r in roots]
    while pending:
        requirement, extras = pending.pop()
        name = normalise(requirement.name)
        if name in provided or name in found:
            continue
        try:
            distribution = metadata.distribution(requirement.name)
        except metadata.PackageNotFoundError:
            raise SystemExit(f"{requirement.name} is not installed in this environment") from None
        found[name] = distribution.version
        for text in distribution.requires or []:
            child = Requirement(text)
            if _applies(child, python, extras):
                pending.append((child, set(child.extras)))
    return found


def download(requirements: list[str], python: str, target: Path) -> None:
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
        "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
        *platforms, "--dest", str(target), *requirements,
    ]  # fmt: skip
    subprocess.run(command, check=True)


def bubblewrap(target: Path) -> None:
    """Debian's bwrap and the libraries it links (but the C library), into ``target``."""
    with tempfile.TemporaryDirectory() as scratch:
        fetch = ["apt-get", "download", "-q", "bubblewrap"]
        if subprocess.run(fetch, cwd=scratch, capture_output=True, check=False).returncode:
            subprocess.run(["apt-get", "update", "-qq"], check=True)
            subprocess.run(fetch, cwd=scratch, check=True)
        package = next(Path(scratch).glob("bubblewrap_*.deb"))
        unpacked = Path(scratch) / "unpacked"
        subprocess.run(["dpkg", "-x", str(package), str(unpacked)], check=True)
        shutil.copy2(unpacked / "usr/bin/bwrap", target / "bwrap")
    linked = subprocess.run(["ldd", str(target / "bwrap")], capture_output=True, text=True)
    for line in linked.stdout.splitlines():
        parts = line.split("=>")
        if len(parts) == 2 and parts[1].strip().startswith("/"):
            library = Path(parts[1].split()[0])
            if not library.name.startswith("libc.so"):
                shutil.copy2(library, target / library.name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="3.12", help="the GPU host's Python (3.12)")
    args = parser.parse_args()
    pins = needed(args.python, listed("host-packages.txt") | listed("left-out.txt"))
    if KIT.exists():
        shutil.rmtree(KIT)
    (KIT / "whl").mkdir(parents=True)
    (KIT / "bin").mkdir()
    print(f"wheels for Python {args.python}: {len(pins)} packages", flush=True)
    download(
        [f"{name}=={version}" for name, version in sorted(pins.items())], args.python, KIT / "whl"
    )
    download([POSTGRES_SERVER], args.python, KIT / "postgres")
    bubblewrap(KIT / "bin")
    shutil.copy2(HERE / "run.sh", KIT / "run.sh")
    shutil.copy2(HERE / "host-packages.txt", KIT / "host-packages.txt")
    size = sum(path.stat().st_size for path in KIT.rglob("*") if path.is_file())
    print(f"{KIT.relative_to(ROOT)}: {size / 2**20:.1f} MiB")
    print("on the GPU host, from the project's root: bash .gpu-kit/run.sh")


if __name__ == "__main__":
    main()
