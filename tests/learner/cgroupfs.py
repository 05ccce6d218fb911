"""Fabricated cgroup filesystems for the cgroup discovery tests.

A tree of real directories and files under a temporary directory, laid out as the kernel
shows cgroup v1 and v2, and a ``CgroupFs`` over it that keeps the kernel's rules where
discovery writes: a new cgroup gets the controllers its parent enables, a controller can be
enabled only where it is available, and (cgroup v2) never in a non-root cgroup that holds
processes. Permissions and systemd's delegation mark are declared, since the tests run as
root and the marks are extended attributes a temporary directory may not take.
"""

from __future__ import annotations

import errno
from pathlib import Path

from ffdl.learner.cgroup_placement import CgroupFs


class FabricatedCgroupFs(CgroupFs):
    def __init__(self, root: Path, membership: Path) -> None:
        super().__init__(root, membership)
        self.read_only: set[Path] = set()
        self.delegated_to_us: set[Path] = set()
        self.writes: list[tuple[Path, str]] = []

    def writable(self, path: Path) -> bool:
        return path.is_dir() and path not in self.read_only

    def delegated(self, path: Path) -> bool:
        return path in self.delegated_to_us

    def make(self, path: Path) -> None:
        if not path.exists():
            path.mkdir()
            (path / "cgroup.controllers").write_text(" ".join(sorted(self.enabled(path.parent))))
            (path / "cgroup.subtree_control").write_text("")
            (path / "cgroup.procs").write_text("")
            self.writes.append((path, "mkdir"))

    def enable(self, path: Path, controller: str) -> None:
        if controller not in self.available(path) and path != self.root:
            raise OSError(errno.ENOENT, f"{controller} not available in {path}")
        if path != self.root and self.has_processes(path):
            raise OSError(errno.EBUSY, f"{path} holds processes")
        enabled = self.enabled(path) | {controller}
        (path / "cgroup.subtree_control").write_text(" ".join(sorted(enabled)))
        self.writes.append((path, f"+{controller}"))


def v2_tree(tmp: Path, layout: dict[str, tuple[str, str, str]], own: str) -> FabricatedCgroupFs:
    """A v2 hierarchy: ``layout`` maps each cgroup ("" is the root) to its available
    controllers, its enabled ones and its processes; this process sits in ``own``."""
    root = tmp / "cgroup"
    for name, (available, enabled, procs) in layout.items():
        directory = root / name if name else root
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "cgroup.controllers").write_text(available)
        (directory / "cgroup.subtree_control").write_text(enabled)
        (directory / "cgroup.procs").write_text(procs)
    membership = tmp / "self-cgroup"
    membership.write_text(f"0::{own}\n")
    return FabricatedCgroupFs(root, membership)


def v1_tree(
    tmp: Path, own: str, controllers: tuple[str, ...] = ("memory", "cpu")
) -> FabricatedCgroupFs:
    """A v1 layout: one hierarchy per controller, this process in ``own`` in each."""
    root = tmp / "cgroup"
    lines = []
    for number, controller in enumerate(controllers, start=1):
        mount = root / controller
        (mount / own.lstrip("/")).mkdir(parents=True, exist_ok=True)
        (mount / "cgroup.procs").write_text("1\n")
        lines.append(f"{number}:{controller}:{own}")
    root.mkdir(parents=True, exist_ok=True)
    membership = tmp / "self-cgroup"
    membership.write_text("\n".join([*lines, "0::/"]) + "\n")
    return FabricatedCgroupFs(root, membership)
