"""``ffdl.storage``'s store against a real S3 server (moto on 127.0.0.1) and its in-memory
double: listing, downloads that skip what is already there, uploads that never follow a
link, progress, stop requests, and errors that say why without a secret."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ffdl.storage.base import (
    DataStore,
    StorageError,
    StoreAccessDenied,
    StoreNotFound,
    StoreStopped,
    StoreUnreachable,
    TransferStats,
)
from ffdl.storage.connection import S3Connection
from ffdl.storage.fsspec_store import local_store
from ffdl.storage.memory import memory_store
from ffdl.storage.s3 import CHECK_TIMEOUTS, s3_store
from tests.s3server import S3Server, s3_server

FILES = {
    "train/a.csv": b"1,2,3\n" * 1000,
    "train/deep/b.bin": os.urandom(300_000),
    "labels.txt": b"cat\ndog\n",
}


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with s3_server() as server:
        yield server


def _connection(s3: S3Server, **changes: str) -> S3Connection:
    fields = {"access_key": s3.access_key, "secret_key": s3.secret_key, "endpoint": s3.endpoint}
    fields.update(changes)
    return S3Connection(
        access_key=fields["access_key"],
        secret_key=fields["secret_key"],
        endpoint=fields["endpoint"],
    )


@pytest.fixture(params=["s3", "memory", "local"])
def store(request: pytest.FixtureRequest, s3: S3Server, tmp_path: Path) -> DataStore:
    """A store holding ``FILES``: a fresh bucket on the S3 server, the memory double, or a
    directory through fsspec's local filesystem."""
    if request.param == "local":
        root = tmp_path / "local-store"
        for key, data in FILES.items():
            (root / key).parent.mkdir(parents=True, exist_ok=True)
            (root / key).write_bytes(data)
        return local_store(str(root))
    if request.param == "memory":
        double = memory_store("data")
        for key, data in FILES.items():
            double.fs.pipe(double.path(key), data)
        return double
    bucket = f"data-{request.node.name.split('[')[0].replace('_', '-')[:40]}".lower()
    s3.make_bucket(bucket, FILES)
    return s3_store(_connection(s3), bucket)


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def test_the_server_listens_on_loopback_only(s3: S3Server) -> None:
    assert s3.endpoint.startswith("http://127.0.0.1:")


def test_list_gives_every_file_with_its_size(store: DataStore) -> None:
    listed = {obj.key: obj.size for obj in store.list()}
    assert listed == {key: len(data) for key, data in FILES.items()}
    assert {obj.key for obj in store.list("train")} == {"a.csv", "deep/b.bin"}


def test_download_copies_the_tree_and_reports_bytes_and_files(
    store: DataStore, tmp_path: Path
) -> None:
    seen: list[TransferStats] = []
    stats = store.download(
        "", str(tmp_path / "data"), progress=lambda s: seen.append(TransferStats(**_fields(s)))
    )
    assert _tree(tmp_path / "data") == FILES
    total = sum(len(data) for data in FILES.values())
    assert (stats.files_total, stats.files_done, stats.bytes_total, stats.bytes_done) == (
        3,
        3,
        total,
        total,
    )
    assert seen and seen[-1].bytes_done == total and seen[-1].files_done == 3


def _fields(stats: TransferStats) -> dict[str, int]:
    return {name: getattr(stats, name) for name in TransferStats.__slots__}


def test_a_later_download_skips_what_is_already_there(store: DataStore, tmp_path: Path) -> None:
    target = tmp_path / "data"
    store.download("", str(target))
    changed = target / "labels.txt"
    changed.write_bytes(b"overwritten by hand")
    again = store.download("", str(target))
    assert again.files_skipped == 2
    assert changed.read_bytes() == FILES["labels.txt"]


def test_a_stop_request_ends_a_download(store: DataStore, tmp_path: Path) -> None:
    with pytest.raises(StoreStopped):
        store.download("", str(tmp_path / "data"), should_stop=lambda: True)


def test_upload_sends_regular_files_and_never_follows_links(
    store: DataStore, tmp_path: Path
) -> None:
    results = tmp_path / "results"
    (results / "model").mkdir(parents=True)
    (results / "model" / "weights.pt").write_bytes(b"w" * 5000)
    (results / "summary.json").write_text("{}")
    secret = tmp_path / "secret.txt"
    secret.write_text("host file")
    (results / "leak.txt").symlink_to(secret)
    (results / "leakdir").symlink_to(tmp_path)
    # Written a while ago: a store may keep modification times to the second only.
    for path in (results / "model" / "weights.pt", results / "summary.json"):
        os.utime(path, (time.time() - 60, time.time() - 60))
    stats = store.upload(str(results), "training-1")
    assert stats.files_done == 2
    listed = {obj.key: obj.size for obj in store.list("training-1")}
    assert listed == {"model/weights.pt": 5000, "summary.json": 2}
    again = store.upload(str(results), "training-1", skip_existing=True)
    assert again.files_skipped == 2


def test_download_of_a_missing_bucket_says_so(s3: S3Server, tmp_path: Path) -> None:
    with pytest.raises(StoreNotFound, match="does not exist"):
        s3_store(_connection(s3), "no-such-bucket").download("", str(tmp_path / "d"))


@pytest.mark.parametrize(
    "changes",
    [{"access_key": "AKIANOTAKEY000000000"}, {"secret_key": "wrong-secret-value"}],
    ids=["unknown key", "wrong secret"],
)
def test_refused_credentials_are_access_denied_without_the_secret(
    s3: S3Server, changes: dict[str, str]
) -> None:
    s3.make_bucket("guarded")
    store = s3_store(_connection(s3, **changes), "guarded", CHECK_TIMEOUTS)
    with pytest.raises(StoreAccessDenied, match="refused the credentials") as caught:
        store.check_readable()
    assert "wrong-secret-value" not in str(caught.value)
    assert s3.secret_key not in str(caught.value)


def test_an_endpoint_nobody_listens_on_is_unreachable(s3: S3Server) -> None:
    del s3
    dead = S3Connection(access_key="a", secret_key="b", endpoint="http://127.0.0.1:9")
    with pytest.raises(StoreUnreachable, match="cannot be reached"):
        s3_store(dead, "any", CHECK_TIMEOUTS).check_readable()


def test_every_store_error_is_a_storage_error() -> None:
    for kind in (StoreAccessDenied, StoreNotFound, StoreUnreachable, StoreStopped):
        assert issubclass(kind, StorageError)


def test_memory_doubles_do_not_share_files() -> None:
    first, second = memory_store("same"), memory_store("same")
    first.fs.pipe(first.path("x"), b"1")
    assert [obj.key for obj in first.list()] == ["x"]
    assert second.list() == []


def test_a_key_that_leads_out_of_the_target_is_refused(tmp_path: Path) -> None:
    double = memory_store("data")
    double.fs.pipe("/data/..x/../../escape", b"x")
    # The double keeps the key as written, as an S3 server does.
    assert any(".." in obj.key.split("/") for obj in double.list())
    with pytest.raises(StorageError, match="outside"):
        double.download("", str(tmp_path / "d"))
    assert not (tmp_path / "escape").exists()
