"""How the API is reached: the TLS files checked before ``ffdl up`` serves, what uvicorn
and gunicorn are given to serve HTTPS, what SIGHUP does (take up a renewed certificate),
and the warning for credentials sent in clear text.

SIGHUP re-reads the certificate and key from the same files, checked as at start: a good
pair is served to every new connection (one process: loaded into the live TLS context; a
pool: its workers restart gracefully), a bad one is refused in the log and the current
certificate stays. Nothing else is re-read. Without TLS, SIGHUP is logged and ignored
rather than ending the server as its default action would.

HTTP Basic passwords, API tokens and learners' job tokens cross the network with every
request. On a loopback address they never leave the host; on any other address over plain
HTTP anyone on the path can read them, so the server says so at start, on ``/health`` and
on the dashboard.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import signal
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ffdl.core.tls import TlsError, check_server_certificate, read_ca_bundle
from ffdl.server.settings import Settings

log = logging.getLogger("ffdl.server")

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


def hangup_check(settings: Settings) -> str | None:
    """Whether SIGHUP may take up the certificate files now: None when they pass, else the
    line to log (no TLS, or what is wrong with the new files)."""
    if settings.tls_cert is None or settings.tls_key is None:
        return "SIGHUP: this server speaks plain HTTP; nothing to reload"
    try:
        check_server_certificate(settings.tls_cert, settings.tls_key)
    except TlsError as exc:
        return f"SIGHUP: {exc}; still serving the current certificate"
    return None


def reload_on_hangup(settings: Settings, context: Callable[[], ssl.SSLContext | None]) -> None:
    """Make SIGHUP load the renewed certificate into ``context()``, the live server's TLS
    context (one process); new connections get it, open ones keep theirs."""

    def hangup(_signum: int, _frame: object) -> None:
        refused = hangup_check(settings)
        live = context()
        if refused is not None or live is None or settings.tls_cert is None:
            log.warning("%s", refused or "SIGHUP: the server is not serving yet")
            return
        try:
            live.load_cert_chain(str(settings.tls_cert), str(settings.tls_key))
        except (OSError, ssl.SSLError) as exc:
            # The files changed again between the check and the load.
            log.warning("SIGHUP: %s; still serving the current certificate", exc)
            return
        log.info("SIGHUP: serving the certificate in %s to new connections", settings.tls_cert)

    signal.signal(signal.SIGHUP, hangup)


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
