"""Moving a learner's data in and its results out: tree copies with progress lines, and
volume mounts as symlinks.

This module owns what "staged" means: a copied file is left alone on a later attempt when
size and modification time already match, and progress is announced at most every
``PROGRESS_INTERVAL_S`` seconds plus once at the end.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from stat import S_ISREG

PROGRESS_INTERVAL_S = 0.5
MEGABYTE = 1_000_000


class StagingError(Exception):
    """A copy or link could not be made; the message names the path involved."""


class StagingStopped(Exception):
    """The caller asked to stop while a copy was under way."""


@dataclass
class CopyStats:
    files_total: int = 0
    bytes_total: int = 0
    files_done: int = 0
    bytes_done: int = 0
    files_skipped: int = 0


def _progress_line(label: str, stats: CopyStats) -> str:
    return (
        f"[ffdl] {label}: {stats.files_done}/{stats.files_total} files, "
        f"{stats.bytes_done / MEGABYTE:.1f}/{stats.bytes_total / MEGABYTE:.1f} MB"
    )


def _is_same_file(source: os.stat_result, target_path: str) -> bool:
    try:
        target = os.stat(target_path, follow_symlinks=False)
    except OSError:
        return False
    return (
        target.st_size == source.st_size
        and target.st_mtime_ns == source.st_mtime_ns
        and not os.path.islink(target_path)
    )


def _plan(source: str) -> tuple[list[tuple[str, str, os.stat_result]], list[str], list[str]]:
    """Walk ``source`` without following links: (regular files with their stats,
    directories, and what was left out: links and special files)."""
    files: list[tuple[str, str, os.stat_result]] = []
    directories: list[str] = []
    left_out: list[str] = []

    def fail(error: OSError) -> None:
        raise error

    for root, dirnames, filenames in os.walk(source, onerror=fail):
        relative_root = os.path.relpath(root, source)
        for name in dirnames:
            relative = os.path.normpath(os.path.join(relative_root, name))
            if os.path.islink(os.path.join(root, name)):
                left_out.append(relative)
            else:
                directories.append(relative)
        for name in filenames:
            path = os.path.join(root, name)
            relative = os.path.normpath(os.path.join(relative_root, name))
            stat = os.stat(path, follow_symlinks=False)
            if S_ISREG(stat.st_mode):
                files.append((path, relative, stat))
            else:
                left_out.append(relative)
    return files, directories, left_out


def _open_planned(path: str, planned: os.stat_result, root: str) -> int:
    """Open a planned file for reading, or raise OSError if it is no longer that file.

    The tree may belong to a job whose processes still run: the file is opened without
    following a final link, and the open file itself must be the regular file planned,
    inside ``root``, so a path swapped for a link meanwhile is never read.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        opened = os.fstat(fd)
        real = os.readlink(f"/proc/self/fd/{fd}")
        same = (opened.st_dev, opened.st_ino) == (planned.st_dev, planned.st_ino)
        inside = real == root or real.startswith(root.rstrip("/") + "/")
        if not (S_ISREG(opened.st_mode) and same and inside):
            raise OSError(f"{path} changed while it was being copied")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _copy_file(path: str, destination: str, planned: os.stat_result, root: str) -> None:
    fd = _open_planned(path, planned, root)
    with os.fdopen(fd, "rb") as src, open(destination, "wb") as out:
        shutil.copyfileobj(src, out)
    os.chmod(destination, planned.st_mode & 0o777)
    os.utime(destination, ns=(planned.st_atime_ns, planned.st_mtime_ns))


def copy_tree(
    source: str,
    target: str,
    *,
    label: str,
    progress: Callable[[str], None],
    should_stop: Callable[[], bool] = lambda: False,
    clock: Callable[[], float] = time.monotonic,
) -> CopyStats:
    """Copy the file or directory tree ``source`` to ``target``, skipping files already there.

    Files keep their modification times, which is what lets a later attempt recognise them.
    Links are never followed: a symbolic link (to a file or a directory) and any special
    file is left out and named in a progress line, because the tree may be a job's own and
    a link could point at any file of the host.
    """
    if not os.path.lexists(source):
        raise StagingError(f"data source does not exist: {source}")
    try:
        root = os.path.realpath(source)
        if os.path.islink(source):
            raise StagingError(f"{source} is a symbolic link; links are not followed")
        if os.path.isfile(source):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            entries = [(source, "", os.stat(source, follow_symlinks=False))]
            root = os.path.dirname(root)
            directories: list[str] = []
            left_out: list[str] = []
        else:
            entries, directories, left_out = _plan(source)
            os.makedirs(target, exist_ok=True)
    except OSError as exc:
        raise StagingError(f"cannot read {source}: {exc}") from exc
    for relative in sorted(left_out):
        progress(f"[ffdl] {label}: left out {relative}: a link or special file is not copied")
    stats = CopyStats(
        files_total=len(entries), bytes_total=sum(stat.st_size for _, _, stat in entries)
    )
    last_report = clock()
    reported_done = -1
    try:
        for relative in directories:
            os.makedirs(os.path.join(target, relative), exist_ok=True)
        for path, relative, stat in entries:
            if should_stop():
                raise StagingStopped()
            destination = os.path.join(target, relative) if relative else target
            if _is_same_file(stat, destination):
                stats.files_skipped += 1
            else:
                _copy_file(path, destination, stat, root)
            stats.files_done += 1
            stats.bytes_done += stat.st_size
            now = clock()
            if now - last_report >= PROGRESS_INTERVAL_S:
                progress(_progress_line(label, stats))
                last_report, reported_done = now, stats.files_done
    except OSError as exc:
        raise StagingError(f"cannot copy {source} to {target}: {exc}") from exc
    if reported_done != stats.files_done:
        progress(_progress_line(label, stats))
    return stats


def hand_over(path: str, uid: int, gid: int) -> None:
    """Give a staged tree to the job's user (links are changed, never followed)."""
    try:
        os.chown(path, uid, gid, follow_symlinks=False)
        for root, dirnames, filenames in os.walk(path):
            for name in dirnames + filenames:
                os.chown(os.path.join(root, name), uid, gid, follow_symlinks=False)
    except OSError as exc:
        raise StagingError(f"cannot hand {path} to the job's user: {exc}") from exc


def link_volume(source: str, target: str) -> None:
    """Make ``target`` a symlink to ``source``, replacing a stale link or an empty directory."""
    if not os.path.exists(source):
        raise StagingError(f"data source does not exist: {source}")
    try:
        if os.path.islink(target):
            if os.readlink(target) == source:
                return
            os.unlink(target)
        elif os.path.isdir(target) and not os.listdir(target):
            os.rmdir(target)
        elif os.path.lexists(target):
            raise StagingError(f"cannot mount {source}: {target} already exists")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.symlink(source, target)
    except OSError as exc:
        raise StagingError(f"cannot mount {source} at {target}: {exc}") from exc
