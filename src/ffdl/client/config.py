"""Resolving which ffdl server the client talks to, and with which token.

Precedence, highest first: explicit ``--url``/``--token`` options, ``FFDL_URL``/``FFDL_TOKEN``,
the ``client.json`` named by ``FFDL_CONFIG``, ``<home>/client.json``. Each of URL and token is
resolved on its own, so ``FFDL_TOKEN`` alone works against the default URL.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ffdl.client.settings import ClientSettings
from ffdl.core.errors import FfdlError

DEFAULT_URL = "http://127.0.0.1:8080"
NO_SERVER_MESSAGE = (
    "no ffdl server configured: start one with `ffdl up` or set FFDL_URL and FFDL_TOKEN"
)


class ConfigError(FfdlError):
    """The client configuration is missing or unreadable."""

    default_code = "CONFIG"


@dataclass(frozen=True, slots=True)
class ClientConfig:
    url: str
    token: str | None


def read_client_file(path: Path) -> dict[str, str]:
    """The ``url`` and ``token`` of a ``client.json``; unknown keys are ignored."""
    try:
        loaded: Any = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"client config {path} does not exist") from exc
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read client config {path}: {exc}") from exc
    if not isinstance(loaded, dict):
        raise ConfigError(f"client config {path} must be a JSON object")
    values: dict[str, str] = {}
    for key in ("url", "token"):
        value = loaded.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise ConfigError(f"client config {path}: {key!r} must be a string")
        if value:
            values[key] = value
    return values


def _file_values(settings: ClientSettings) -> dict[str, str] | None:
    """Values of the config file in effect, or None when there is none."""
    if settings.config is not None:
        # An explicitly named file must exist: silently ignoring it would hide a typo.
        return read_client_file(settings.config.expanduser())
    home_file = settings.client_file
    if home_file.is_file():
        return read_client_file(home_file)
    return None


def resolve_client_config(
    url: str | None = None,
    token: str | None = None,
    settings: ClientSettings | None = None,
) -> ClientConfig:
    """The server URL and token to use; raises ``ConfigError`` when nothing is configured."""
    settings = settings if settings is not None else ClientSettings()
    resolved_url = url or settings.url
    resolved_token = token or settings.token
    if resolved_url and resolved_token:
        return ClientConfig(url=resolved_url.rstrip("/"), token=resolved_token)
    from_file = _file_values(settings)
    if from_file is None and not resolved_url and not resolved_token:
        raise ConfigError(NO_SERVER_MESSAGE)
    from_file = from_file or {}
    resolved_url = resolved_url or from_file.get("url") or DEFAULT_URL
    resolved_token = resolved_token or from_file.get("token")
    return ClientConfig(url=resolved_url.rstrip("/"), token=resolved_token)
