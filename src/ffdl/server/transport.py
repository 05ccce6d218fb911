"""How the API is reached: the TLS files checked before ``ffdl up`` serves, what uvicorn
and gunicorn are given to serve HTTPS, and the warning for credentials sent in clear text.

HTTP Basic passwords, API tokens and learners' job tokens cross the network with every
request. On a loopback address they never leave the host; on any other address over plain
HTTP anyone on the path can read them, so the server says so at start, on ``/health`` and
on the dashboard.
"""

from __future__ import annotations

import functools
import ipaddress
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ffdl.core.tls import check_server_certificate, read_ca_bundle
from ffdl.server.settings import Settings

PLAIN_HTTP_WARNING = (
    "credentials cross the network in clear text: this server listens on {host} over plain "
    "HTTP, and HTTP Basic passwords, API tokens and learners' job tokens are readable by "
    "anyone on the path; serve HTTPS with --tls-cert FILE --tls-key FILE"
)
PLAIN_ADVERTISE_WARNING = (
    "credentials cross the network in clear text: learners report to {url} over plain HTTP, "
    "and their job tokens and logs are readable by anyone on the path; serve HTTPS with "
    "--tls-cert FILE --tls-key FILE and advertise an https:// URL"
)


def check_transport(settings: Settings) -> None:
    """Refuse (``TlsError``, a ValueError naming the file and the reason) TLS files the
    server could not serve with or learners could not verify it by."""
    if settings.tls_cert is not None and settings.tls_key is not None:
        check_server_certificate(settings.tls_cert, settings.tls_key)
    if settings.ca_bundle is not None:
        read_ca_bundle(settings.ca_bundle)


def learner_ca_pem(settings: Settings) -> str | None:
    """The CA bundle's text, for learners verifying the server (they may not share its
    disk); None: they use their system's trust store. Read once per process, as the
    certificate is: a new CA takes a restart."""
    return None if settings.ca_bundle is None else _ca_text(settings.ca_bundle)


@functools.lru_cache(maxsize=4)
def _ca_text(path: Path) -> str:
    return read_ca_bundle(path)


def uvicorn_tls(settings: Settings) -> dict[str, Any]:
    """uvicorn's keyword arguments serving ``settings``' certificate (none for HTTP)."""
    if settings.tls_cert is None or settings.tls_key is None:
        return {}
    return {"ssl_certfile": str(settings.tls_cert), "ssl_keyfile": str(settings.tls_key)}


def gunicorn_tls(settings: Settings) -> dict[str, Any]:
    """gunicorn's settings serving ``settings``' certificate from every pool worker."""
    if settings.tls_cert is None or settings.tls_key is None:
        return {}
    return {"certfile": str(settings.tls_cert), "keyfile": str(settings.tls_key)}


def plain_http_warning(settings: Settings) -> str | None:
    """The warning for credentials sent off this host over plain HTTP (by clients to the
    address the server listens on, or by learners to the one it advertises), or None."""
    if not settings.tls and not is_loopback_host(settings.host):
        return PLAIN_HTTP_WARNING.format(host=settings.host or "every interface")
    advertised = urlsplit(settings.advertise_url or "")
    if advertised.scheme == "http" and not is_loopback_host(advertised.hostname or ""):
        return PLAIN_ADVERTISE_WARNING.format(url=settings.advertise_url)
    return None


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this host's loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
