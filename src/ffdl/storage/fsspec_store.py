"""``FsspecStore``: the ``DataStore`` over any fsspec filesystem (S3, local, memory).

Transfers hand whole lists of files to the filesystem's own ``get``/``put``, so an async
filesystem such as s3fs moves many files at once and streams large ones in parallel parts,
exactly as it does for its own callers; progress comes from fsspec callbacks (bytes as they
stream, files as they finish) and a stop request is honoured between any two chunks.

Local files are handled as the platform's other copies are: links and special files are
never followed. An upload opens each file itself (no following a final link, the open file
must be the regular file listed, inside the directory) and gives the filesystem
``/proc/self/fd/N`` to read, so a path swapped for a link while the transfer runs is never
read. A download refuses keys that would land outside the target directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import posixpath
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from stat import S_ISREG
from typing import Any

from fsspec import AbstractFileSystem
from fsspec.callbacks import Callback

from ffdl.storage.base import (
    NEVER_STOP,
    NO_PROGRESS,
    ObjectInfo,
    Progress,
    ShouldStop,
    StorageError,
    StoreAccessDenied,
    StoreNotFound,
    StoreStopped,
    StoreUnreachable,
    TransferStats,
)

PROGRESS_INTERVAL_S = 0.5
# Files opened at once by an upload (each is an open descriptor until its batch is sent).
UPLOAD_BATCH = 256
# A local file counts as the store's when its mtime is within this of the object's.
_MTIME_SLACK_S = 0.01

Translate = Callable[[BaseException], StorageError | None]


def _default_translate(error: BaseException) -> StorageError | None:
    if isinstance(error, FileNotFoundError):
        return StoreNotFound(f"not found: {error.filename or error}")
    if isinstance(error, PermissionError):
        return StoreAccessDenied(f"access denied: {error}")
    if isinstance(error, ConnectionError | TimeoutError):
        return StoreUnreachable(f"cannot reach the store: {error}")
    return None


class _Progress(Callback):  # type: ignore[misc]
    """Counts files as fsspec finishes them and bytes as its per-file children stream them;
    reports at most every ``interval`` seconds and raises ``StoreStopped`` on request."""

    def __init__(
        self,
        stats: TransferStats,
        report: Progress,
        should_stop: ShouldStop,
        interval: float,
        sizes: dict[str, int] | None = None,
    ) -> None:
        super().__init__()
        self.stats = stats
        # Each source's size: a filesystem that copies without streaming callbacks (the
        # local one) still counts a file's bytes when it is done.
        self.sizes = sizes or {}
        self._report = report
        self._should_stop = should_stop
        self._interval = interval
        self._last = time.monotonic()

    def set_size(self, size: int | None) -> None:
        del size  # the totals are known from the listing

    def relative_update(self, inc: int | None = 1) -> None:
        self.stats.files_done += inc or 0
        self.tick()

    def absolute_update(self, value: int) -> None:
        del value

    def branched(self, path_1: Any, path_2: Any, **kwargs: Any) -> Callback:
        del path_2, kwargs
        return _FileProgress(self, self.sizes.get(str(path_1), 0))

    def add_bytes(self, count: int) -> None:
        self.stats.bytes_done += count
        self.tick()

    def tick(self) -> None:
        if self._should_stop():
            raise StoreStopped("the transfer was stopped on request")
        now = time.monotonic()
        if now - self._last >= self._interval:
            self._last = now
            self._report(self.stats)


class _FileProgress(Callback):  # type: ignore[misc]
    def __init__(self, parent: _Progress, size: int) -> None:
        super().__init__()
        self._parent = parent
        self._size = size
        self._seen = 0

    def close(self) -> None:
        if self._seen < self._size:
            self._parent.add_bytes(self._size - self._seen)
            self._seen = self._size

    def set_size(self, size: int | None) -> None:
        del size

    def relative_update(self, inc: int | None = 1) -> None:
        self._seen += inc or 0
        self._parent.add_bytes(inc or 0)

    def absolute_update(self, value: int) -> None:
        self._parent.add_bytes(value - self._seen)
        self._seen = value


def _modified(info: dict[str, Any]) -> float | None:
    for key in ("LastModified", "mtime", "created"):
        value = info.get(key)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, int | float):
            return float(value)
    return None


def _partial_name(path: str) -> str:
    # Hashed: the file's own name may already be as long as a name can be.
    head, tail = os.path.split(path)
    digest = hashlib.sha256(tail.encode("utf-8", "surrogateescape")).hexdigest()[:24]
    return os.path.join(head, f".ffdl-partial-{digest}-{os.getpid()}")


def _safe_key(key: str) -> bool:
    parts = key.split("/")
    return bool(key) and not key.startswith("/") and all(p not in ("", ".", "..") for p in parts)


def _same_local_file(path: str, size: int, modified: float | None) -> bool:
    if modified is None:
        return False
    try:
        local = os.lstat(path)
    except OSError:
        return False
    return (
        S_ISREG(local.st_mode)
        and local.st_size == size
        and abs(local.st_mtime - modified) <= _MTIME_SLACK_S
    )


def local_files(local_dir: str) -> tuple[list[tuple[str, os.stat_result]], list[str]]:
    """The regular files under ``local_dir`` (relative path, stat), and what was left out
    (links, special files), walking without following links."""
    files: list[tuple[str, os.stat_result]] = []
    left_out: list[str] = []

    def fail(error: OSError) -> None:
        raise error

    for root, dirnames, filenames in os.walk(local_dir, onerror=fail):
        relative_root = os.path.relpath(root, local_dir)
        for name in list(dirnames):
            if os.path.islink(os.path.join(root, name)):
                left_out.append(os.path.normpath(os.path.join(relative_root, name)))
        for name in filenames:
            relative = os.path.normpath(os.path.join(relative_root, name))
            stat = os.lstat(os.path.join(root, name))
            if S_ISREG(stat.st_mode):
                files.append((relative, stat))
            else:
                left_out.append(relative)
    return files, left_out


@contextlib.contextmanager
def _opened(root: str, batch: list[tuple[str, os.stat_result]]) -> Iterator[list[str]]:
    """Open each planned file without following links; yield ``/proc/self/fd`` paths."""
    real_root = os.path.realpath(root)
    descriptors: list[int] = []
    try:
        for relative, planned in batch:
            path = os.path.join(root, relative)
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            descriptors.append(fd)
            opened = os.fstat(fd)
            real = os.readlink(f"/proc/self/fd/{fd}")
            same = (opened.st_dev, opened.st_ino) == (planned.st_dev, planned.st_ino)
            if not (S_ISREG(opened.st_mode) and same and real.startswith(real_root + "/")):
                raise StorageError(f"{relative} changed while it was being stored")
        yield [f"/proc/self/fd/{fd}" for fd in descriptors]
    finally:
        for fd in descriptors:
            os.close(fd)


class FsspecStore:
    """A ``DataStore`` rooted at ``root`` (``bucket`` or ``bucket/prefix`` for S3, a
    directory for a local filesystem) of an fsspec filesystem."""

    def __init__(
        self,
        fs: AbstractFileSystem,
        root: str,
        *,
        url: str | None = None,
        translate: Translate = _default_translate,
        progress_interval_s: float = PROGRESS_INTERVAL_S,
        anchor: str | None = None,
    ) -> None:
        self.fs = fs
        self.root = root.rstrip("/") or "/"
        # What must exist for the store to exist (an S3 bucket): a prefix under it that
        # holds nothing yet is simply empty.
        self.anchor = anchor or self.root
        self._url = url or self.root
        self._translate = translate
        self._interval = progress_interval_s

    @property
    def url(self) -> str:
        return self._url

    def path(self, key: str = "") -> str:
        """The filesystem path of ``key`` under the root."""
        key = key.strip("/")
        return posixpath.join(self.root, key) if key else self.root

    @contextlib.contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        try:
            yield
        except StorageError:
            raise
        except Exception as exc:
            translated = self._translate(exc)
            if translated is None:
                translated = StorageError(f"{type(exc).__name__}: {exc}")
            raise type(translated)(f"{doing} {self._url}: {translated}") from None

    # -- reading ------------------------------------------------------------------------

    def check_readable(self, prefix: str = "") -> None:
        with self._errors("cannot list"):
            self.fs.invalidate_cache()
            self.fs.ls(self.path(prefix), detail=False, refresh=True)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        base = self.path(prefix)
        with self._errors("cannot list"):
            self.fs.invalidate_cache()
            found: dict[str, dict[str, Any]] = self.fs.find(base, detail=True)
            if not found and not self.fs.exists(self.anchor):
                raise FileNotFoundError(self.anchor)
        stripped = self.fs._strip_protocol(base).rstrip("/")
        objects = []
        for path, info in sorted(found.items()):
            if info.get("type") == "directory" or path.endswith("/"):
                continue
            key = (
                path[len(stripped) :].lstrip("/") if path != stripped else posixpath.basename(path)
            )
            objects.append(
                ObjectInfo(key=key, size=int(info.get("size") or 0), modified=_modified(info))
            )
        return objects

    def download(
        self,
        prefix: str,
        local_dir: str,
        *,
        progress: Progress = NO_PROGRESS,
        should_stop: ShouldStop = NEVER_STOP,
        skip_existing: bool = True,
    ) -> TransferStats:
        objects = self.list(prefix)
        for obj in objects:
            if not _safe_key(obj.key):
                raise StorageError(f"{self._url}: key {obj.key!r} would land outside {local_dir}")
        stats = TransferStats(
            files_total=len(objects), bytes_total=sum(obj.size for obj in objects)
        )
        wanted: list[ObjectInfo] = []
        for obj in objects:
            target = os.path.join(local_dir, obj.key)
            if skip_existing and _same_local_file(target, obj.size, obj.modified):
                stats.files_skipped += 1
                stats.files_done += 1
                stats.bytes_done += obj.size
            else:
                wanted.append(obj)
        os.makedirs(local_dir, exist_ok=True)
        remote = [self.path(posixpath.join(prefix, obj.key)) for obj in wanted]
        local = [os.path.join(local_dir, obj.key) for obj in wanted]
        sizes = {
            self.fs._strip_protocol(path): obj.size
            for path, obj in zip(remote, wanted, strict=True)
        }
        for directory in sorted({os.path.dirname(path) for path in local}):
            os.makedirs(directory, exist_ok=True)
        callback = _Progress(stats, progress, should_stop, self._interval, sizes)
        callback.tick()
        # Each file lands under a name of its own first and is renamed when whole: a reader
        # (another learner staging the same data, a command already started) never sees a
        # file half written, and an interrupted transfer leaves no file that looks complete.
        partial = [_partial_name(path) for path in local]
        try:
            if wanted:
                with self._errors("cannot download from"):
                    self.fs.get(remote, partial, callback=callback)
            for obj, part, path in zip(wanted, partial, local, strict=True):
                if obj.modified is not None:
                    os.utime(part, (obj.modified, obj.modified), follow_symlinks=False)
                os.replace(part, path)
        finally:
            for part in partial:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(part)
        progress(stats)
        return stats

    # -- writing ------------------------------------------------------------------------

    def upload(
        self,
        local_dir: str,
        prefix: str,
        *,
        progress: Progress = NO_PROGRESS,
        should_stop: ShouldStop = NEVER_STOP,
        skip_existing: bool = False,
    ) -> TransferStats:
        try:
            files, _left_out = local_files(local_dir)
        except OSError as exc:
            raise StorageError(f"cannot read {local_dir}: {exc}") from None
        stats = TransferStats(
            files_total=len(files), bytes_total=sum(stat.st_size for _, stat in files)
        )
        existing: dict[str, ObjectInfo] = {}
        if skip_existing and files:
            with contextlib.suppress(StoreNotFound):
                existing = {obj.key: obj for obj in self.list(prefix)}
        wanted = []
        for relative, stat in files:
            there = existing.get(relative)
            if (
                there is not None
                and there.size == stat.st_size
                and there.modified is not None
                and there.modified >= stat.st_mtime
            ):
                stats.files_skipped += 1
                stats.files_done += 1
                stats.bytes_done += stat.st_size
            else:
                wanted.append((relative, stat))
        callback = _Progress(stats, progress, should_stop, self._interval)
        callback.tick()
        for start in range(0, len(wanted), UPLOAD_BATCH):
            batch = wanted[start : start + UPLOAD_BATCH]
            remote = [self.path(posixpath.join(prefix, relative)) for relative, _ in batch]
            try:
                with _opened(local_dir, batch) as sources, self._errors("cannot upload to"):
                    callback.sizes = {
                        source: stat.st_size
                        for source, (_, stat) in zip(sources, batch, strict=True)
                    }
                    self.fs.put(sources, remote, callback=callback)
            except OSError as exc:
                raise StorageError(f"cannot read {local_dir}: {exc}") from None
        progress(stats)
        return stats


def local_store(root: str) -> FsspecStore:
    """A store over a host directory (parent directories made as files arrive)."""
    from fsspec.implementations.local import LocalFileSystem

    return FsspecStore(LocalFileSystem(auto_mkdir=True), os.path.abspath(root))
