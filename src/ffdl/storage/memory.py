"""A ``DataStore`` held in memory, for tests: the real ``FsspecStore`` over a private
fsspec memory filesystem, so code under test runs the same transfer paths it runs on S3."""

from __future__ import annotations

from typing import Any

from fsspec.implementations.memory import MemoryFileSystem

from ffdl.storage.fsspec_store import FsspecStore


class _PrivateMemoryFileSystem(MemoryFileSystem):  # type: ignore[misc]
    # fsspec's memory filesystem keeps one store per class: each instance here gets its own.
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.store: dict[str, Any] = {}
        self.pseudo_dirs = [""]


def memory_store(root: str = "bucket") -> FsspecStore:
    """An empty in-memory store whose root (``root``) already exists."""
    fs = _PrivateMemoryFileSystem(skip_instance_cache=True)
    fs.mkdir(f"/{root.strip('/')}")
    return FsspecStore(fs, f"/{root.strip('/')}", url=f"memory://{root.strip('/')}")
