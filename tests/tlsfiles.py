"""Throwaway certificate authorities and server certificates for 127.0.0.1, made in the test."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class Authority:
    cert_file: Path
    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey


@dataclass(frozen=True)
class ServerFiles:
    cert_file: Path
    key_file: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return path


def make_authority(directory: Path, name: str = "ffdl test CA") -> Authority:
    """A self-signed CA valid for a day, its certificate written to ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.now(UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_file = directory / "ca.pem"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return Authority(cert_file, certificate, key)


def issue_server_certificate(
    authority: Authority,
    directory: Path,
    *,
    name: str = "server",
    valid_from: datetime | None = None,
    valid_until: datetime | None = None,
) -> ServerFiles:
    """A certificate for 127.0.0.1 (and ``localhost``) signed by ``authority``, and its key."""
    directory.mkdir(parents=True, exist_ok=True)
    key = _key()
    now = datetime.now(UTC)
    ca_key_id = authority.certificate.extensions.get_extension_for_class(
        x509.SubjectKeyIdentifier
    ).value
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(authority.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid_from or now - timedelta(minutes=5))
        .not_valid_after(valid_until or now + timedelta(hours=12))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_key_id),
            critical=False,
        )
        .sign(authority.key, hashes.SHA256())
    )
    cert_file = directory / f"{name}.pem"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return ServerFiles(cert_file, _write_key(key, directory / f"{name}-key.pem"))


def write_unrelated_key(path: Path) -> Path:
    """A private key that belongs to no certificate."""
    return _write_key(_key(), path)
