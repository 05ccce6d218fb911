"""The checks a server certificate passes before ``ffdl up`` serves HTTPS with it, and the
CA bundles clients verify servers by."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError

from ffdl.core.tls import TlsError, check_server_certificate, client_context, read_ca_bundle
from ffdl.server.settings import Settings
from ffdl.server.transport import plain_http_warning
from tests.tlsfiles import issue_server_certificate, make_authority, write_unrelated_key


def test_a_certificate_with_its_own_key_passes(tmp_path: Path) -> None:
    authority = make_authority(tmp_path / "ca")
    server = issue_server_certificate(authority, tmp_path)
    check_server_certificate(server.cert_file, server.key_file)


def test_a_key_of_another_certificate_is_refused_naming_both_files(tmp_path: Path) -> None:
    server = issue_server_certificate(make_authority(tmp_path / "ca"), tmp_path)
    other_key = write_unrelated_key(tmp_path / "other-key.pem")
    with pytest.raises(TlsError) as refused:
        check_server_certificate(server.cert_file, other_key)
    assert str(refused.value) == (
        f"TLS certificate {server.cert_file} does not match the key {other_key}"
    )


def test_an_expired_certificate_is_refused_with_its_end_date(tmp_path: Path) -> None:
    authority = make_authority(tmp_path / "ca")
    ended = datetime(2026, 1, 2, 3, 4, tzinfo=UTC)
    server = issue_server_certificate(
        authority, tmp_path, valid_from=ended - timedelta(days=30), valid_until=ended
    )
    with pytest.raises(TlsError, match=r"expired on 2026-01-02 03:04 UTC") as refused:
        check_server_certificate(server.cert_file, server.key_file)
    assert str(server.cert_file) in str(refused.value)


def test_a_certificate_not_yet_valid_is_refused(tmp_path: Path) -> None:
    authority = make_authority(tmp_path / "ca")
    later = datetime.now(UTC) + timedelta(days=3)
    server = issue_server_certificate(
        authority, tmp_path, valid_from=later, valid_until=later + timedelta(days=1)
    )
    with pytest.raises(TlsError, match="not valid before"):
        check_server_certificate(server.cert_file, server.key_file)


def test_unreadable_and_malformed_files_are_named_with_the_reason(tmp_path: Path) -> None:
    server = issue_server_certificate(make_authority(tmp_path / "ca"), tmp_path)
    missing = tmp_path / "missing.pem"
    with pytest.raises(TlsError) as refused:
        check_server_certificate(missing, server.key_file)
    assert str(refused.value) == (
        f"TLS certificate {missing}: cannot be read (No such file or directory)"
    )
    with pytest.raises(TlsError, match=r"TLS key .*: cannot be read \(Is a directory\)"):
        check_server_certificate(server.cert_file, tmp_path)
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(TlsError, match=rf"TLS certificate {garbage}: holds no PEM certificate"):
        check_server_certificate(garbage, server.key_file)


def test_a_ca_bundle_must_hold_a_certificate(tmp_path: Path) -> None:
    authority = make_authority(tmp_path / "ca")
    assert "BEGIN CERTIFICATE" in read_ca_bundle(authority.cert_file)
    client_context(authority.cert_file)  # loads
    key_only = write_unrelated_key(tmp_path / "key.pem")
    with pytest.raises(TlsError, match=rf"CA bundle {key_only}: holds no PEM certificate"):
        client_context(key_only)
    broken = tmp_path / "broken.pem"
    broken.write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    with pytest.raises(TlsError, match=rf"CA bundle {broken}: not usable"):
        read_ca_bundle(broken)


def test_settings_need_the_certificate_and_its_key_together(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="tls_cert is set but tls_key is not"):
        Settings(home=tmp_path, tls_cert=tmp_path / "c.pem")
    with pytest.raises(ValidationError, match="tls_key is set but tls_cert is not"):
        Settings(home=tmp_path, tls_key=tmp_path / "k.pem")
    served = Settings(home=tmp_path, port=8443, tls_cert="c.pem", tls_key="k.pem")
    assert served.api_url == "https://127.0.0.1:8443"
    assert served.tls_cert is not None and served.tls_cert.is_absolute()
    assert Settings(home=tmp_path, port=8080, tls_cert="", tls_key="").api_url == (
        "http://127.0.0.1:8080"
    )


@pytest.mark.parametrize(
    ("values", "warned"),
    [
        ({"host": "127.0.0.1"}, None),
        ({"host": "::1"}, None),
        ({"host": "localhost"}, None),
        ({"host": "0.0.0.0"}, "0.0.0.0"),
        ({"host": "10.1.2.3"}, "10.1.2.3"),
        ({"host": "0.0.0.0", "tls_cert": "c.pem", "tls_key": "k.pem"}, None),
        ({"advertise_url": "http://192.0.2.1:8080"}, "http://192.0.2.1:8080"),
        ({"advertise_url": "https://192.0.2.1:8080"}, None),
        ({"advertise_url": "http://127.0.0.1:8080"}, None),
    ],
)
def test_plain_http_off_loopback_is_warned_about(
    tmp_path: Path, values: dict[str, str], warned: str | None
) -> None:
    warning = plain_http_warning(Settings(home=tmp_path, **values))  # type: ignore[arg-type]
    if warned is None:
        assert warning is None
    else:
        assert warning is not None and warned in warning and "clear text" in warning


def test_up_names_the_missing_half_of_the_pair_in_one_line(tmp_path: Path) -> None:
    server = [sys.executable, "-m", "ffdl.server.main", "--home", str(tmp_path / "home")]
    done = subprocess.run(
        [*server, "--port", "0", "--tls-cert", str(tmp_path / "server.pem")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "ffdl: invalid settings: tls_cert is set but tls_key is not: HTTPS needs both"
    )
    assert not (tmp_path / "home" / "ffdl.db").exists()
