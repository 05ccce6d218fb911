"""What holds a sandboxed learner to the manifest's memory and CPU: its own cgroup where the
host allows one (``ffdl.learner.cgroups``), else a watchdog over its processes
(``ffdl.learner.memory_watch``), with no CPU limit.

Every learner, with or without a GPU, gets the same: an address-space limit, the only
other bound available without a cgroup, counts what a process reserves rather than what it
uses, so it breaks CUDA's start (tens of GiB reserved) and the JVM's, JAX's and Go's
alike, and it bounds each process alone, not the learner's process tree.

The learner's log says which mechanism holds, in one line at its start.
"""

from __future__ import annotations

from collections.abc import Callable

from ffdl.learner.cgroups import LearnerCgroup
from ffdl.learner.memory_watch import MemoryWatch
from ffdl.learner.sandbox import SandboxSpec


def memory_text(size: int) -> str:
    mib = size / (1024 * 1024)
    return f"{mib / 1024:g} GiB" if mib >= 1024 else f"{mib:.0f} MiB"


class LearnerLimits:
    """One learner attempt's limits, from the sandbox's start to its end."""

    def __init__(self, sandbox: SandboxSpec, log: Callable[[str], None]) -> None:
        self._sandbox = sandbox
        self._log = log
        self.cgroup: LearnerCgroup | None = None
        self.watch: MemoryWatch | None = None

    @property
    def memory_bytes(self) -> int | None:
        return self._sandbox.memory_bytes

    def prepare(self) -> list[str]:
        """Make the learner's cgroup if one can be had; the ``cgroup.procs`` files the
        sandbox joins (none without a cgroup)."""
        sandbox = self._sandbox
        why = ""
        if not sandbox.privileged:
            why = "sandbox set up without root"
        elif not sandbox.cgroup:
            why = "learner_cgroups is off"
        else:
            try:
                self.cgroup = LearnerCgroup.create(
                    sandbox.cgroup, sandbox.memory_bytes, sandbox.cpus, sandbox.cgroup_parent
                )
            except OSError as exc:
                why = str(exc)
        if self.cgroup is not None:
            held = []
            if sandbox.memory_bytes:
                held.append(f"memory limit of {memory_text(sandbox.memory_bytes)}")
            if self.cgroup.cpu:
                held.append(f"CPU share of {sandbox.cpus:g}")
            what = " and ".join(held) or "processes"
            self._log(f"[ffdl] learner {what} held by {self.cgroup.describe()}")
            return self.cgroup.procs_files
        if sandbox.memory_bytes:
            self._log(
                f"[ffdl] no cgroup for this learner ({why}); its memory limit of "
                f"{memory_text(sandbox.memory_bytes)} is kept by a watchdog over its "
                "processes' resident memory; CPU is not limited"
            )
        return []

    def watch_process(self, pid: int, kill: Callable[[], None]) -> None:
        """Start the watchdog over ``pid``'s tree when no cgroup bounds its memory."""
        if self.cgroup is not None or not self._sandbox.memory_bytes:
            return

        def over_limit(held: int) -> None:
            limit = memory_text(self._sandbox.memory_bytes or 0)
            self._log(
                f"[ffdl] the learner's processes hold {memory_text(held)}, over its memory "
                f"limit of {limit}: killing them"
            )
            kill()

        self.watch = MemoryWatch(pid, self._sandbox.memory_bytes, over_limit)
        self.watch.start()

    def exceeded(self) -> bool:
        """True when the learner was killed for holding more than its memory limit."""
        if self.watch is not None and self.watch.exceeded is not None:
            return True
        return self.cgroup is not None and self.cgroup.oom_killed()

    def members(self) -> set[int]:
        return self.cgroup.members() if self.cgroup is not None else set()

    def stop_watching(self) -> None:
        if self.watch is not None:
            self.watch.stop()

    def release(self) -> None:
        """Stop the watchdog and remove the cgroup (killing what is left in it)."""
        self.stop_watching()
        if self.cgroup is not None:
            self.cgroup.remove()
