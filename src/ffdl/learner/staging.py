"""Moving a learner's data in and its results out: tree copies with progress lines, volume
mounts as symlinks, and transfers with object stores (through ``ffdl.storage``): S3
buckets, or ``file://`` directories every node sees.

This module owns what "staged" means: a copied file is left alone on a later attempt when
size and modification time already match, and progress is announced at most every
``PROGRESS_INTERVAL_S`` seconds plus once at the end. It also owns the job's checkpoints in
a store: saved at an attempt's end or, while the command runs, every few seconds by a
``CheckpointSync`` thread, never a checkpoint half written (see ``snapshot_tree``).
``ffdl.storage`` (and s3fs) is imported only when a job uses a store: the controller must
start fast.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from stat import S_ISREG
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ffdl.learner.spec import ObjectLocation
    from ffdl.storage.base import DataStore, TransferStats

PROGRESS_INTERVAL_S = 0.5
MEGABYTE = 1_000_000
FILE_URL = "file://"
CHUNK_BYTES = 1 << 20


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


def progress_line(label: str, stats: _Counts) -> str:
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


def plan_tree(source: str) -> tuple[list[tuple[str, str, os.stat_result]], list[str], list[str]]:
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


def open_planned(path: str, planned: os.stat_result, root: str) -> int:
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
    fd = open_planned(path, planned, root)
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
            entries, directories, left_out = plan_tree(source)
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
                progress(progress_line(label, stats))
                last_report, reported_done = now, stats.files_done
    except OSError as exc:
        raise StagingError(f"cannot copy {source} to {target}: {exc}") from exc
    if reported_done != stats.files_done:
        progress(progress_line(label, stats))
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
    """The store a spec's location names: ``location.root`` is ``bucket[/prefix]`` (S3) or
    ``file:///dir`` (a directory, on a filesystem every node shares)."""
    if location.root.startswith(FILE_URL):
        return _shared_directory(location.root)
    from ffdl.storage.connection import ConnectionFieldError, S3Connection
    from ffdl.storage.s3 import s3_store

    try:
        connection = S3Connection.from_fields(location.connection)
    except ConnectionFieldError as exc:
        raise StagingError(f"s3://{location.root}: {exc}") from None
    return s3_store(connection, location.root)


def _shared_directory(url: str) -> DataStore:
    """A local store (``fsspec_store.local_store``'s) whose files appear whole or not at all.

    fsspec's local ``put`` writes straight into the file's final name: a machine that dies
    mid-upload would leave a truncated checkpoint that a later attempt, elsewhere, restores.
    Here each file is written under a hidden name beside it and renamed when complete, as
    an S3 object only appears once whole.
    """
    from fsspec.implementations.local import LocalFileSystem

    from ffdl.storage.fsspec_store import FsspecStore

    class WholeFiles(LocalFileSystem):  # type: ignore[misc]
        def put_file(self, path1: Any, path2: Any, callback: Any = None, **kwargs: Any) -> None:
            del kwargs
            target = self._strip_protocol(path2)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            fd, partial = tempfile.mkstemp(prefix=".ffdl-partial-", dir=os.path.dirname(target))
            try:
                with open(self._strip_protocol(path1), "rb") as src, os.fdopen(fd, "wb") as out:
                    while chunk := src.read(CHUNK_BYTES):
                        out.write(chunk)
                        # Counts the bytes, and stops a large file's copy on request.
                        if callback is not None:
                            callback.relative_update(len(chunk))
                os.chmod(partial, 0o644)
                os.replace(partial, target)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(partial)
                raise

    directory = os.path.abspath(url[len(FILE_URL) :])
    # The root is the job's own directory in the store (``file://<store>/<training id>``):
    # the store must exist, the job's directory appears with its first upload. A store that
    # is not mounted on this node is then an error, never an empty store.
    anchor = os.path.dirname(directory)
    return FsspecStore(WholeFiles(auto_mkdir=True), directory, url=url, anchor=anchor)


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
            progress=lambda stats: progress(progress_line(label, stats)),
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
            progress=lambda stats: progress(progress_line(label, stats)),
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
# The SDK writes a checkpoint under such a hidden name and renames it when whole
# (``ffdl.sdk.checkpoint``): a file still being written, never stored.
PARTIAL_CHECKPOINT = (".ckpt-", ".tmp")


def _partial_checkpoint(name: str) -> bool:
    return name.startswith(PARTIAL_CHECKPOINT[0]) and name.endswith(PARTIAL_CHECKPOINT[1])


def tree_state(source: str) -> tuple[tuple[str, int, int], ...]:
    """What a checkpoint directory holds: (path, size, mtime) of each regular file that
    is not a checkpoint being written. Two equal states need no second upload."""
    files, _directories, _left_out = plan_tree(source)
    return tuple(
        sorted(
            (relative, stat.st_size, stat.st_mtime_ns)
            for _path, relative, stat in files
            if not _partial_checkpoint(os.path.basename(relative))
        )
    )


