"""Where on this host learners' cgroups go, and which limits they can hold.

cgroup v2 allows a memory limit on a cgroup only when its parent enables the ``memory``
controller in ``cgroup.subtree_control``, and the kernel lets no cgroup that holds
processes enable controllers for its children (the root excepted). A platform running as a
service or in a container sits in such a cgroup: its own ``subtree_control`` lacks
``memory`` and it cannot add it. So learners' cgroups go, in this order:

1. under the operator's ``cgroup_parent`` (as Docker's ``--cgroup-parent``), which must
   exist, be writable, have ``memory`` available and, if ``memory`` is not yet enabled for
   its children, hold no processes (ffdl then enables it): else ``CgroupParentError``,
   having changed nothing;
2. in an ``ffdl/`` subtree of the nearest cgroup, from this process's own up to the mount
   root, that is writable and either enables ``memory`` for its children already or is
   delegated to this service (systemd's ``Delegate=yes`` marks it with a ``delegate``
   extended attribute) and holds no processes, in which case ffdl enables ``memory`` there
   itself. ``ffdl/`` holds no processes, so it can always enable controllers for the
   learners' cgroups below it;
3. on cgroup v1, under this process's own cgroups of the ``memory`` (and ``cpu``)
   hierarchies, as before v2 existed.

Where none of these can be had the placement says why, and the controller keeps the
learner within its memory by watching it instead (``ffdl.learner.memory_watch``).

``CgroupFs`` is the filesystem as discovery sees it; tests give it a fabricated tree.
Standard library only: the controller calls this at every learner's start.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")
# The subtree ffdl makes for its learners under the cgroup it found (case 2 above).
SUBTREE = "ffdl"
# systemd sets these on the cgroups it delegates (trusted.* as the system manager).
DELEGATE_XATTRS = ("trusted.delegate", "user.delegate")

NONE, V1, V2 = 0, 1, 2


class CgroupParentError(ValueError):
    """The configured ``cgroup_parent`` cannot hold learners; the message names the path and
    what is missing."""


class CgroupFs:
    """The cgroup filesystem: its mount point and this process's place in it."""

    def __init__(self, root: Path = CGROUP_ROOT, membership: Path = PROC_SELF_CGROUP) -> None:
        self.root = root
        self.membership = membership

    def unified(self) -> bool:
        """True when the mount point is cgroup v2's single hierarchy."""
        return (self.root / "cgroup.controllers").exists()

    def own_path(self, controller: str) -> str | None:
        """This process's cgroup in ``controller``'s hierarchy ("" names v2's)."""
        try:
            lines = self.membership.read_text().splitlines()
        except OSError:
            return None
        for line in lines:
            parts = line.split(":", 2)
            if len(parts) == 3 and controller in parts[1].split(","):
                return parts[2]
        return None

    def is_dir(self, path: Path) -> bool:
        return path.is_dir()

    def writable(self, path: Path) -> bool:
        return os.access(path, os.W_OK)

    def words(self, path: Path) -> set[str]:
        try:
            return set(path.read_text().split())
        except OSError:
            return set()

    def available(self, path: Path) -> set[str]:
        """The controllers the parent gives this cgroup."""
        return self.words(path / "cgroup.controllers")

    def enabled(self, path: Path) -> set[str]:
        """The controllers this cgroup enables for its children."""
        return self.words(path / "cgroup.subtree_control")

    def has_processes(self, path: Path) -> bool:
        return bool(self.words(path / "cgroup.procs"))

    def delegated(self, path: Path) -> bool:
        for name in DELEGATE_XATTRS:
            with contextlib.suppress(OSError):
                if os.getxattr(path, name).strip(b"\0 \n") == b"1":
                    return True
        return False

    def make(self, path: Path) -> None:
        path.mkdir(exist_ok=True)

    def enable(self, path: Path, controller: str) -> None:
        """Enable ``controller`` for ``path``'s children; OSError as the kernel refuses."""
        (path / "cgroup.subtree_control").write_text(f"+{controller}", encoding="ascii")


