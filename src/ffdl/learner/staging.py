"""Moving a learner's data in and its results out: tree copies with progress lines, volume
mounts as symlinks, and transfers with object stores (through ``ffdl.storage``).

This module owns what "staged" means: a copied file is left alone on a later attempt when
size and modification time already match, and progress is announced at most every
``PROGRESS_INTERVAL_S`` seconds plus once at the end. ``ffdl.storage`` (and s3fs) is imported
only when a job uses an object store: the controller must start fast.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from stat import S_ISREG
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ffdl.learner.spec import ObjectLocation
    from ffdl.storage.base import DataStore, TransferStats

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


class _Counts(Protocol):
    files_total: int
    bytes_total: int
    files_done: int
    bytes_done: int


def _progress_line(label: str, stats: _Counts) -> str:
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


# -- object stores ----------------------------------------------------------------------


def object_store(location: ObjectLocation) -> DataStore:
    """The S3 store a spec's location names (``location.root`` is ``bucket[/prefix]``)."""
    from ffdl.storage.connection import ConnectionFieldError, S3Connection
    from ffdl.storage.s3 import s3_store

    try:
        connection = S3Connection.from_fields(location.connection)
    except ConnectionFieldError as exc:
        raise StagingError(f"s3://{location.root}: {exc}") from None
    return s3_store(connection, location.root)


def _transfer(
    run: Callable[[], TransferStats], label: str, progress: Callable[[str], None]
) -> TransferStats:
    """Run a store transfer, turning the store's errors into this module's."""
    from ffdl.storage.base import StorageError, StoreStopped

    try:
        stats = run()
    except StoreStopped:
        raise StagingStopped() from None
    except StorageError as exc:
        raise StagingError(f"{label} failed: {exc}") from None
    if stats.files_skipped:
        progress(f"[ffdl] {label}: {stats.files_skipped} files already in place, not copied again")
    return stats


def download_objects(
    store: DataStore,
    prefix: str,
    target: str,
    *,
    label: str,
    progress: Callable[[str], None],
    should_stop: Callable[[], bool] = lambda: False,
) -> TransferStats:
    """Download everything under ``prefix`` into ``target``; files a previous attempt left
    (same size and modification time) are kept."""
    return _transfer(
        lambda: store.download(
            prefix,
            target,
            progress=lambda stats: progress(_progress_line(label, stats)),
            should_stop=should_stop,
            skip_existing=True,
        ),
        label,
        progress,
    )


def upload_objects(
    source: str,
    store: DataStore,
    prefix: str,
    *,
    label: str,
    progress: Callable[[str], None],
    should_stop: Callable[[], bool] = lambda: False,
    skip_existing: bool = False,
) -> TransferStats:
    """Upload the regular files of ``source`` under ``prefix`` (links are left out)."""
    return _transfer(
        lambda: store.upload(
            source,
            prefix,
            progress=lambda stats: progress(_progress_line(label, stats)),
            should_stop=should_stop,
            skip_existing=skip_existing,
        ),
        label,
        progress,
    )


def restore_tree(
    store: DataStore,
    prefix: str,
    target: str,
    scratch: str,
    owner: tuple[int, int] | None,
    *,
    label: str,
    progress: Callable[[str], None],
    should_stop: Callable[[], bool] = lambda: False,
) -> TransferStats | None:
    """Fill an empty ``target`` (a directory the job writes) from the store; None when
    ``target`` already holds something or the store has nothing under ``prefix``.

    The files are downloaded into a fresh directory in ``scratch`` (the platform's, out of
    the job's reach), handed to ``owner`` and only then moved into ``target``: a link the
    job planted meanwhile is replaced, never written through.
    """
    try:
        if os.listdir(target):
            return None
    except FileNotFoundError:
        os.makedirs(target, exist_ok=True)
    except OSError as exc:
        raise StagingError(f"cannot read {target}: {exc}") from exc
    from ffdl.storage.base import StorageError

    try:
        if not store.list(prefix):
            return None
    except StorageError as exc:
        raise StagingError(f"{label} failed: {exc}") from None
    os.makedirs(scratch, exist_ok=True, mode=0o700)
    fresh = tempfile.mkdtemp(prefix="restore-", dir=scratch)
    try:
        stats = download_objects(
            store, prefix, fresh, label=label, progress=progress, should_stop=should_stop
        )
        if owner is not None:
            hand_over(fresh, *owner)
        for name in os.listdir(fresh):
            destination = os.path.join(target, name)
            if not os.path.lexists(destination):
                os.rename(os.path.join(fresh, name), destination)
    except OSError as exc:
        raise StagingError(f"{label} failed: {exc}") from exc
    finally:
        shutil.rmtree(fresh, ignore_errors=True)
    return stats


