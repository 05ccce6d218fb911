"""The interface every data store offers the platform, and the errors it raises.

A ``DataStore`` is a tree of files under a root (an S3 bucket, a host directory, memory)
addressed by ``/``-separated keys relative to that root. The controller stages training data
with ``download``, stores results and logs with ``upload``, and syncs checkpoints with both;
the server checks access at submit with ``check_readable``. Implementations live beside this
module (``fsspec_store`` over any fsspec filesystem, ``s3`` for S3-compatible stores,
``memory`` as the test double).

Errors, all raised as ``StorageError`` subclasses, whose messages never contain a
credential::

    StorageError             anything else that went wrong talking to the store
    ├── StoreAccessDenied    the credentials were refused, or do not allow the operation
    ├── StoreNotFound        the bucket (or the key) does not exist
    ├── StoreUnreachable     the endpoint could not be reached in time
    └── StoreStopped         the caller asked to stop while a transfer was under way
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


class StorageError(Exception):
    """A data store operation failed; the message says why and never holds a secret."""


class StoreAccessDenied(StorageError):
    """The store refused the credentials or the operation."""


class StoreNotFound(StorageError):
    """The bucket or key does not exist."""


class StoreUnreachable(StorageError):
    """The store's endpoint did not answer (refused, unknown host, timed out)."""


class StoreStopped(StorageError):
    """A transfer was stopped because the caller asked."""


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One file of a store: its key relative to the listed prefix, its size and mtime."""

    key: str
    size: int
    # Seconds since the epoch; None when the store does not say.
    modified: float | None = None


@dataclass(slots=True)
class TransferStats:
    """Progress of one transfer; ``bytes_done`` grows while files stream."""

    files_total: int = 0
    bytes_total: int = 0
    files_done: int = 0
    bytes_done: int = 0
    files_skipped: int = 0


Progress = Callable[[TransferStats], None]
ShouldStop = Callable[[], bool]


def _never() -> bool:
    return False


def _ignore(stats: TransferStats) -> None:
    del stats


NEVER_STOP: ShouldStop = _never
NO_PROGRESS: Progress = _ignore


class DataStore(Protocol):
    """A store the platform reads training data from and writes results into."""

    @property
    def url(self) -> str:
        """Where the store's root is, for people (``s3://bucket``); never holds a secret."""
        ...

    def check_readable(self, prefix: str = "") -> None:
        """Raise ``StorageError`` unless the root exists and ``prefix`` in it can be listed."""
        ...

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every file under ``prefix`` (recursively), keys relative to ``prefix``."""
        ...

    def download(
        self,
        prefix: str,
        local_dir: str,
        *,
        progress: Progress = NO_PROGRESS,
        should_stop: ShouldStop = NEVER_STOP,
        skip_existing: bool = True,
    ) -> TransferStats:
        """Copy every file under ``prefix`` into ``local_dir``, keeping relative paths.

        With ``skip_existing``, a local file of the same size whose modification time is the
        store's (as a previous download left it) is not fetched again.
        """
        ...

    def upload(
        self,
        local_dir: str,
        prefix: str,
        *,
        progress: Progress = NO_PROGRESS,
        should_stop: ShouldStop = NEVER_STOP,
        skip_existing: bool = False,
    ) -> TransferStats:
        """Copy the regular files of ``local_dir`` (links are never followed) under ``prefix``.

        With ``skip_existing``, a file the store already holds with the same size, written
        after the local file last changed, is not sent again (a store that keeps times to the
        second sends a file changed in the second of its last upload once more).
        """
        ...
