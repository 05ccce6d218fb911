"""``ffdl.storage.blobs``: the platform's archive as a local directory and as a bucket on a
real S3 server (moto on 127.0.0.1), and its in-memory double: whole objects in, the same
bytes out, prefixes deleted, and errors that name the store and never a secret."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ffdl.server.settings import Settings
from ffdl.storage.base import StorageError, StoreAccessDenied, StoreNotFound
from ffdl.storage.blobs import (
    BlobStore,
    DirectoryBlobStore,
    MemoryBlobStore,
    S3BlobStore,
    open_blob_store,
)
from tests.s3server import S3Server, s3_server


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with s3_server() as server:
        server.make_bucket("archive")
        yield server


@pytest.fixture(params=["directory", "s3", "memory"])
def blobs(request: pytest.FixtureRequest, tmp_path: Path) -> BlobStore:
    if request.param == "directory":
        return open_blob_store(f"file://{tmp_path / 'archive'}", {})
    if request.param == "s3":
        s3: S3Server = request.getfixturevalue("s3")
        return open_blob_store(f"s3://archive/{tmp_path.name}", s3.connection())
    return MemoryBlobStore()


def test_objects_round_trip_and_prefixes_delete(blobs: BlobStore) -> None:
    blobs.put("records/job-1/log-1.gz", b"\x00one")
    blobs.put("records/job-1/log-2.gz", b"two" * 10_000)
    blobs.put("records/job-10/log-1.gz", b"other job")
    assert blobs.get("records/job-1/log-1.gz") == b"\x00one"
    assert blobs.get("records/job-1/log-2.gz") == b"two" * 10_000
    blobs.put("records/job-1/log-1.gz", b"rewritten")
    assert blobs.get("records/job-1/log-1.gz") == b"rewritten"

    blobs.delete("records/job-1")
    with pytest.raises(StoreNotFound, match="no such object"):
        blobs.get("records/job-1/log-1.gz")
    # A prefix is a whole path segment: job-10 is not under job-1.
    assert blobs.get("records/job-10/log-1.gz") == b"other job"
    blobs.delete("records/never-written")


@pytest.mark.parametrize("key", ["", "/", "records/../secret", "./x"])
def test_keys_that_leave_the_root_are_refused(blobs: BlobStore, key: str) -> None:
    with pytest.raises(ValueError, match="not a usable object key"):
        blobs.put(key, b"x")


def test_a_directory_store_writes_whole_files_only(tmp_path: Path) -> None:
    blobs = DirectoryBlobStore(tmp_path / "archive")
    blobs.put("a/b.gz", b"done")
    assert [p.name for p in (tmp_path / "archive" / "a").iterdir()] == ["b.gz"]


def test_refused_credentials_name_the_store_not_the_secret(s3: S3Server) -> None:
    blobs = open_blob_store("s3://archive/x", s3.connection(password="not-the-secret"))
    assert isinstance(blobs, S3BlobStore)
    with pytest.raises(StoreAccessDenied) as refused:
        blobs.put("records/a.gz", b"x")
    assert "s3://archive/x" in str(refused.value)
    assert "not-the-secret" not in str(refused.value)


def test_an_unwritable_directory_is_a_storage_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(StorageError, match=r"writing a\.gz to"):
        DirectoryBlobStore(tmp_path / "file").put("a.gz", b"x")


@pytest.mark.parametrize("url", ["ftp://host/x", "s3://", "http://example.com/archive"])
def test_settings_refuse_an_archive_store_they_cannot_open(tmp_path: Path, url: str) -> None:
    with pytest.raises(ValueError, match="archive_store must be a directory, file:///DIR or s3"):
        Settings(home=tmp_path, archive_store=url)


def test_settings_refuse_retention_without_a_positive_age(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="archive_records_after_h"):
        Settings(home=tmp_path, archive_records_after_h=0)