# FfDL's layout of a job's results in an object store, under <results bucket>/<training id>/.
STORE_CHECKPOINTS_DIR = "_wml_checkpoints"
STORE_CODE_DIR = "_submitted_code"
STORE_CODE_ARCHIVE = "model.zip"


class JobStore:
    """One learner's side of a job's results store (``<bucket>/<training id>/``): results
    (learner 1) at the top, its LOG_DIR under ``learner-N/``, the code archive under
    ``_submitted_code/``, checkpoints under ``_wml_checkpoints/``, as FfDL laid them out."""

    def __init__(
        self,
        location: ObjectLocation,
        learner: int,
        progress: Callable[[str], None],
        scratch: str,
    ) -> None:
        self.location = location
        self.learner = learner
        self._progress = progress
        self._scratch = scratch
        self._store: DataStore | None = None

    @property
    def url(self) -> str:
        return f"s3://{self.location.root}"

    def store(self) -> DataStore:
        if self._store is None:
            self._store = object_store(self.location)
        return self._store

    def store_results(self, source: str | None, should_stop: Callable[[], bool]) -> None:
        """Learner 1 uploads RESULT_DIR; raises ``StagingError`` or ``StagingStopped``."""
        if self.learner != 1 or not source or not os.path.isdir(source):
            return
        self._progress(f"[ffdl] storing results from {source} to {self.url}")
        upload_objects(
            source,
            self.store(),
            "",
            label="storing results",
            progress=self._progress,
            should_stop=should_stop,
        )

    def store_logs_and_code(
        self, log_dir: str | None, archive: str | None, should_stop: Callable[[], bool]
    ) -> None:
        """This learner's LOG_DIR and (learner 1) the code archive; the results stand
        without them, so a failure is only told."""
        try:
            if log_dir and os.path.isdir(log_dir):
                upload_objects(
                    log_dir,
                    self.store(),
                    f"learner-{self.learner}",
                    label="storing logs",
                    progress=self._progress,
                    should_stop=should_stop,
                )
            if self.learner == 1 and archive and os.path.isfile(archive):
                # Uploaded from a copy of the platform's own: the archive's directory holds
                # more than the archive.
                staged = os.path.join(self._scratch, "submitted_code")
                os.makedirs(staged, mode=0o700, exist_ok=True)
                copy = os.path.join(staged, STORE_CODE_ARCHIVE)
                if not os.path.exists(copy):
                    shutil.copyfile(archive, copy)
                upload_objects(
                    staged,
                    self.store(),
                    STORE_CODE_DIR,
                    label="storing the model definition",
                    progress=self._progress,
                    should_stop=should_stop,
                    skip_existing=True,
                )
        except StagingStopped:
            return
        except (StagingError, OSError) as exc:
            self._progress(f"[ffdl] storing logs failed: {exc}")

    def save_checkpoints(self, source: str | None, should_stop: Callable[[], bool]) -> None:
        """Learner 1 uploads CHECKPOINT_DIR (unchanged files are not sent again); a failure
        is told, never the attempt's."""
        if self.learner != 1 or not source or not os.path.isdir(source):
            return
        try:
            if os.listdir(source):
                upload_objects(
                    source,
                    self.store(),
                    STORE_CHECKPOINTS_DIR,
                    label="saving checkpoints",
                    progress=self._progress,
                    should_stop=should_stop,
                    skip_existing=True,
                )
        except StagingStopped:
            return
        except (StagingError, OSError) as exc:
            self._progress(f"[ffdl] saving checkpoints failed: {exc}")

    def restore_checkpoints(
        self, target: str | None, owner: tuple[int, int] | None, should_stop: Callable[[], bool]
    ) -> None:
        """Fill an empty CHECKPOINT_DIR from the store (a later attempt on another machine);
        raises ``StagingError`` or ``StagingStopped``."""
        if not target:
            return
        restored = restore_tree(
            self.store(),
            STORE_CHECKPOINTS_DIR,
            target,
            os.path.join(self._scratch, "restore"),
            owner,
            label="restoring checkpoints",
            progress=self._progress,
            should_stop=should_stop,
        )
        if restored is not None:
            self._progress(
                f"[ffdl] restored {restored.files_total} checkpoint files from "
                f"{self.url}/{STORE_CHECKPOINTS_DIR} into {target}"
            )
