"""What each learner's sandbox is made of: its uid, its paths, its network, its devices.

Every job runs under a uid of its own from the operator's range, so that on the host a
job's processes and files belong to no one else. A uid is allocated once per job, by
creating ``HOME/sandbox-uids/<uid>`` exclusively; a uid whose job has ended (or is gone)
is taken over by the next job that hashes to it.
"""

from __future__ import annotations

import hashlib
import os
import site
import sys
import threading
from pathlib import Path

import ffdl
from ffdl.core.jobdirs import JobDirs
from ffdl.core.status import JobStatus, is_terminal
from ffdl.learner.sandbox import NETNS_PREFIX, NETWORK_HOST, NETWORK_NONE, SandboxSpec
from ffdl.server.platform import Platform
from ffdl.server.services.learner_env import hidden_platform_packages, place_learner
from ffdl.server.store.models import Job

MEBIBYTE = 1024 * 1024
_CLAIMING = threading.Lock()


def _uid_dir(platform: Platform) -> Path:
    return platform.settings.home / "sandbox-uids"


def _job_alive(platform: Platform, job_id: str) -> bool:
    with platform.store.read() as session:
        job = session.get(Job, job_id)
        return job is not None and not is_terminal(JobStatus(job.status))


def job_uid(platform: Platform, job_id: str) -> int:
    """The job's sandbox uid (also its gid), allocated on first use."""
    if os.geteuid() != 0:
        # Without root there is no other uid to drop to: the user namespace keeps ours.
        return os.getuid()
    # Deploys run in parallel threads; claims are exclusive files between processes, and
    # this lock keeps two threads from taking over the same stale claim.
    with _CLAIMING:
        return _claim_uid(platform, job_id)


def _claim_uid(platform: Platform, job_id: str) -> int:
    settings = platform.settings
    marker = JobDirs.of(settings.jobs_dir, job_id).root / "sandbox-uid"
    if marker.exists():
        return int(marker.read_text().strip())
    marker.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    directory = _uid_dir(platform)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    start = int.from_bytes(hashlib.sha256(job_id.encode()).digest()[:8], "big")
    for probe in range(settings.sandbox_uid_count):
        uid = settings.sandbox_uid_base + (start + probe) % settings.sandbox_uid_count
        claim = directory / str(uid)
        try:
            fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            holder = claim.read_text().strip()
            if holder == job_id or not _job_alive(platform, holder):
                claim.write_text(job_id)
                break
            continue
        with os.fdopen(fd, "w") as handle:
            handle.write(job_id)
        break
    else:
        raise OSError(f"all {settings.sandbox_uid_count} sandbox uids are taken by live jobs")
    marker.write_text(str(uid))
    return uid


def sandbox_owner(platform: Platform, job_id: str) -> tuple[int, int] | None:
    """(uid, gid) that owns the job's writable directories, or None without sandboxes."""
    if not platform.settings.sandbox:
        return None
    if os.geteuid() != 0:
        return os.getuid(), os.getgid()
    uid = job_uid(platform, job_id)
    return uid, uid


def _pth_paths(site_dirs: list[str]) -> set[str]:
    """Directories that ``.pth`` files add to the path (editable installs put sources there)."""
    found: set[str] = set()
    for site_dir in site_dirs:
        for pth in Path(site_dir).glob("*.pth"):
            try:
                lines = pth.read_text(encoding="utf-8").splitlines()
            except (OSError, UnicodeDecodeError):
                continue
            found.update(line.strip() for line in lines if line.startswith("/"))
    return found


def python_paths(home: Path) -> list[str]:
    """Where the job's Python lives (interpreter, environment, importable sources), read-only.

    Nothing that holds the platform home (or lies inside it) is ever among them.
    """
    home_text = str(home.resolve())
    candidates = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    candidates.update(site.getsitepackages())
    # Where ffdl itself is imported from (its SDK is what jobs import), which for an
    # editable install is a source tree outside the environment. Not all of sys.path:
    # its first entry may be whatever directory the platform was started from.
    candidates.add(str(Path(ffdl.__file__).resolve().parent.parent))
    candidates.update(_pth_paths(site.getsitepackages()))
    paths: set[str] = set()
    for candidate in candidates:
        if not os.path.isabs(candidate) or not os.path.isdir(candidate):
            continue
        path = os.path.realpath(candidate)
        if path.startswith("/usr/") or path == "/usr":
            continue  # the system is visible anyway
        overlaps = (
            path == home_text
            or home_text.startswith(path.rstrip("/") + "/")
            or path.startswith(home_text + "/")
        )
        if not overlaps:
            paths.add(path)
    # Drop paths inside another one: a single bind covers them.
    ordered = sorted(paths)
    return [p for p in ordered if not any(p.startswith(q.rstrip("/") + "/") for q in ordered)]


def gpu_devices(gpu_ids: tuple[int, ...]) -> list[str]:
    return [f"/dev/nvidia{gpu}" for gpu in gpu_ids if os.path.exists(f"/dev/nvidia{gpu}")]


def learner_sandbox(
    platform: Platform,
    job_id: str,
    *,
    learner: int,
    attempt: int,
    num_learners: int,
    gpu_ids: tuple[int, ...],
    memory_mb: int,
    cpus: float,
    dirs: JobDirs,
    volume: str | None,
    runtime_paths: list[str] | None = None,
    programs: list[list[str]] | None = None,
) -> SandboxSpec | None:
    """The sandbox of one learner, or None when the operator turned sandboxes off.

    ``runtime_paths``: what a built runtime environment needs instead of the platform's
    Python (whose packages it must not see); None runs on the platform's Python.
    ``programs``: [host executable, path inside] the runtime provides at paths of its own.
    """
    settings = platform.settings
    if not settings.sandbox:
        return None
    privileged = os.geteuid() == 0
    uid = job_uid(platform, job_id)
    if num_learners == 1:
        network = NETWORK_NONE
    elif privileged:
        network = f"{NETNS_PREFIX}ffdl-{job_id}-{attempt}"
    else:
        network = NETWORK_HOST
    read_only = (
        python_paths(platform.settings.home) if runtime_paths is None else list(runtime_paths)
    )
    volumes: list[list[str]] = []
    if volume is not None:
        volumes.append([volume, str(dirs.data)])
    else:
        read_only.append(str(dirs.data))
    sandbox = SandboxSpec(
        uid=uid,
        gid=uid if privileged else os.getgid(),
        read_only=read_only,
        read_write=[str(p) for p in dirs.writable(learner)],
        volumes=volumes,
        network=network,
        gpu_devices=gpu_devices(gpu_ids),
        memory_bytes=memory_mb * MEBIBYTE if memory_mb > 0 else None,
        cpus=cpus if cpus > 0 else None,
        cgroup=f"ffdl-{job_id}-l{learner}-a{attempt}" if settings.learner_cgroups else "",
        cgroup_parent=settings.cgroup_parent or "",
        privileged=privileged,
        programs=list(programs or []),
    )
    place_learner(sandbox, job_id, learner, num_learners, dirs)
    if runtime_paths is not None:
        sandbox.hidden = hidden_platform_packages(read_only)
    return sandbox