@dataclass(frozen=True)
class Placement:
    """Where learners' cgroups are made on this host (``directories``: v2's one parent, or
    v1's ``memory`` parent then its ``cpu`` parent), or, for ``version`` 0, why none can be."""

    version: int
    directories: tuple[Path, ...] = ()
    cpu: bool = False
    # How the parent was chosen: cgroup_parent, ancestor, delegated, own.
    origin: str = ""
    reason: str = ""

    def learner_directories(self, name: str) -> list[Path]:
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"not a learner cgroup name: {name!r}")
        return [directory / name for directory in self.directories]

    @property
    def mechanism(self) -> str:
        return {V2: "cgroup v2", V1: "cgroup v1"}.get(self.version, "watchdog")

    def describe(self) -> str:
        """One line for the operator: where learners go and which limits hold."""
        if self.version == NONE:
            return (
                f"learners get no cgroup ({self.reason}): each controller watches its "
                "learner's resident memory and kills it over the manifest's memory; CPU "
                "is not limited"
            )
        origin = {
            "cgroup_parent": "the configured cgroup_parent",
            "ancestor": "the nearest cgroup that enables memory for its children",
            "delegated": "the cgroup delegated to this service",
            "own": "this process's own cgroup",
        }.get(self.origin, self.origin)
        limits = "memory limit and CPU share" if self.cpu else "memory limit (CPU not limited)"
        return (
            f"learner cgroups ({self.mechanism}) go under {self.directories[0]} ({origin}); "
            f"{limits} hold"
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "memory": self.mechanism,
            "cgroup": str(self.directories[0]) if self.directories else None,
            "cpu": "cgroup" if self.cpu else None,
            "origin": self.origin or None,
            "reason": self.reason or None,
            "detail": self.describe(),
        }


def no_cgroup(reason: str) -> Placement:
    return Placement(NONE, reason=reason)


def discover(
    cgroup_parent: str | None = None, *, create: bool = True, fs: CgroupFs | None = None
) -> Placement:
    """Where learners' cgroups go on this host (see the module's docstring).

    ``create``: make the ``ffdl/`` subtree and enable controllers where needed; without it
    nothing is written and a subtree not made yet gives no placement (for cleaning up).
    Raises ``CgroupParentError`` for a ``cgroup_parent`` that cannot be used.
    """
    fs = fs or CgroupFs()
    if fs.unified():
        if cgroup_parent:
            return _v2_configured(fs, cgroup_parent, create)
        return _v2_found(fs, create)
    if not (fs.root / "memory" / "cgroup.procs").exists():
        if cgroup_parent:
            raise CgroupParentError(
                f"cgroup_parent {cgroup_parent}: this host has no memory cgroup controller "
                f"(no cgroup v2 at {fs.root}, no v1 memory hierarchy)"
            )
        return no_cgroup(f"no cgroup filesystem with the memory controller at {fs.root}")
    return _v1(fs, cgroup_parent)


def _relative(cgroup_parent: str, fs: CgroupFs) -> str:
    """The configured parent as a path below the mount point (absolute paths allowed)."""
    text = cgroup_parent.strip()
    root = str(fs.root).rstrip("/") + "/"
    if text.startswith(root):
        text = text[len(root) :]
    return text.strip("/")


def _v2_configured(fs: CgroupFs, cgroup_parent: str, create: bool) -> Placement:
    parent = fs.root / _relative(cgroup_parent, fs)
    label = f"cgroup_parent {parent}"
    if not fs.is_dir(parent) or not (parent / "cgroup.controllers").exists():
        raise CgroupParentError(f"{label} does not exist (create it, or choose another)")
    if not fs.writable(parent):
        raise CgroupParentError(f"{label} is not writable by this process (uid {os.geteuid()})")
    if "memory" not in fs.available(parent):
        raise CgroupParentError(
            f"{label} lacks the memory controller: its parent {parent.parent} does not "
            "enable memory in cgroup.subtree_control"
        )
    if "memory" not in fs.enabled(parent) and fs.has_processes(parent):
        raise CgroupParentError(
            f"{label} holds processes, and cgroup v2 lets no cgroup with processes enable "
            "memory for its children: choose an empty cgroup, or move its processes into a "
            "child cgroup"
        )
    if create:
        _enable(fs, parent)
    return Placement(V2, (parent,), cpu="cpu" in fs.enabled(parent), origin="cgroup_parent")


