"""TLS for ffdl's own connections: how clients verify an ffdl server, and the checks a
server's certificate passes before ``ffdl up`` serves HTTPS with it.

Everything that talks to the API (the CLI and Python client, learners' reports and file
transfers) verifies the server's certificate and host name, against a CA bundle when one is
configured (a private CA: ``ca_bundle``, ``FFDL_CA_BUNDLE``) and the system's trust store
otherwise. Nothing here turns verification off.

Learners on other machines cannot read the platform's files, so they receive the CA bundle's
text in their spec (``ca_pem``) rather than its path. Only the standard library is used on
that path: learners import this module.
"""

from __future__ import annotations

import ssl
from datetime import UTC, datetime
from pathlib import Path


class TlsError(ValueError):
    """A certificate, key or CA bundle that cannot be used; the message names the file and
    the reason."""


def read_ca_bundle(path: Path) -> str:
    """The PEM text of the CA bundle at ``path``, checked to hold at least one certificate
    that OpenSSL accepts."""
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise TlsError(f"CA bundle {path}: cannot be read ({_reason(exc)})") from None
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise TlsError(f"CA bundle {path}: holds no PEM certificate")
    try:
        ssl.create_default_context(cadata=text)
    except (ssl.SSLError, ValueError) as exc:
        raise TlsError(f"CA bundle {path}: not usable ({_reason(exc)})") from None
    return text


def client_context(ca_bundle: Path | None = None, ca_pem: str | None = None) -> ssl.SSLContext:
    """A context that verifies the server's certificate and host name: against
    ``ca_bundle`` (a file) or ``ca_pem`` (its text) when given, else the system's trust
    store."""
    context = ssl.create_default_context()
    if ca_bundle is not None:
        ca_pem = read_ca_bundle(ca_bundle)
    if ca_pem is not None:
        context.load_verify_locations(cadata=ca_pem)
    return context


def check_server_certificate(cert: Path, key: Path, now: datetime | None = None) -> None:
    """Refuse, naming the file and the reason, a server certificate that is unreadable,
    not a certificate, outside its validity period, or not the pair of ``key``."""
    # Imported here: learners use this module and need no X.509 parser.
    from cryptography import x509

    for path, what in ((cert, "TLS certificate"), (key, "TLS key")):
        try:
            path.read_bytes()
        except OSError as exc:
            raise TlsError(f"{what} {path}: cannot be read ({_reason(exc)})") from None
    try:
        chain = x509.load_pem_x509_certificates(cert.read_bytes())
    except ValueError:
        raise TlsError(f"TLS certificate {cert}: holds no PEM certificate") from None
    leaf = chain[0]
    moment = now or datetime.now(UTC)
    if leaf.not_valid_after_utc <= moment:
        raise TlsError(
            f"TLS certificate {cert}: expired on {leaf.not_valid_after_utc:%Y-%m-%d %H:%M} UTC"
        )
    if leaf.not_valid_before_utc > moment:
        raise TlsError(
            f"TLS certificate {cert}: not valid before "
            f"{leaf.not_valid_before_utc:%Y-%m-%d %H:%M} UTC"
        )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(str(cert), str(key))
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc) or exc.reason == "KEY_VALUES_MISMATCH":
            raise TlsError(f"TLS certificate {cert} does not match the key {key}") from None
        raise TlsError(f"TLS key {key}: not usable with {cert} ({_reason(exc)})") from None


def verification_failure(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate verification failure behind ``exc``, if that is what it is."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, ssl.SSLCertVerificationError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason)
    return str(exc) or type(exc).__name__
