"""A job's framework runtime on the learner's side: building a Python environment once.

The platform resolves a manifest's framework to a runtime (``ffdl.server.services.runtimes``)
and puts it in the learner spec (``RuntimeSpec``). The platform's own environment needs
nothing here. A built environment is made by ``ensure`` during DOWNLOADING, with ``uv``:
``uv venv`` with the platform's interpreter, pip seeded into it offline from the
interpreter's own ``ensurepip`` (a job's ``pip install`` of what the environment has then
finds it there), then ``uv pip install`` of the requirements, each output line shown in the
job's log. It lives in ``spec.path`` (under the platform home, named by the digest of its
definition), is made by one controller at a time (a lock file beside it; others wait and
then reuse it), is marked complete only once fully built, and is never changed afterwards
except for the small copy of ``ffdl.sdk`` it carries, so that code on it can still import
the SDK without seeing the platform's packages. This module also says where a runtime's
executables are, for the programs its ``paths`` place in the sandbox, and whether they exist.

This module uses the standard library only, because the controller must start fast.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ffdl

PLATFORM = "platform"
PYTHON = "python"
READY_FILE = "ready.json"
SDK_PTH = "_ffdl_sdk.pth"
LOCK_POLL_S = 0.2
HEARTBEAT_S = 15.0
TAIL_LINES = 8
# Installer lines that mean nothing to a job's user (activating is not how jobs use it).
QUIET_PREFIXES = ("Activate with:",)
REASON_TAIL_CHARS = 600


class RuntimeBuildError(Exception):
    """The environment could not be built; the message says which step and why."""


class RuntimeBuildStopped(Exception):
    """The caller asked to stop while the environment was being built."""


@dataclass
class RuntimeSpec:
    """The runtime a learner's command runs on (part of the learner spec)."""

    name: str
    environment: str = PLATFORM  # platform | python
    # A built environment: its cache directory, the interpreter to build it with, and
    # what to install with which installer options.
    path: str = ""
    python: str = ""
    digest: str = ""
    requirements: list[str] = field(default_factory=list)
    find_links: list[str] = field(default_factory=list)
    index_url: str | None = None
    extra_index_urls: list[str] = field(default_factory=list)
    no_index: bool = False
    # Path inside the sandbox -> executable of the runtime bound there ("python": its
    # interpreter; another name: that file in its bin directory). For the platform's
    # environment, ``python`` is the platform's interpreter.
    paths: dict[str, str] = field(default_factory=dict)

    @property
    def built(self) -> bool:
        return self.environment == PYTHON

    @property
    def env_dir(self) -> Path:
        return Path(self.path) / "env"

    @property
    def bin_dir(self) -> Path:
        return self.env_dir / "bin" if self.built else Path(self.python).parent

    def executable(self, name: str) -> Path:
        """The runtime's executable called ``name`` in its ``paths``."""
        if name == PYTHON and not self.built:
            return Path(self.python)
        return self.bin_dir / name


def missing_program(spec: RuntimeSpec) -> str | None:
    """Why one of the runtime's ``paths`` cannot be provided (an executable it lacks)."""
    for inside, name in spec.paths.items():
        executable = spec.executable(name)
        if not (executable.is_file() and os.access(executable, os.X_OK)):
            where = "its environment" if spec.built else "the platform's environment"
            return (
                f"runtime {spec.name}: paths entry {inside}: {where} has no executable "
                f"{name!r} (no {executable})"
            )
    return None


def _strings(raw: dict[str, Any], name: str) -> list[str]:
    value = raw.get(name) or []
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"runtime.{name} must be a list of strings")
    return list(value)


def _paths(raw: dict[str, Any]) -> dict[str, str]:
    value = raw.get("paths") or {}
    if not isinstance(value, dict) or not all(
        isinstance(inside, str) and os.path.isabs(inside) and isinstance(name, str) and name
        for inside, name in value.items()
    ):
        raise ValueError("runtime.paths must map absolute paths to executable names")
    return dict(value)