def _v2_found(fs: CgroupFs, create: bool) -> Placement:
    own = fs.own_path("")
    if own is None:
        return no_cgroup(f"this process's cgroup v2 path is not in {fs.membership}")
    relative = Path(own.lstrip("/"))
    candidates = [relative, *relative.parents] if str(relative) != "." else [Path(".")]
    for index, candidate in enumerate(candidates):
        directory = fs.root / candidate
        if not fs.is_dir(directory) or not fs.writable(directory):
            continue
        if "memory" in fs.enabled(directory):
            origin = "own" if index == 0 else "ancestor"
            return _subtree(fs, directory, origin, create)
        delegated_to_us = (
            fs.delegated(directory)
            and "memory" in fs.available(directory)
            and not fs.has_processes(directory)
        )
        if delegated_to_us:
            if create:
                try:
                    fs.enable(directory, "memory")
                except OSError as exc:
                    return no_cgroup(f"cannot enable memory in delegated {directory}: {exc}")
                _try_enable(fs, directory, "cpu")
            return _subtree(fs, directory, "delegated", create)
    where = fs.root / relative
    return no_cgroup(
        f"neither this process's cgroup {where} nor any writable ancestor enables the "
        "memory controller for its children; set cgroup_parent, or run ffdl up as a "
        "systemd service with Delegate=yes"
    )


def _subtree(fs: CgroupFs, parent: Path, origin: str, create: bool) -> Placement:
    subtree = parent / SUBTREE
    if not create:
        if not fs.is_dir(subtree):
            return no_cgroup(f"{subtree} does not exist")
        return Placement(V2, (subtree,), cpu="cpu" in fs.enabled(subtree), origin=origin)
    try:
        fs.make(subtree)
    except OSError as exc:
        return no_cgroup(f"cannot create {subtree}: {exc}")
    if fs.has_processes(subtree):
        # Someone put processes in ffdl's own subtree: the kernel would refuse below.
        return no_cgroup(f"{subtree} holds processes, so it cannot enable memory for learners")
    try:
        _enable(fs, subtree)
    except OSError as exc:
        return no_cgroup(f"cannot enable memory in {subtree}: {exc}")
    return Placement(V2, (subtree,), cpu="cpu" in fs.enabled(subtree), origin=origin)


def _enable(fs: CgroupFs, directory: Path) -> None:
    """Memory (required) and cpu (when available) for ``directory``'s children."""
    if "memory" not in fs.enabled(directory):
        fs.enable(directory, "memory")
    _try_enable(fs, directory, "cpu")


def _try_enable(fs: CgroupFs, directory: Path, controller: str) -> None:
    if controller in fs.available(directory) and controller not in fs.enabled(directory):
        with contextlib.suppress(OSError):
            fs.enable(directory, controller)


def _v1(fs: CgroupFs, cgroup_parent: str | None) -> Placement:
    memory_mount = fs.root / "memory"
    cpu_mount = fs.root / "cpu"
    if cgroup_parent:
        relative = _relative(cgroup_parent, fs)
        memory = memory_mount / relative
        if not fs.is_dir(memory):
            raise CgroupParentError(f"cgroup_parent {memory} does not exist (create it first)")
        if not fs.writable(memory):
            raise CgroupParentError(
                f"cgroup_parent {memory} is not writable by this process (uid {os.geteuid()})"
            )
        cpu = cpu_mount / relative
        origin = "cgroup_parent"
    else:
        own_memory = fs.own_path("memory")
        memory = memory_mount / (own_memory or "/").lstrip("/")
        if own_memory is None or not fs.is_dir(memory) or not fs.writable(memory):
            return no_cgroup(f"this process's v1 memory cgroup {memory} is not writable")
        cpu = cpu_mount / (fs.own_path("cpu") or "/").lstrip("/")
        origin = "own"
    directories = [memory]
    if fs.is_dir(cpu) and fs.writable(cpu):
        directories.append(cpu)
    return Placement(V1, tuple(directories), cpu=len(directories) == 2, origin=origin)
