"""The platform's checks of object stores: which endpoints it connects to, what the manifest
requires of an object store, and the submit-time probe of credentials and buckets (against a
real S3 server on 127.0.0.1)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ffdl.core.errors import ManifestError
from ffdl.core.manifest import parse_manifest
from ffdl.core.redact import is_secret_key
from ffdl.server.services.stores import (
    StoreError,
    allowed_endpoint,
    check_object_stores,
    object_store_access,
    results_url,
)
from ffdl.server.settings import Settings
from ffdl.storage.connection import S3Connection
from tests.s3server import S3Server, s3_server

FIELD = "data_stores[0].connection.auth_url"


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with s3_server() as server:
        server.make_bucket("training-data", {"x.csv": b"1\n"})
        server.make_bucket("results")
        yield server


def _settings(tmp_path: Path, **values: Any) -> Settings:
    return Settings(home=tmp_path, **values)


def _manifest(store_type: str = "mount_cos", **store: Any) -> str:
    data_store: dict[str, Any] = {
        "id": "cos",
        "type": store_type,
        "training_data": {"container": "training-data"},
        "training_results": {"container": "results"},
        "connection": {"auth_url": "http://127.0.0.1:1", "user_name": "u", "password": "p"},
    }
    data_store.update(store)
    return yaml.safe_dump(
        {"name": "job", "framework": {"name": "tensorflow", "command": "true"},
         "data_stores": [data_store]}
    )  # fmt: skip


# -- the manifest ---------------------------------------------------------------------------


@pytest.mark.parametrize("legacy", ["softlayer_objectstore", "bluemix_objectstore"])
def test_legacy_store_types_are_refused_by_name_with_what_to_use(legacy: str) -> None:
    with pytest.raises(ManifestError) as caught:
        parse_manifest(_manifest(legacy))
    assert caught.value.field == "data_stores[0].type"
    message = str(caught.value)
    assert legacy in message and "s3_datastore" in message and "mount_cos" in message


def test_an_unknown_type_names_what_the_user_wrote() -> None:
    with pytest.raises(ManifestError, match="got 'swift_thing'"):
        parse_manifest(_manifest("swift_thing"))


@pytest.mark.parametrize(
    ("missing", "field"),
    [
        ("user_name", "data_stores[0].connection.user_name"),
        ("password", "data_stores[0].connection.password"),
    ],
)
def test_an_object_store_needs_its_credentials(missing: str, field: str) -> None:
    connection = {"auth_url": "http://h", "user_name": "u", "password": "p"}
    del connection[missing]
    with pytest.raises(ManifestError) as caught:
        parse_manifest(_manifest(connection=connection))
    assert caught.value.field == field
    assert "mount_cos" in str(caught.value)


def test_an_object_store_needs_a_training_data_bucket() -> None:
    with pytest.raises(ManifestError) as caught:
        parse_manifest(_manifest("s3_datastore", training_data=None))
    assert caught.value.field == "data_stores[0].training_data"


def test_s3_names_for_the_connection_are_accepted() -> None:
    connection = {"endpoint": "http://h:9000", "access_key": "AK", "secret_key": "SK"}
    store = parse_manifest(_manifest(connection=connection)).data_stores[0]
    parsed = S3Connection.from_fields(store.connection)
    assert (parsed.endpoint, parsed.access_key, parsed.secret_key) == ("http://h:9000", "AK", "SK")
    assert "SK" not in repr(parsed)


def test_secret_connection_keys_are_the_ones_redacted() -> None:
    assert [is_secret_key(k) for k in ("password", "secret_key", "access_key")] == [True] * 3
    # FfDL's user_name is the key id, shown as an account name (FfDL printed it in its logs).
    assert not is_secret_key("user_name")
    assert not is_secret_key("auth_url") and not is_secret_key("region")


# -- endpoints ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "endpoint",
    [
        "http://127.0.0.1:9000",
        "http://localhost:9000",
        "http://169.254.169.254",
        "http://10.0.0.8:9000",
        "http://[::1]:9000",
    ],
)
def test_internal_endpoints_are_refused_unless_listed(tmp_path: Path, endpoint: str) -> None:
    with pytest.raises(StoreError) as caught:
        allowed_endpoint(_settings(tmp_path), endpoint, FIELD)
    assert caught.value.code == "C103"
    assert caught.value.field == FIELD
    assert "object_store_endpoints" in str(caught.value)


@pytest.mark.parametrize(
    "listed", ["http://127.0.0.1:9000", "127.0.0.1:9000", "127.0.0.1", "HTTP://127.0.0.1:9000/"]
)
def test_listed_endpoints_are_allowed(tmp_path: Path, listed: str) -> None:
    settings = _settings(tmp_path, object_store_endpoints=[listed])
    assert allowed_endpoint(settings, "http://127.0.0.1:9000", FIELD) == "http://127.0.0.1:9000"
    if listed != "127.0.0.1":
        with pytest.raises(StoreError):
            allowed_endpoint(settings, "http://127.0.0.1:9001", FIELD)


def test_public_endpoints_are_refused_when_the_operator_allows_listed_ones_only(
    tmp_path: Path,
) -> None:
    settings = _settings(tmp_path, object_store_public_endpoints=False)
    with pytest.raises(StoreError, match="not listed"):
        allowed_endpoint(settings, "https://8.8.8.8", FIELD)


def test_a_public_address_is_allowed_by_default(tmp_path: Path) -> None:
    # A literal address: no name is resolved, nothing is contacted.
    assert allowed_endpoint(_settings(tmp_path), "https://8.8.8.8", FIELD) == "https://8.8.8.8"


@pytest.mark.parametrize(
    ("endpoint", "words"),
    [
        ("ftp://8.8.8.8", r"http\(s\) URL"),
        ("http://user:hunter2@8.8.8.8", "must not carry credentials"),
    ],
)
def test_unusable_endpoint_urls_are_refused(tmp_path: Path, endpoint: str, words: str) -> None:
    with pytest.raises(StoreError, match=words) as caught:
        allowed_endpoint(_settings(tmp_path), endpoint, FIELD)
    assert "hunter2" not in str(caught.value)


def test_a_missing_endpoint_needs_the_operator_to_allow_aws(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="is required"):
        allowed_endpoint(_settings(tmp_path), None, FIELD)
    assert allowed_endpoint(_settings(tmp_path, object_store_aws_default=True), None, FIELD) is None


# -- the submit-time probe ------------------------------------------------------------------


def _probe(s3: S3Server, tmp_path: Path, **store: Any) -> None:
    settings = _settings(tmp_path, object_store_endpoints=[s3.endpoint])
    check_object_stores(settings, parse_manifest(_manifest(**store)))


def test_a_usable_store_passes(s3: S3Server, tmp_path: Path) -> None:
    _probe(s3, tmp_path, connection=s3.connection())


def test_refused_credentials_are_c103_naming_the_connection(s3: S3Server, tmp_path: Path) -> None:
    with pytest.raises(StoreError) as caught:
        _probe(s3, tmp_path, connection=s3.connection(password="not-the-password"))
    assert (caught.value.code, caught.value.field) == ("C103", "data_stores[0].connection")
    assert "refused the credentials" in str(caught.value)
    assert "not-the-password" not in str(caught.value)


@pytest.mark.parametrize("section", ["training_data", "training_results"])
def test_a_missing_bucket_is_c103_naming_it(s3: S3Server, tmp_path: Path, section: str) -> None:
    with pytest.raises(StoreError) as caught:
        _probe(s3, tmp_path, connection=s3.connection(), **{section: {"container": "nope"}})
    assert caught.value.field == f"data_stores[0].{section}.container"
    assert "bucket 'nope' does not exist" in str(caught.value)
    assert "nope" not in s3.buckets()


def test_an_unreachable_endpoint_is_c103(s3: S3Server, tmp_path: Path) -> None:
    settings = _settings(tmp_path, object_store_endpoints=["127.0.0.1:9"])
    manifest = parse_manifest(_manifest(connection=s3.connection(auth_url="http://127.0.0.1:9")))
    with pytest.raises(StoreError, match="cannot be reached") as caught:
        check_object_stores(settings, manifest)
    assert caught.value.field == FIELD


def test_a_learner_reaches_the_bucket_and_a_results_prefix_of_its_own(
    s3: S3Server, tmp_path: Path
) -> None:
    settings = _settings(tmp_path, object_store_endpoints=[s3.endpoint])
    manifest = parse_manifest(_manifest(connection=s3.connection()))
    access = object_store_access(settings, manifest, "training-abc")
    assert access is not None
    assert (access.data_root, access.results_root) == ("training-data", "results/training-abc")
    assert results_url(manifest, "training-abc") == "s3://results/training-abc"
    assert access.connection.to_fields()["secret_key"] == s3.secret_key


# -- endpoint aliases -----------------------------------------------------------------------


def test_an_aliased_endpoint_is_replaced_then_checked_against_the_allow_list(
    tmp_path: Path,
) -> None:
    aliases = {"http://s3.default.svc.cluster.local/": "http://127.0.0.1:9000"}
    listed = _settings(
        tmp_path,
        object_store_endpoint_aliases=aliases,
        object_store_endpoints=["http://127.0.0.1:9000"],
    )
    named = "HTTP://S3.default.svc.cluster.local"
    assert allowed_endpoint(listed, named, FIELD) == "http://127.0.0.1:9000"
    # The alias is not an allowance: the endpoint it leads to must be allowed too.
    unlisted = _settings(tmp_path, object_store_endpoint_aliases=aliases)
    with pytest.raises(StoreError, match=re.escape("127.0.0.1")):
        allowed_endpoint(unlisted, named, FIELD)
    # Other endpoints are left as they are.
    with pytest.raises(StoreError, match=re.escape("10.1.2.3")):
        allowed_endpoint(listed, "http://10.1.2.3:9000", FIELD)


def test_an_alias_keyed_as_the_manifest_writes_the_endpoint_matches_either_way(
    tmp_path: Path,
) -> None:
    # FfDL's tf-model/manifest-for-test.yml says `auth_url: test`.
    settings = _settings(
        tmp_path,
        object_store_endpoint_aliases={"test": "http://127.0.0.1:9000"},
        object_store_endpoints=["http://127.0.0.1:9000"],
    )
    assert allowed_endpoint(settings, "test", FIELD) == "http://127.0.0.1:9000"
    assert allowed_endpoint(settings, "https://test/", FIELD) == "http://127.0.0.1:9000"
    keyed_as_url = _settings(
        tmp_path,
        object_store_endpoint_aliases={"https://test": "http://127.0.0.1:9000"},
        object_store_endpoints=["http://127.0.0.1:9000"],
    )
    assert allowed_endpoint(keyed_as_url, "test", FIELD) == "http://127.0.0.1:9000"
    # A name no alias matches is refused, naming the aliases there are.
    with pytest.raises(StoreError) as caught:
        allowed_endpoint(settings, "http://10.1.2.3:9000", FIELD)
    assert "the aliases known are 'test'" in str(caught.value)


def test_a_placeholder_endpoint_is_refused_as_written_without_a_lookup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    looked_up: list[object] = []
    monkeypatch.setattr("socket.getaddrinfo", lambda *args, **kw: looked_up.append(args))
    placeholder = "<object storage's endpoint_url>"
    with pytest.raises(StoreError) as caught:
        allowed_endpoint(_settings(tmp_path), placeholder, FIELD)
    assert f"{placeholder!r} has no valid host name" in str(caught.value)
    assert looked_up == []