def snapshot_tree(source: str, scratch: str) -> str | None:
    """A fresh directory in ``scratch`` holding hard links to the regular files of
    ``source``, checkpoints being written left out; None where links cannot be made (another
    filesystem), and the caller uploads ``source`` itself.

    The files uploaded are then the ones seen here, whatever the job renames or prunes
    meanwhile; a file the job writes in place is uploaded as it is when read, and again
    once its size or time has changed.
    """
    files, directories, _left_out = plan_tree(source)
    os.makedirs(scratch, exist_ok=True, mode=0o700)
    fresh = tempfile.mkdtemp(prefix="snapshot-", dir=scratch)
    try:
        for relative in directories:
            os.makedirs(os.path.join(fresh, relative), exist_ok=True)
        for path, relative, _stat in files:
            if _partial_checkpoint(os.path.basename(relative)):
                continue
            with contextlib.suppress(FileNotFoundError):  # pruned meanwhile
                os.link(path, os.path.join(fresh, relative), follow_symlinks=False)
    except OSError:
        shutil.rmtree(fresh, ignore_errors=True)
        return None
    return fresh


class JobStore:
    """One learner's side of a job's store (``<bucket>/<training id>/``): results (learner
    1) at the top, its LOG_DIR under ``learner-N/``, the code archive under
    ``_submitted_code/``, checkpoints under ``_wml_checkpoints/``, as FfDL laid them out.
    With ``checkpoints_only`` (a job's checkpoint store, not its results store) it holds
    the checkpoints alone: results and logs go elsewhere."""

    def __init__(
        self,
        location: ObjectLocation,
        learner: int,
        progress: Callable[[str], None],
        scratch: str,
        *,
        checkpoints_only: bool = False,
    ) -> None:
        self.location = location
        self.learner = learner
        self.checkpoints_only = checkpoints_only
        self._progress = progress
        self._scratch = scratch
        self._store: DataStore | None = None

    @property
    def url(self) -> str:
        root = self.location.root
        return root if root.startswith(FILE_URL) else f"s3://{root}"

    def store(self) -> DataStore:
        if self._store is None:
            self._store = object_store(self.location)
        return self._store

    def store_results(self, source: str | None, should_stop: Callable[[], bool]) -> None:
        """Learner 1 uploads RESULT_DIR; raises ``StagingError`` or ``StagingStopped``."""
        if self.checkpoints_only or self.learner != 1 or not source or not os.path.isdir(source):
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
        if self.checkpoints_only:
            return
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
        try:
            if source and os.path.isdir(source) and os.listdir(source):
                self.upload_checkpoints(source, should_stop, "saving checkpoints", self._progress)
        except StagingStopped:
            return
        except (StagingError, OSError) as exc:
            self._progress(f"[ffdl] saving checkpoints failed: {exc}")

    def upload_checkpoints(
        self,
        source: str,
        should_stop: Callable[[], bool],
        label: str,
        progress: Callable[[str], None],
    ) -> TransferStats | None:
        """Learner 1 uploads what is new in CHECKPOINT_DIR, from a snapshot (see
        ``snapshot_tree``); raises ``StagingError``, ``StagingStopped`` or ``OSError``."""
        if self.learner != 1:
            return None
        snapshot = snapshot_tree(source, os.path.join(self._scratch, "checkpoint-snapshots"))
        try:
            return upload_objects(
                snapshot or source,
                self.store(),
                STORE_CHECKPOINTS_DIR,
                label=label,
                progress=progress,
                should_stop=should_stop,
                skip_existing=True,
            )
        finally:
            if snapshot is not None:
                shutil.rmtree(snapshot, ignore_errors=True)

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


class CheckpointSync:
    """Learner 1's CHECKPOINT_DIR uploaded to the job's store every ``interval_s`` while the
    command runs, whenever something in it changed, so that a machine that dies loses at
    most that much. A failure is told in the job's log (once, until it recovers), never
    the attempt's; ``stop`` ends an upload under way and waits for the thread."""

    def __init__(
        self, store: JobStore, source: str, interval_s: float, progress: Callable[[str], None]
    ) -> None:
        self._store = store
        self._source = source
        self._interval_s = interval_s
        self._progress = progress
        self._stopped = threading.Event()
        self._synced: tuple[tuple[str, int, int], ...] = ()
        self._told: str | None = None
        self._thread = threading.Thread(target=self._run, name="checkpoint-sync", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stopped.wait(self._interval_s):
            try:
                self.sync_once()
            except StagingStopped:
                return
            except (StagingError, OSError) as exc:
                problem = f"[ffdl] syncing checkpoints to {self._store.url} failed: {exc}"
                if problem != self._told:
                    self._progress(problem)
                    self._told = problem
            else:
                if self._told is not None:
                    self._progress(f"[ffdl] syncing checkpoints to {self._store.url} works again")
                    self._told = None

    def sync_once(self) -> None:
        """Upload CHECKPOINT_DIR when it changed since the last upload that went through."""
        if not os.path.isdir(self._source):
            return
        state = tree_state(self._source)
        if not state or state == self._synced:
            return
        stats = self._store.upload_checkpoints(
            self._source, self._stopped.is_set, "syncing checkpoints", lambda line: None
        )
        self._synced = state
        if stats is not None and stats.files_done > stats.files_skipped:
            self._progress(
                f"[ffdl] synced checkpoints to {self._store.url}: "
                f"{stats.files_done - stats.files_skipped} new or changed of "
                f"{stats.files_total} files, {stats.bytes_total / MEGABYTE:.1f} MB in all"
            )
