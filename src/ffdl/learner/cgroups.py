"""A learner's cgroups: its memory limit, its CPU share, and the list of its processes.

One cgroup per learner attempt, created by the controller (as root) where
``ffdl.learner.cgroup_placement`` says learners' cgroups go on this host: cgroup v2 under
the configured ``cgroup_parent`` or an ``ffdl/`` subtree of a cgroup that delegates the
memory controller, else cgroup v1's ``memory`` and ``cpu`` hierarchies. A learner over its
memory limit is killed by the kernel inside its own cgroup, never elsewhere on the host,
and ``oom_killed`` tells the controller that this is what happened.

Standard library only: the controller must start fast.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from ffdl.learner.cgroup_placement import V2, CgroupParentError, discover

CPU_SHARES_PER_CPU = 1024
CPU_WEIGHT_PER_CPU = 100
REMOVE_WAIT_S = 5.0


def _write(path: Path, value: str) -> None:
    path.write_text(value, encoding="ascii")


@dataclass
class LearnerCgroup:
    """The cgroup directories of one learner (one for v2, memory and cpu for v1)."""

    directories: list[Path]
    version: int
    # Whether a CPU share was set (the placement may lack the cpu controller).
    cpu: bool = False

    @classmethod
    def create(
        cls,
        name: str,
        memory_bytes: int | None,
        cpus: float | None,
        cgroup_parent: str | None = None,
    ) -> LearnerCgroup:
        """Create (or reuse) the learner's cgroup; OSError, saying why, when none can be made."""
        try:
            placement = discover(cgroup_parent)
        except CgroupParentError as exc:
            raise OSError(str(exc)) from exc
        if not placement.directories:
            raise OSError(placement.reason)
        directories = placement.learner_directories(name)
        directories[0].mkdir(exist_ok=True)
        if placement.version == V2:
            directory = directories[0]
            if memory_bytes:
                _write(directory / "memory.max", str(memory_bytes))
                with contextlib.suppress(OSError):
                    _write(directory / "memory.swap.max", "0")
            cpu = False
            if cpus and placement.cpu:
                with contextlib.suppress(OSError):
                    _write(directory / "cpu.weight", str(max(1, int(cpus * CPU_WEIGHT_PER_CPU))))
                    cpu = True
            return cls(directories, V2, cpu)
        if memory_bytes:
            _write(directories[0] / "memory.limit_in_bytes", str(memory_bytes))
            # Where swap is accounted, the limit covers memory and swap together.
            memsw = directories[0] / "memory.memsw.limit_in_bytes"
            if memsw.exists():
                with contextlib.suppress(OSError):
                    _write(memsw, str(memory_bytes))
        kept = directories[:1]
        if len(directories) > 1 and cpus:
            with contextlib.suppress(OSError):
                directories[1].mkdir(exist_ok=True)
                _write(directories[1] / "cpu.shares", str(max(2, int(cpus * CPU_SHARES_PER_CPU))))
                kept.append(directories[1])
        return cls(kept, placement.version, len(kept) == 2)

    @classmethod
    def existing(cls, name: str, cgroup_parent: str | None = None) -> LearnerCgroup:
        """The learner's cgroup as far as it still exists (used to clean up after a
        controller); nothing is created looking for it. A learner without a cgroup has an
        empty name, which finds nothing (never the placement's parent itself)."""
        try:
            placement = discover(cgroup_parent, create=False)
            candidates = placement.learner_directories(name)
        except (CgroupParentError, ValueError):
            return cls([], 0)
        return cls([d for d in candidates if d.is_dir()], placement.version)

    def describe(self) -> str:
        """Where the learner's cgroup is and what it holds, for the learner's log."""
        mechanism = f"cgroup v{self.version}"
        return f"{mechanism} {self.directories[0]}" if self.directories else mechanism

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
        """Kill what is left and delete the cgroup directories.

        A killed process stays in its cgroup until its parent reaps it, and until then the
        kernel refuses the removal (EBUSY): it is tried again for a few seconds."""
        self.kill_all()
        deadline = time.monotonic() + REMOVE_WAIT_S
        for directory in reversed(self.directories):
            while True:
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() >= deadline:
                        break
                    time.sleep(0.05)
