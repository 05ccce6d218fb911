"""S3-compatible stores (FfDL's ``s3_datastore`` and ``mount_cos``) through s3fs.

``s3_store`` builds an ``FsspecStore`` over a private ``s3fs.S3FileSystem`` (never s3fs's
shared instance cache, so credentials live only as long as the store) from an
``S3Connection``, with timeouts chosen by the caller: ``CHECK_TIMEOUTS`` for the quick
probe at submit, ``TRANSFER_TIMEOUTS`` for staging. ``translate_s3_error`` turns what
boto/s3fs raise into the ``StorageError`` family with a reason a user can act on (refused
credentials, missing bucket, unreachable endpoint), built from the S3 error code only, so a
server's message can never carry anything into a log.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ffdl.storage.base import (
    StorageError,
    StoreAccessDenied,
    StoreNotFound,
    StoreUnreachable,
)
from ffdl.storage.connection import S3Connection
from ffdl.storage.fsspec_store import FsspecStore

if TYPE_CHECKING:
    from s3fs import S3FileSystem

DEFAULT_REGION = "us-east-1"
_DENIED = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "ExpiredToken",
        "Forbidden",
        "InvalidAccessKeyId",
        "InvalidToken",
        "SignatureDoesNotMatch",
        "403",
        "401",
    }
)
_MISSING = frozenset({"NoSuchBucket", "NoSuchKey", "NotFound", "404"})
_UNREACHABLE_ERRNOS = frozenset(
    {errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ETIMEDOUT}
)


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect_s: float
    read_s: float
    attempts: int


CHECK_TIMEOUTS = Timeouts(connect_s=3.0, read_s=5.0, attempts=1)
TRANSFER_TIMEOUTS = Timeouts(connect_s=10.0, read_s=60.0, attempts=5)


def s3_filesystem(connection: S3Connection, timeouts: Timeouts = TRANSFER_TIMEOUTS) -> S3FileSystem:
    """A private s3fs filesystem for ``connection`` (imported here: s3fs is slow to load)."""
    from s3fs import S3FileSystem

    config: dict[str, Any] = {
        "connect_timeout": timeouts.connect_s,
        "read_timeout": timeouts.read_s,
        "retries": {"max_attempts": timeouts.attempts, "mode": "standard"},
    }
    if connection.endpoint and "amazonaws.com" not in connection.endpoint:
        # S3-compatible stores (MinIO, COS, Ceph) are addressed by path: their host names
        # rarely have a wildcard DNS entry for each bucket.
        config["s3"] = {"addressing_style": "path"}
    fs = S3FileSystem(
        key=connection.access_key,
        secret=connection.secret_key,
        endpoint_url=connection.endpoint or None,
        client_kwargs={"region_name": connection.region or DEFAULT_REGION},
        config_kwargs=config,
        skip_instance_cache=True,
        use_listings_cache=False,
    )
    # s3fs retries on its own too (timeouts included): as often as botocore, no more.
    fs.retries = max(1, timeouts.attempts)
    return fs


def s3_store(
    connection: S3Connection,
    root: str,
    timeouts: Timeouts = TRANSFER_TIMEOUTS,
    *,
    fs: S3FileSystem | None = None,
) -> FsspecStore:
    """The store at ``root`` (``bucket`` or ``bucket/prefix``) of an S3 endpoint; ``fs``
    shares one filesystem (one connection pool) between stores of the same endpoint."""
    root = root.strip("/")
    return FsspecStore(
        fs if fs is not None else s3_filesystem(connection, timeouts),
        root,
        url=f"s3://{root}",
        translate=translate_s3_error,
        anchor=root.split("/", 1)[0],
    )


def _client_error_code(error: BaseException) -> str | None:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        response = getattr(current, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            if code:
                return str(code)
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status:
                return str(status)
        current = current.__cause__ or current.__context__
    return None


def _is_unreachable(error: BaseException) -> bool:
    names = {"EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError"}
    names |= {"ConnectionClosedError", "ClientConnectorError", "ServerDisconnectedError"}
    current: BaseException | None = error
    seen: set[int] = set()
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if type(current).__name__ in names or isinstance(current, ConnectionError | TimeoutError):
            return True
        if isinstance(current, OSError) and current.errno in _UNREACHABLE_ERRNOS:
            return True
        current = current.__cause__ or current.__context__
    return False


def translate_s3_error(error: BaseException) -> StorageError | None:
    """The ``StorageError`` for what s3fs or botocore raised (None: not a store error)."""
    code = _client_error_code(error)
    if code in _DENIED:
        return StoreAccessDenied(f"the store refused the credentials or the operation ({code})")
    if code in _MISSING:
        return StoreNotFound(f"the bucket or key does not exist ({code})")
    if _is_unreachable(error):
        return StoreUnreachable("the endpoint cannot be reached (refused, unknown or timed out)")
    if isinstance(error, FileNotFoundError):
        return StoreNotFound("the bucket or key does not exist")
    if isinstance(error, PermissionError):
        return StoreAccessDenied("the store refused the credentials or the operation")
    if code is not None:
        return StorageError(f"the store answered {code}")
    return None
