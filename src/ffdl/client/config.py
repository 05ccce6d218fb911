"""Resolving which ffdl server the client talks to, and with which credentials.

Precedence, highest first, each of URL and credentials resolved on its own (so ``FFDL_TOKEN``
alone works against the default URL):

- URL: ``--url``, ``FFDL_URL``, FfDL's ``DLAAS_URL``, the config file's ``url``, the default;
- credentials: ``--token``, ``FFDL_TOKEN``, FfDL's ``DLAAS_USERNAME``/``DLAAS_PASSWORD`` (or
  ``user:password@`` in ``DLAAS_URL``, which wins over them as in FfDL's CLI) sent as HTTP
  Basic, the config file's ``token``.

The CA bundle that verifies an HTTPS server: ``FFDL_CA_BUNDLE``, else the config file's
``ca_bundle`` when its ``url`` is the one used (the server that wrote it named its CA), else
the system's trust store.

The config file is the one ``FFDL_CONFIG`` names, else ``<home>/client.json``. Its token
belongs to its own server: it is never sent to a ``DLAAS_URL``, which needs credentials of
its own. So FfDL users' scripts with ``DLAAS_*`` work unchanged even on a machine whose
``~/.ffdl/client.json`` points elsewhere.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import httpx

from ffdl.client.http import Client
from ffdl.client.settings import ClientSettings
from ffdl.core.errors import FfdlError
from ffdl.core.tls import TlsError

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
    # HTTP Basic credentials (FfDL's DLAAS_USERNAME/DLAAS_PASSWORD), used when no token is.
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    # The CA that verifies an HTTPS server (None: the system's trust store).
    ca_bundle: Path | None = None

    def auth(self) -> httpx.Auth | None:
        """The HTTP Basic auth of these credentials, when they are what the client sends."""
        if self.token or self.username is None or self.password is None:
            return None
        return httpx.BasicAuth(self.username, self.password)


@dataclass(frozen=True, slots=True)
class _Dlaas:
    """FfDL's ``DLAAS_*`` variables: a URL, and Basic credentials if both halves are set."""

    url: str | None
    username: str | None
    password: str | None

    @property
    def credentials(self) -> bool:
        return self.username is not None or self.password is not None


def _dlaas(settings: ClientSettings) -> _Dlaas:
    username, password = settings.dlaas_username, settings.dlaas_password
    url = settings.dlaas_url
    if url:
        if "://" not in url:
            url = "http://" + url  # FfDL's CLI took a URL without a scheme as http
        parts = urlsplit(url)
        if parts.username is not None:
            username = unquote(parts.username)
            password = unquote(parts.password or "")
            host = parts.netloc.rpartition("@")[2]
            url = urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    return _Dlaas(url=url, username=username, password=password)


def _basic(dlaas: _Dlaas) -> tuple[str, str]:
    if dlaas.username is None:
        raise ConfigError("DLAAS_PASSWORD is set but DLAAS_USERNAME is not: set both")
    if dlaas.password is None:
        raise ConfigError("DLAAS_USERNAME is set but DLAAS_PASSWORD is not: set both")
    return dlaas.username, dlaas.password


def read_client_file(path: Path) -> dict[str, str]:
    """The ``url``, ``token`` and ``ca_bundle`` of a ``client.json``; unknown keys are
    ignored."""
    try:
        loaded: Any = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"client config {path} does not exist") from exc
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read client config {path}: {exc}") from exc
    if not isinstance(loaded, dict):
        raise ConfigError(f"client config {path} must be a JSON object")
    values: dict[str, str] = {}
    for key in ("url", "token", "ca_bundle"):
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
    """The server URL, credentials and CA bundle to use; ``ConfigError`` when nothing is
    configured."""
    settings = settings if settings is not None else ClientSettings()
    config = _url_and_credentials(url, token, settings)
    if settings.ca_bundle is not None:
        return replace(config, ca_bundle=settings.ca_bundle.expanduser())
    from_file = _file_ca_bundle_source(settings) if config.url.startswith("https://") else None
    if from_file and from_file.get("ca_bundle") and _same_url(from_file.get("url"), config.url):
        return replace(config, ca_bundle=Path(from_file["ca_bundle"]).expanduser())
    return config


def _file_ca_bundle_source(settings: ClientSettings) -> dict[str, str] | None:
    """The config file's values when it can be read; its CA bundle is a convenience, so an
    unreadable file (never needed for the URL and credentials) is no error here."""
    try:
        return _file_values(settings)
    except ConfigError:
        return None


def _same_url(written: str | None, used: str) -> bool:
    return written is not None and written.rstrip("/") == used


def _url_and_credentials(
    url: str | None, token: str | None, settings: ClientSettings
) -> ClientConfig:
    dlaas = _dlaas(settings)
    resolved_url = url or settings.url
    resolved_token = token or settings.token
    if resolved_token is None and dlaas.credentials:
        username, password = _basic(dlaas)
        if not resolved_url and not dlaas.url:
            resolved_url = (_file_values(settings) or {}).get("url")
        return ClientConfig(
            url=(resolved_url or dlaas.url or DEFAULT_URL).rstrip("/"),
            token=None,
            username=username,
            password=password,
        )
    if not resolved_url and dlaas.url:
        if resolved_token is None:
            raise ConfigError(
                "DLAAS_URL is set but DLAAS_USERNAME and DLAAS_PASSWORD are not: set them "
                "(a user's name and the password an admin gave it), or FFDL_TOKEN"
            )
        return ClientConfig(url=dlaas.url.rstrip("/"), token=resolved_token)
    if resolved_url and resolved_token:
        return ClientConfig(url=resolved_url.rstrip("/"), token=resolved_token)
    from_file = _file_values(settings)
    if from_file is None and not resolved_url and not resolved_token:
        raise ConfigError(NO_SERVER_MESSAGE)
    from_file = from_file or {}
    resolved_url = resolved_url or from_file.get("url") or DEFAULT_URL
    resolved_token = resolved_token or from_file.get("token")
    return ClientConfig(url=resolved_url.rstrip("/"), token=resolved_token)


def client_for(config: ClientConfig, **options: Any) -> Client:
    """A ``Client`` for ``config``: its bearer token, or its HTTP Basic credentials."""
    try:
        return Client(
            config.url, config.token, auth=config.auth(), ca_bundle=config.ca_bundle, **options
        )
    except TlsError as exc:
        raise ConfigError(str(exc)) from None


def connect(url: str | None = None, token: str | None = None, **options: Any) -> Client:
    """A ``Client`` configured as the CLI's: options, ``FFDL_*``, ``DLAAS_*``, config file."""
    return client_for(resolve_client_config(url, token), **options)
