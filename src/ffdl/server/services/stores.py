"""Path-based data stores, confined to the host directories the operator allows.

A ``local`` or ``mount_volume`` store names a host directory (``connection.path``) that
learners' controllers, which run as root, read training data from and write results into.
Without a bound any user could stage ``/etc`` or write into ``/root``, so the directory must
lie under one of ``settings.allowed_store_paths`` (``store_paths`` in config.yaml, default
``HOME/stores``), after resolving every symbolic link. A container is a relative path inside
the store (the manifest refuses absolute paths and ``..``); resolved, it must stay under the
same allowed directory, so a symbolic link planted in the store cannot lead out of it.

Submit checks this once (``check_store_paths``); the lifecycle manager asks again at each
deploy through ``training_data_path`` and ``results_path``, since a link can appear after
submit. Every refusal is a ``StoreError``: HTTP 400, code C103, naming the field and path.

Object stores (``s3_datastore``, ``mount_cos``) are checked at submit as FfDL did
(``check_object_stores``): the credentials are accepted, the training-data bucket exists and
can be listed, so can the results bucket; each with a short timeout, outside any database
session. The server and the controllers connect to the endpoint a user names, so the endpoint
must be allowed (``allowed_endpoint``): public addresses by default, internal ones only when
the operator lists them in ``object_store_endpoints``. ``object_store_access`` gives the
lifecycle manager what a learner needs, with the endpoint checked again.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ffdl.core.errors import ManifestError
from ffdl.core.manifest import Container, DataStore, Manifest
from ffdl.core.redact import redact_url
from ffdl.learner.spec import ObjectLocation
from ffdl.server.credentials import CredentialVault, decrypt_connection
from ffdl.server.settings import Settings
from ffdl.storage.base import StorageError, StoreAccessDenied, StoreNotFound, StoreUnreachable
from ffdl.storage.connection import S3Connection

PATH_STORE_TYPES = frozenset({"local", "mount_volume"})


class StoreError(ManifestError):
    """A data store path the platform may not use (outside the allow-list, or leading out)."""

    default_code = "C103"


def check_store_paths(settings: Settings, manifest: Manifest) -> None:
    """Refuse any path-based store, or container in one, outside the allowed directories."""
    for index, store in enumerate(manifest.data_stores):
        if store.type not in PATH_STORE_TYPES:
            continue
        field = f"data_stores[{index}]"
        base, root = _store_root(settings, store, f"{field}.connection.path")
        for section, container in (
            ("training_data", store.training_data),
            ("training_results", store.training_results),
        ):
            if container is not None:
                _inside(base, container, root, f"{field}.{section}.container")


def training_data_path(settings: Settings, manifest: Manifest) -> Path | None:
    """The resolved host directory the job's training data is staged from, or None when the
    job's (first) data store has no training data or is not path-based.

    Raises ``StoreError`` (C103) when the path now lies outside the allowed directories.
    """
    store = manifest.data_store()
    if store is None or store.type not in PATH_STORE_TYPES or store.training_data is None:
        return None
    base, root = _store_root(settings, store, "data_stores[0].connection.path")
    return _inside(base, store.training_data, root, "data_stores[0].training_data.container")


def results_path(settings: Settings, manifest: Manifest, job_id: str) -> Path | None:
    """The resolved host directory the job's results are stored into
    (``<path>/<training_results.container>/<job_id>``), or None when the job's (first) data
    store has no results container or is not path-based.

    Raises ``StoreError`` (C103) when the path now lies outside the allowed directories.
    """
    store = manifest.data_store()
    if store is None or store.type not in PATH_STORE_TYPES or store.training_results is None:
        return None
    field = "data_stores[0].training_results.container"
    base, root = _store_root(settings, store, "data_stores[0].connection.path")
    container = _inside(base, store.training_results, root, field)
    target = _resolve(container / job_id, field)
    if not target.is_relative_to(root):
        raise StoreError(field, f"{job_id!r} in it leads out of the allowed store paths")
    return target


def _store_root(settings: Settings, store: DataStore, field: str) -> tuple[Path, Path]:
    """The store's resolved directory and the allowed directory it lies under."""
    raw = store.connection.get("path", "").strip()
    shown = redact_url(raw)
    if not raw.startswith("/"):
        raise StoreError(field, f"must be an absolute host path, got {shown!r}")
    if "\x00" in raw:
        raise StoreError(field, "must not contain NUL characters")
    allowed = settings.allowed_store_paths
    base = _resolve(Path(raw), field)
    for root in allowed:
        if base.is_relative_to(root):
            return base, root
    roots = ", ".join(str(root) for root in allowed)
    raise StoreError(
        field,
        f"{shown!r} is outside the allowed store paths ({roots}); an operator allows more "
        "with store_paths in config.yaml",
    )


