"""A learner's cgroups: its memory limit, its CPU share, and the list of its processes.

One cgroup per learner attempt, created by the controller (as root) under the
controller's own cgroup, so the platform's own limits still bound it. cgroup v2 (one
unified hierarchy) is used where the host has it with the memory controller delegated;
otherwise cgroup v1's ``memory`` and ``cpu`` hierarchies. A learner over its memory limit
is killed by the kernel inside its own cgroup, never elsewhere on the host, and
``oom_killed`` tells the controller that this is what happened.

Standard library only: the controller must start fast.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
CPU_SHARES_PER_CPU = 1024
CPU_WEIGHT_PER_CPU = 100
REMOVE_WAIT_S = 5.0


def _own_path(controller: str) -> str | None:
    """This process's cgroup path in ``controller``'s hierarchy ("" for v2's)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _hierarchy, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path
    return None


def _v2_parent() -> Path | None:
    """A v2 directory where child cgroups get the memory controller, if there is one."""
    if not (CGROUP_ROOT / "cgroup.controllers").exists():
        return None
    own = _own_path("")
    if own is None:
        return None
    parent = CGROUP_ROOT / own.lstrip("/")
    try:
        enabled = (parent / "cgroup.subtree_control").read_text().split()
    except OSError:
        return None
    return parent if "memory" in enabled else None


def _v1_dir(controller: str) -> Path | None:
    mount = CGROUP_ROOT / controller
    own = _own_path(controller)
    if own is None or not (mount / "cgroup.procs").exists():
        return None
    parent = mount / own.lstrip("/")
    return parent if parent.is_dir() and os.access(parent, os.W_OK) else None


def _write(path: Path, value: str) -> None:
    path.write_text(value, encoding="ascii")


@dataclass
class LearnerCgroup:
    """The cgroup directories of one learner (one for v2, memory and cpu for v1)."""

    directories: list[Path]
    version: int
    memory_bytes: int | None = None

    @classmethod
    def create(cls, name: str, memory_bytes: int | None, cpus: float | None) -> LearnerCgroup:
        """Create (or reuse) the learner's cgroup; raise OSError when none can be made."""
        v2 = _v2_parent()
        if v2 is not None:
            directory = v2 / name
            directory.mkdir(exist_ok=True)
            if memory_bytes:
                _write(directory / "memory.max", str(memory_bytes))
                with contextlib.suppress(OSError):
                    _write(directory / "memory.swap.max", "0")
            if cpus:
                with contextlib.suppress(OSError):
                    _write(directory / "cpu.weight", str(max(1, int(cpus * CPU_WEIGHT_PER_CPU))))
            return cls([directory], 2, memory_bytes)
        memory = _v1_dir("memory")
        if memory is None:
            raise OSError("no writable memory cgroup (v1 or v2) for this process")
        directories = [memory / name]
        directories[0].mkdir(exist_ok=True)
        if memory_bytes:
            _write(directories[0] / "memory.limit_in_bytes", str(memory_bytes))
            # Where swap is accounted, the limit covers memory and swap together.
            memsw = directories[0] / "memory.memsw.limit_in_bytes"
            if memsw.exists():
                with contextlib.suppress(OSError):
                    _write(memsw, str(memory_bytes))
        cpu = _v1_dir("cpu")
        if cpu is not None and cpus:
            directory = cpu / name
            with contextlib.suppress(OSError):
                directory.mkdir(exist_ok=True)
                _write(directory / "cpu.shares", str(max(2, int(cpus * CPU_SHARES_PER_CPU))))
                directories.append(directory)
        return cls(directories, 1, memory_bytes)

    @classmethod
    def existing(cls, name: str) -> LearnerCgroup:
        """The learner's cgroup as far as it still exists (used to clean up after a controller)."""
        v2 = _v2_parent()
        if v2 is not None:
            return cls([v2 / name] if (v2 / name).is_dir() else [], 2)
        found = []
        for controller in ("memory", "cpu"):
            parent = _v1_dir(controller)
            if parent is not None and (parent / name).is_dir():
                found.append(parent / name)
        return cls(found, 1)

    @property
    def procs_files(self) -> list[str]:
        return [str(directory / "cgroup.procs") for directory in self.directories]

    def members(self) -> set[int]:
        pids: set[int] = set()
        for directory in self.directories:
            with contextlib.suppress(OSError):
                text = (directory / "cgroup.procs").read_text()
                pids.update(int(pid) for pid in text.split())
        return pids

    def oom_killed(self) -> bool:
        """True when the kernel killed a process of this cgroup for exceeding its memory."""
        if not self.directories:
            return False
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            text = (self.directories[0] / name).read_text()
        except OSError:
            return False
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value) > 0
        return False

    def kill_all(self) -> None:
        """SIGKILL every process of the cgroup until none is left (or a few seconds pass)."""
        deadline = time.monotonic() + REMOVE_WAIT_S
        while (members := self.members()) and time.monotonic() < deadline:
            for pid in members:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def remove(self) -> None:
        """Kill what is left and delete the cgroup directories."""
        self.kill_all()
        for directory in reversed(self.directories):
            with contextlib.suppress(OSError):
                directory.rmdir()
