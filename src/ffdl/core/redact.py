"""Which data-store connection values are secrets, and how they are shown: as ``***``.

A connection key naming a password, secret, key, token or credential holds a secret; so does
the password part of a URL (``http://user:pw@host``) under any key. Every API response, log
line and event shows connections through ``redact_secrets`` or ``redact_url``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

REDACTED = "***"
_SECRET_MARKERS = ("password", "secret", "key", "token", "credential")
# scheme://user:password@host...: the password ends at the last '@' before the path.
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/?#@\s]*:)(?P<pw>[^/?#\s]*)@")


def is_secret_key(name: str) -> bool:
    """Whether a connection key names a secret (password, secret, key, token, credential)."""
    lowered = name.lower()
    return any(marker in lowered for marker in _SECRET_MARKERS)


def url_password_spans(text: str) -> list[tuple[int, int]]:
    """Start and end of each URL password in ``text``, in order."""
    return [
        (found.start("pw"), found.end("pw"))
        for found in _URL_PASSWORD.finditer(text)
        if found.group("pw")
    ]


def redact_url(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***``."""

    def hide(found: re.Match[str]) -> str:
        if not found.group("pw"):
            return found.group(0)
        return f"{found.group('head')}{REDACTED}@"

    return _URL_PASSWORD.sub(hide, text)


def redact_secrets(connection: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``connection`` with every secret value replaced by ``***``."""
    return {
        key: REDACTED if is_secret_key(key) else redact_url(str(value))
        for key, value in connection.items()
    }