def _inside(base: Path, container: Container, root: Path, field: str) -> Path:
    resolved = _resolve(base / container.container, field)
    if not resolved.is_relative_to(root):
        raise StoreError(field, f"{container.container!r} leads out of the allowed store paths")
    return resolved


def _resolve(path: Path, field: str) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symbolic link loop
        raise StoreError(field, f"cannot be resolved: {exc}") from None


# -- object stores ----------------------------------------------------------------------

# Labels of letters, digits, '-' (and '_', which internal names use), dot-separated.
_HOST_NAME = re.compile(
    r"(?=.{1,253}\.?$)[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
    r"(?:\.[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?)*\.?"
)
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True, slots=True)
class ObjectStoreAccess:
    """What a learner needs to reach a job's object store: the connection (secrets in clear,
    for the learner's root-only spec), the training data's ``bucket[/prefix]`` and where
    results go (``bucket[/prefix]/<training id>``), each None when the manifest has none."""

    type: str
    connection: S3Connection
    data_root: str | None
    results_root: str | None

    @property
    def results_url(self) -> str | None:
        return f"s3://{self.results_root}" if self.results_root else None


def allowed_endpoint(settings: Settings, endpoint: str | None, field: str) -> str | None:
    """The endpoint to connect to (None: AWS's default), or ``StoreError`` (C103) when this
    platform may not connect there."""
    if endpoint is None:
        if settings.object_store_aws_default:
            return None
        raise StoreError(
            field,
            "is required: give the store's S3 endpoint URL (this platform does not default "
            "to AWS; an operator allows that with object_store_aws_default)",
        )
    written = endpoint if "://" in endpoint else f"https://{endpoint}"
    url = _aliased(settings, endpoint, written)
    # Messages quote the endpoint as the manifest wrote it, and where an alias led.
    shown = redact_url(endpoint)
    if url != written:
        shown = f"{shown} (mapped to {redact_url(url)})"
    try:
        parts = urlsplit(url)
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme.lower(), 0)
    except ValueError:
        raise StoreError(field, f"is not a valid URL: {shown!r}") from None
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if scheme not in _DEFAULT_PORTS or not host:
        raise StoreError(field, f"must be an http(s) URL with a host, got {shown!r}")
    if not _is_host(host):
        raise StoreError(field, f"is not a valid URL: {shown!r} has no valid host name")
    if parts.username is not None or parts.password is not None:
        raise StoreError(field, "must not carry credentials; give them as user_name/password")
    if _listed(settings.object_store_endpoints, scheme, host, port):
        return url
    reason = _not_public(host, port) if settings.object_store_public_endpoints else "not listed"
    if reason is None:
        return url
    aliases = settings.object_store_endpoint_aliases
    known = (
        f"; the aliases known are {', '.join(repr(name) for name in aliases)}"
        if aliases and url == written
        else ""
    )
    raise StoreError(
        field,
        f"{shown!r} is not an endpoint this platform connects to ({reason}); an operator "
        f"allows it with object_store_endpoints in config.yaml{known}",
    )


def _aliased(settings: Settings, as_written: str, url: str) -> str:
    """The endpoint the operator maps the manifest's endpoint to
    (``object_store_endpoint_aliases``), or ``url`` itself. An alias key matches the
    endpoint as the manifest wrote it (``test``) or as a URL (``https://test``), either way
    round; a trailing slash and the case of scheme and host do not matter."""
    wanted = {_endpoint_key(as_written), _endpoint_key(url)}
    for named, used in settings.object_store_endpoint_aliases.items():
        as_url = named if "://" in named else f"https://{named}"
        if {_endpoint_key(named), _endpoint_key(as_url)} & wanted:
            return used
    return url


def _endpoint_key(url: str) -> str:
    text = url.strip().rstrip("/")
    scheme, separator, rest = text.partition("://")
    if not separator:
        return text.lower()
    host, slash, path = rest.partition("/")
    return f"{scheme.lower()}://{host.lower()}{slash}{path}"


def _is_host(host: str) -> bool:
    """Whether ``host`` is an IP address or a syntactically valid DNS name."""
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return _HOST_NAME.fullmatch(host) is not None


def _listed(entries: list[str], scheme: str, host: str, port: int) -> bool:
    for entry in entries:
        text = entry.strip().lower().rstrip("/")
        if "://" in text:
            try:
                listed = urlsplit(text)
                listed_port = listed.port or _DEFAULT_PORTS.get(listed.scheme, 0)
            except ValueError:
                continue
            if (listed.scheme, listed.hostname, listed_port) == (scheme, host, port):
                return True
        elif text.count(":") == 1:
            name, _, number = text.partition(":")
            if name == host and number == str(port):
                return True
        elif text == host:
            return True
    return False


