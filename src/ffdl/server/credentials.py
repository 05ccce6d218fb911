"""Data-store credentials at rest: sealed in the jobs table, opened only to deploy, erased
when the job ends.

A job's manifest is stored as JSON (``jobs.manifest``). Before it is written, every secret
in its data stores' ``connection`` (a value under a key naming a password, secret, key,
token or credential, and the password part of any URL) is replaced by ``fernet:<token>``:
Fernet (AES-128-CBC with HMAC-SHA256) under a key derived with HKDF from the platform
secret, so neither the database file nor a backup of it holds a usable credential, and the
key differs from the one that signs job tokens. ``set_job_status`` overwrites sealed values
with ``erased`` when a job reaches a terminal status: a finished job keeps no credential.
Responses show connections redacted (``ffdl.core.redact``), never sealed or opened.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from typing import Any

from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ffdl.core.errors import BadRequest
from ffdl.core.redact import is_secret_key, url_password_spans

SEALED_PREFIX = "fernet:"
ERASED = "erased"
# Changing this string changes the key: every sealed value would become unreadable.
_HKDF_INFO = b"ffdl data-store credentials v1"


class CredentialError(BadRequest):
    """A data store's credentials cannot be used (erased, or sealed under another secret)."""

    default_code = "C103"


def derive_fernet_key(platform_secret: bytes) -> bytes:
    """The Fernet key for credentials: HKDF-SHA256 of the platform secret, for this purpose
    only (job tokens are an HMAC under the secret itself, so the two never coincide)."""
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_HKDF_INFO).derive(
        platform_secret
    )
    return base64.urlsafe_b64encode(derived)


def is_sealed(value: str) -> bool:
    return value.startswith(SEALED_PREFIX)


class CredentialVault:
    """Seals and opens connection secrets under the platform's credential key."""

    def __init__(self, platform_secret: bytes) -> None:
        self._fernet = Fernet(derive_fernet_key(platform_secret))

    def seal(self, text: str) -> str:
        if not text or is_sealed(text) or text == ERASED:
            return text
        return SEALED_PREFIX + self._fernet.encrypt(text.encode("utf-8")).decode("ascii")

    def open(self, sealed: str) -> str:
        if sealed == ERASED:
            raise CredentialError("the data store's credentials were erased when the job ended")
        if not is_sealed(sealed):
            return sealed
        try:
            return self._fernet.decrypt(sealed[len(SEALED_PREFIX) :]).decode("utf-8")
        except (InvalidToken, UnicodeDecodeError):
            raise CredentialError(
                "the data store's credentials cannot be decrypted (was the platform secret "
                "replaced?)"
            ) from None

    def seal_connection(self, connection: Mapping[str, str]) -> dict[str, str]:
        return _map_secrets(connection, self.seal)

    def open_connection(self, connection: Mapping[str, str]) -> dict[str, str]:
        return _map_secrets(connection, self.open)

    def seal_manifest(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """A copy of stored manifest data (``Manifest.to_dict``) with its secrets sealed."""
        sealed = _with_connections(manifest, self.seal_connection)
        return sealed if sealed is not None else dict(manifest)


def decrypt_connection(vault: CredentialVault, connection: Mapping[str, str]) -> dict[str, str]:
    """A stored data store ``connection`` with its secrets in clear, for deploying a job.

    Raises ``CredentialError`` (C103) when they were erased or cannot be decrypted.
    """
    return vault.open_connection(connection)


def erase_manifest_secrets(manifest: Mapping[str, Any]) -> dict[str, Any] | None:
    """A copy of stored manifest data with every secret overwritten by ``erased``; None when
    it holds no secret (nothing to write)."""
    return _with_connections(manifest, lambda connection: _map_secrets(connection, _erase))


def _erase(value: str) -> str:
    return ERASED if value else value


def _map_secrets(connection: Mapping[str, str], change: Callable[[str], str]) -> dict[str, str]:
    result: dict[str, str] = {}
    for key, value in connection.items():
        text = str(value)
        if is_secret_key(key):
            result[key] = change(text)
            continue
        # From the last URL back, so that earlier spans keep their offsets.
        for start, end in reversed(url_password_spans(text)):
            text = text[:start] + change(text[start:end]) + text[end:]
        result[key] = text
    return result


def _with_connections(
    manifest: Mapping[str, Any], change: Callable[[Mapping[str, str]], dict[str, str]]
) -> dict[str, Any] | None:
    stores = manifest.get("data_stores")
    if not isinstance(stores, list):
        return None
    changed = False
    new_stores: list[Any] = []
    for store in stores:
        connection = store.get("connection") if isinstance(store, Mapping) else None
        if not isinstance(connection, Mapping):
            new_stores.append(store)
            continue
        new_connection = change(connection)
        changed |= new_connection != dict(connection)
        new_stores.append({**store, "connection": new_connection})
    if not changed:
        return None
    return {**manifest, "data_stores": new_stores}
