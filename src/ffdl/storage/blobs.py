"""Whole objects by key in a local directory or an S3 bucket: the platform's own archive.

Unlike a ``DataStore`` (a user's training data and results, moved as directory trees), a
``BlobStore`` keeps the objects the platform writes for itself and reads back one at a time:
``put`` a key's bytes, ``get`` them, ``delete`` everything under a prefix. Errors are the
``StorageError`` family, with the store's URL and never a credential in their messages.
``MemoryBlobStore`` is its test double.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import shutil
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import SplitResult, urlsplit

from ffdl.storage.base import StorageError, StoreNotFound
from ffdl.storage.connection import S3Connection
from ffdl.storage.s3 import TRANSFER_TIMEOUTS, s3_filesystem, translate_s3_error


class BlobStore(Protocol):
    @property
    def url(self) -> str: ...

    def put(self, key: str, data: bytes) -> None:
        """Write ``data`` at ``key`` whole (a reader never sees part of it)."""
        ...

    def get(self, key: str) -> bytes:
        """The bytes at ``key``; ``StoreNotFound`` when there are none."""
        ...

    def delete(self, prefix: str) -> None:
        """Remove every object under ``prefix``; nothing there is not an error."""
        ...


def _clean_key(key: str) -> str:
    parts = [p for p in key.split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        raise ValueError(f"not a usable object key: {key!r}")
    return "/".join(parts)


class DirectoryBlobStore:
    """Objects as files under a local directory; a ``put`` writes a temporary file and
    renames it into place."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def url(self) -> str:
        return str(self.root)

    def _path(self, key: str) -> Path:
        return self.root / _clean_key(key)

    @contextlib.contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        try:
            yield
        except FileNotFoundError:
            raise StoreNotFound(f"{doing} {self.url}: no such object") from None
        except OSError as exc:
            raise StorageError(f"{doing} {self.url}: {exc.strerror or exc}") from None

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        with self._errors(f"writing {key} to"):
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
            partial.write_bytes(data)
            os.replace(partial, path)

    def get(self, key: str) -> bytes:
        with self._errors(f"reading {key} from"):
            return self._path(key).read_bytes()

    def delete(self, prefix: str) -> None:
        path = self._path(prefix)
        with self._errors(f"deleting {prefix} from"):
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)


class S3BlobStore:
    """Objects in an S3 bucket (under an optional prefix), through s3fs."""

    def __init__(self, connection: S3Connection, root: str, *, fs: Any = None) -> None:
        self.root = root.strip("/")
        self._connection = connection
        self._fs = fs
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"s3://{self.root}"

    def _filesystem(self) -> Any:
        with self._lock:
            if self._fs is None:
                self._fs = s3_filesystem(self._connection, TRANSFER_TIMEOUTS)
            return self._fs

    def _path(self, key: str) -> str:
        return posixpath.join(self.root, _clean_key(key))

    @contextlib.contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        try:
            yield
        except StorageError:
            raise
        except FileNotFoundError:
            raise StoreNotFound(f"{doing} {self.url}: no such object") from None
        except Exception as exc:
            translated = translate_s3_error(exc) or StorageError(type(exc).__name__)
            raise type(translated)(f"{doing} {self.url}: {translated}") from None

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        with self._errors(f"writing {key} to"):
            self._filesystem().pipe_file(path, data)

    def get(self, key: str) -> bytes:
        path = self._path(key)
        with self._errors(f"reading {key} from"):
            return bytes(self._filesystem().cat_file(path))

    def delete(self, prefix: str) -> None:
        fs = self._filesystem()
        path = self._path(prefix)
        with self._errors(f"deleting {prefix} from"):
            found = fs.find(path)
            if found:
                fs.rm(found)


class MemoryBlobStore:
    """A ``BlobStore`` in a dictionary, for tests of what uses one."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return "memory://"

    def put(self, key: str, data: bytes) -> None:
        with self._lock:
            self.objects[_clean_key(key)] = bytes(data)

    def get(self, key: str) -> bytes:
        with self._lock:
            try:
                return self.objects[_clean_key(key)]
            except KeyError:
                raise StoreNotFound(f"reading {key} from memory://: no such object") from None

    def delete(self, prefix: str) -> None:
        prefix = _clean_key(prefix)
        with self._lock:
            for key in [k for k in self.objects if k == prefix or k.startswith(prefix + "/")]:
                del self.objects[key]


def check_blob_url(url: str, name: str = "a store URL") -> SplitResult:
    """``url``'s parts when it names a store ``open_blob_store`` opens: a directory,
    ``file:///DIR`` or ``s3://BUCKET[/PREFIX]``; a ValueError naming it as ``name`` if not."""
    parts = urlsplit(url)
    if parts.scheme not in ("", "file", "s3") or (parts.scheme == "s3" and not parts.netloc):
        raise ValueError(
            f"{name} must be a directory, file:///DIR or s3://BUCKET[/PREFIX], got {url!r}"
        )
    return parts


def open_blob_store(url: str, options: Mapping[str, str]) -> BlobStore:
    """The store ``url`` names (``check_blob_url``), with S3 connection fields in
    ``options``: endpoint, access_key, secret_key, region."""
    parts = check_blob_url(url)
    if parts.scheme == "s3":
        return S3BlobStore(S3Connection.from_fields(options), f"{parts.netloc}{parts.path}")
    return DirectoryBlobStore(Path(parts.path if parts.scheme else url).expanduser())