def _not_public(host: str, port: int) -> str | None:
    """None when every address ``host`` resolves to is a public one; else why not."""
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return "its host cannot be resolved"
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if not address.is_global:
            return f"{host} resolves to the internal address {address}"
    return None


def _bucket_root(container: Container | None, suffix: str = "") -> str | None:
    if container is None:
        return None
    return "/".join(part for part in (container.container, suffix) if part)


def _connection(store: DataStore, opened: Mapping[str, str] | None = None) -> S3Connection:
    return S3Connection.from_fields(opened if opened is not None else store.connection)


def object_store_access(
    settings: Settings,
    manifest: Manifest,
    job_id: str,
    opened: Mapping[str, str] | None = None,
) -> ObjectStoreAccess | None:
    """The job's (first) store as a learner reaches it, or None when it is no object store.

    ``opened`` is the store's connection with its secrets in clear (the stored manifest holds
    them sealed). Raises ``StoreError`` (C103) when the endpoint is no longer allowed.
    """
    store = manifest.data_store()
    if store is None or not store.is_object_store:
        return None
    connection = _connection(store, opened)
    field = f"data_stores[0].connection.{S3Connection.endpoint_key(store.connection)}"
    endpoint = allowed_endpoint(settings, connection.endpoint, field)
    return ObjectStoreAccess(
        type=store.type,
        connection=S3Connection(
            access_key=connection.access_key,
            secret_key=connection.secret_key,
            endpoint=endpoint,
            region=connection.region,
        ),
        data_root=_bucket_root(store.training_data),
        results_root=_bucket_root(store.training_results, job_id),
    )


def results_url(manifest: Manifest, job_id: str) -> str | None:
    """Where an object store keeps the job's results (``s3://bucket/<training id>``)."""
    store = manifest.data_store()
    if store is None or not store.is_object_store:
        return None
    root = _bucket_root(store.training_results, job_id)
    return f"s3://{root}" if root else None


def learner_locations(
    settings: Settings, vault: CredentialVault, manifest: Manifest, job_id: str
) -> tuple[ObjectLocation | None, ObjectLocation | None]:
    """For a learner's spec: where its training data is and where results, logs and
    checkpoints go, when the job's store is an object store (else None, None).

    Opens the sealed credentials: ``CredentialError`` (C103) once they were erased;
    ``StoreError`` (C103) when the endpoint is no longer allowed.
    """
    store = manifest.data_store()
    if store is None or not store.is_object_store:
        return None, None
    access = object_store_access(
        settings, manifest, job_id, decrypt_connection(vault, store.connection)
    )
    if access is None:
        return None, None
    fields = access.connection.to_fields()
    data = ObjectLocation(access.data_root, dict(fields)) if access.data_root else None
    results = ObjectLocation(access.results_root, dict(fields)) if access.results_root else None
    return data, results


def check_object_stores(settings: Settings, manifest: Manifest) -> None:
    """Refuse (C103, with the reason) an object store this platform cannot use: endpoint not
    allowed or unreachable, credentials refused, a bucket missing or not readable."""
    from ffdl.storage.s3 import CHECK_TIMEOUTS, s3_filesystem, s3_store

    for index, store in enumerate(manifest.data_stores):
        if not store.is_object_store:
            continue
        prefix = f"data_stores[{index}]"
        connection = _connection(store)
        endpoint_field = f"{prefix}.connection.{S3Connection.endpoint_key(store.connection)}"
        endpoint = allowed_endpoint(settings, connection.endpoint, endpoint_field)
        connection = S3Connection(
            access_key=connection.access_key,
            secret_key=connection.secret_key,
            endpoint=endpoint,
            region=connection.region,
        )
        fs = s3_filesystem(connection, CHECK_TIMEOUTS)
        where = redact_url(endpoint or "AWS S3")
        for section, container in (
            ("training_data", store.training_data),
            ("training_results", store.training_results),
        ):
            if container is None:
                continue
            try:
                s3_store(connection, container.container, fs=fs).check_readable()
            except StoreAccessDenied:
                raise StoreError(
                    f"{prefix}.connection",
                    f"the store at {where} refused the credentials for bucket "
                    f"{container.container!r} (wrong user_name/password, or no access to it)",
                ) from None
            except StoreNotFound:
                raise StoreError(
                    f"{prefix}.{section}.container",
                    f"bucket {container.container!r} does not exist at {where}",
                ) from None
            except StoreUnreachable:
                raise StoreError(
                    endpoint_field, f"the endpoint {where} cannot be reached"
                ) from None
            except StorageError as exc:
                raise StoreError(
                    f"{prefix}.{section}.container",
                    f"bucket {container.container!r} at {where} cannot be used: {exc}",
                ) from None