def runtime_from_dict(raw: Any) -> RuntimeSpec | None:
    """Validate the spec's ``runtime`` object (None: the platform's environment)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError("runtime must be an object or null")
    name, environment = raw.get("name"), raw.get("environment", PLATFORM)
    if not isinstance(name, str) or environment not in (PLATFORM, PYTHON):
        raise ValueError("runtime needs a name and an environment of platform or python")
    spec = RuntimeSpec(name=name, environment=environment, paths=_paths(raw))
    if not spec.built:
        python = raw.get("python") or ""
        if not isinstance(python, str) or (spec.paths and not os.path.isabs(python)):
            raise ValueError("runtime.python must be an absolute path when it has paths")
        spec.python = python
        return spec
    for key in ("path", "python", "digest"):
        value = raw.get(key)
        if not isinstance(value, str) or not value:
            raise ValueError(f"runtime.{key} must be a non-empty string")
        setattr(spec, key, value)
    if not (os.path.isabs(spec.path) and os.path.isabs(spec.python)):
        raise ValueError("runtime.path and runtime.python must be absolute paths")
    spec.requirements = _strings(raw, "requirements")
    spec.find_links = _strings(raw, "find_links")
    spec.extra_index_urls = _strings(raw, "extra_index_urls")
    index_url = raw.get("index_url")
    if index_url is not None and not isinstance(index_url, str):
        raise ValueError("runtime.index_url must be a string or null")
    spec.index_url = index_url
    spec.no_index = bool(raw.get("no_index", False))
    return spec


def find_uv() -> str:
    try:
        from uv import find_uv_bin
    except ImportError as exc:
        raise RuntimeBuildError("the uv installer is not installed on this platform") from exc
    return str(find_uv_bin())


def _ready(spec: RuntimeSpec) -> bool:
    try:
        marker = json.loads((Path(spec.path) / READY_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("digest") == spec.digest


@contextlib.contextmanager
def _locked(
    path: Path, spec: RuntimeSpec, progress: Callable[[str], None], should_stop: Callable[[], bool]
) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not told:
                    progress(f"[ffdl] runtime {spec.name}: waiting for another job building it")
                    told = True
                if should_stop():
                    raise RuntimeBuildStopped() from None
                time.sleep(LOCK_POLL_S)
        yield
    finally:
        os.close(fd)  # releases the lock


def _culprits(spec: RuntimeSpec, output: str) -> list[str]:
    """The requirements the installer's output names (what most likely failed)."""
    text = output.lower().replace("_", "-")
    found = []
    for requirement in spec.requirements:
        match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
        if match and match.group(0).lower().replace("_", "-") in text:
            found.append(requirement)
    return found


def _run_step(
    argv: list[str],
    step: str,
    spec: RuntimeSpec,
    progress: Callable[[str], None],
    should_stop: Callable[[], bool],
) -> None:
    prefix = f"[ffdl] runtime {spec.name}:"
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    output: list[str] = []
    try:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    except OSError as exc:
        raise RuntimeBuildError(f"runtime {spec.name}: {step} could not start: {exc}") from exc

    def read() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode("utf-8", errors="replace").rstrip()
            if line.strip() and not line.startswith(QUIET_PREFIXES):
                tail.append(line.strip())
                output.append(line)
                progress(f"{prefix} {line.strip()}")

    reader = threading.Thread(target=read, name="runtime-build-output", daemon=True)
    reader.start()
    started = last_beat = time.monotonic()
    while proc.poll() is None:
        if should_stop():
            proc.kill()
            proc.wait()
            raise RuntimeBuildStopped()
        now = time.monotonic()
        if now - last_beat >= HEARTBEAT_S:
            progress(f"{prefix} still {step} ({now - started:.0f} s)")
            last_beat = now
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=LOCK_POLL_S)
    reader.join(5.0)
    if proc.returncode != 0:
        culprits = _culprits(spec, "\n".join(output))
        named = f"; it names {', '.join(culprits)}" if culprits else ""
        last = " | ".join(tail) or "(no output)"
        if len(last) > REASON_TAIL_CHARS:
            last = "..." + last[-(REASON_TAIL_CHARS - 3) :]
        raise RuntimeBuildError(
            f"runtime {spec.name}: {step} failed (exit {proc.returncode}){named}; "
            f"last lines: {last}"
        )


def _installer_options(spec: RuntimeSpec) -> list[str]:
    options: list[str] = []
    if spec.no_index:
        options.append("--no-index")
    if spec.index_url:
        options += ["--index-url", spec.index_url]
    for url in spec.extra_index_urls:
        options += ["--extra-index-url", url]
    for link in spec.find_links:
        options += ["--find-links", link]
    return options


def _site_packages(env_dir: Path) -> Path:
    found = sorted(env_dir.glob("lib/python*/site-packages"))
    if not found:
        raise RuntimeBuildError(f"no site-packages directory in {env_dir}")
    return found[0]


def _sdk_files() -> list[tuple[str, Path]]:
    package = Path(ffdl.__file__).resolve().parent
    files = [("__init__.py", package / "__init__.py")]
    files += [(f"sdk/{p.name}", p) for p in sorted((package / "sdk").glob("*.py"))]
    return files


def install_sdk(spec: RuntimeSpec) -> Path:
    """Give the environment this platform's ``ffdl.sdk`` (a copy of that package alone,
    named by its content, found through a ``.pth`` file) and return the copy's directory.

    Idempotent and safe beside running jobs: a new copy is made beside older ones and the
    ``.pth`` file is replaced atomically.
    """
    files = _sdk_files()
    digest = hashlib.sha256()
    for relative, path in files:
        digest.update(relative.encode() + b"\0" + path.read_bytes() + b"\0")
    target = Path(spec.path) / f"sdk-{digest.hexdigest()[:16]}"
    if not target.exists():
        staging = Path(spec.path) / f".{target.name}.{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        for relative, path in files:
            destination = staging / "ffdl" / relative
            destination.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
            shutil.copyfile(path, destination)
            destination.chmod(0o644)
        staging.chmod(0o755)
        try:
            os.rename(staging, target)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)  # another controller made it first
    pth = _site_packages(spec.env_dir) / SDK_PTH
    if not pth.exists() or pth.read_text(encoding="utf-8").strip() != str(target):
        temporary = pth.with_name(f".{SDK_PTH}.{os.getpid()}")
        temporary.write_text(f"{target}\n", encoding="utf-8")
        temporary.chmod(0o644)
        os.replace(temporary, pth)
    return target


def _readable_by_all(root: Path) -> None:
    # The job's own uid runs the environment: everything must be readable, nothing writable.
    for directory, dirnames, filenames in os.walk(root):
        os.chmod(directory, 0o755)
        for name in filenames:
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                mode = os.stat(path).st_mode
                os.chmod(path, 0o755 if mode & 0o111 else 0o644)
        del dirnames


def _build(
    spec: RuntimeSpec,
    uv: str,
    progress: Callable[[str], None],
    should_stop: Callable[[], bool],
) -> None:
    root = Path(spec.path)
    shutil.rmtree(root, ignore_errors=True)  # what a failed or stopped build left
    root.mkdir(mode=0o755)
    started = time.monotonic()
    listed = ", ".join(spec.requirements) or "no packages"
    progress(f"[ffdl] runtime {spec.name}: building a Python environment ({listed})")
    cache = ["--cache-dir", str(root.parent / ".uv-cache"), "--no-python-downloads"]
    _run_step(
        [uv, "venv", "--no-project", *cache, "--python", spec.python, str(spec.env_dir)],
        "creating the environment",
        spec,
        progress,
        should_stop,
    )
    python = str(spec.bin_dir / "python")
    # ensurepip installs the wheel the interpreter ships, so this needs no index; uv's own
    # seeding (``uv venv --seed``) would download pip.
    _run_step(
        [python, "-Im", "ensurepip", "--default-pip"], "seeding pip", spec, progress, should_stop
    )
    if spec.requirements:
        options = _installer_options(spec)
        _run_step(
            [uv, "pip", "install", *cache, "--python", python, *options, *spec.requirements],
            "installing the requirements",
            spec,
            progress,
            should_stop,
        )
    install_sdk(spec)
    _readable_by_all(root)
    marker = {"digest": spec.digest, "name": spec.name, "requirements": spec.requirements}
    temporary = root / f".{READY_FILE}.tmp"
    temporary.write_text(json.dumps(marker, indent=1) + "\n", encoding="utf-8")
    temporary.chmod(0o644)
    os.replace(temporary, root / READY_FILE)
    elapsed = time.monotonic() - started
    progress(f"[ffdl] runtime {spec.name}: environment ready in {elapsed:.1f} s")


def ensure(
    spec: RuntimeSpec,
    progress: Callable[[str], None],
    should_stop: Callable[[], bool] = lambda: False,
) -> None:
    """Make sure the runtime's environment exists; build it on first use.

    Raises RuntimeBuildError (with the failing step, the requirements the installer names,
    and its last lines) or RuntimeBuildStopped; a failed build leaves nothing to reuse.
    """
    if not spec.built:
        return
    root = Path(spec.path)
    if not _ready(spec):
        root.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        lock = root.parent / f"{root.name}.lock"
        with _locked(lock, spec, progress, should_stop):
            if not _ready(spec):
                try:
                    _build(spec, find_uv(), progress, should_stop)
                except BaseException:
                    shutil.rmtree(root, ignore_errors=True)
                    raise
                return
    install_sdk(spec)
    progress(f"[ffdl] runtime {spec.name}: using the cached environment {root}")
