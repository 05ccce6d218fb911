"""HTTPS end to end on 127.0.0.1, with a certificate authority made in the test: the CLI,
the Python client, a learner's reports and a followed job over TLS; a pool of workers
serving it; an untrusted server refused with a clear error; bad certificates refused at
start."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import yaml
from cryptography import x509

from ffdl.client.http import UNTRUSTED, ApiError, Client
from ffdl.core.tls import client_context
from tests.integration.live import (
    FAST_CONFIG,
    LiveServer,
    free_port,
    manifest_yaml,
    serving,
    wait_for,
)
from tests.tlsfiles import (
    Authority,
    ServerFiles,
    issue_server_certificate,
    make_authority,
    write_unrelated_key,
)


@dataclass(frozen=True)
class Pki:
    authority: Authority
    server: ServerFiles
    stranger: Authority  # a CA that signed nothing this server presents


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    authority = make_authority(root / "ca")
    return Pki(
        authority,
        issue_server_certificate(authority, root / "server"),
        make_authority(root / "stranger", name="some other CA"),
    )


def tls_config(pki: Pki, **extra: object) -> dict[str, object]:
    return {
        **FAST_CONFIG,
        "tls_cert": str(pki.server.cert_file),
        "tls_key": str(pki.server.key_file),
        "ca_bundle": str(pki.authority.cert_file),
        **extra,
    }


@pytest.fixture(scope="module")
def https_server(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    home = tmp_path_factory.mktemp("https-home")
    with serving(LiveServer(home=home, config=tls_config(pki))) as server:
        yield server


def ffdl_cli(
    *args: str, env: dict[str, str], cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("FFDL_", "DLAAS_"))}
    return subprocess.run(
        [sys.executable, "-m", "ffdl.cli.main", *args],
        capture_output=True,
        text=True,
        env={**clean, "COLUMNS": "200", **env},
        timeout=120,
        check=False,
    )


def environment_for(server: LiveServer, home: Path, ca_bundle: Path) -> dict[str, str]:
    """A user's environment naming ``server`` and a CA, with no config file in ``home``."""
    return {
        "FFDL_HOME": str(home),
        "FFDL_URL": server.url,
        "FFDL_TOKEN": server.token,
        "FFDL_CA_BUNDLE": str(ca_bundle),
    }


def test_the_cli_trains_and_follows_a_job_over_https_and_its_learner_reports_over_it(
    https_server: LiveServer, pki: Pki, tmp_path: Path
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(
        "for step in range(3):\n    print(f'tls step {step}', flush=True)\n"
    )
    manifest = tmp_path / "manifest.yml"
    manifest.write_text(manifest_yaml("python train.py", name="tls-job"))
    client_json = https_server.home / "client.json"
    written = yaml.safe_load(client_json.read_text())
    assert written["url"] == https_server.url and written["url"].startswith("https://")
    assert written["ca_bundle"] == str(pki.authority.cert_file)

    # client.json names the server and its CA: the CLI on this host needs nothing else.
    run = ffdl_cli(
        "train", str(manifest), str(code), "--follow", env={"FFDL_CONFIG": str(client_json)}
    )
    assert run.returncode == 0, run.stderr
    assert "tls step 2" in run.stdout
    job_id = run.stdout.split("Model ID: ")[1].split()[0]
    # Every line below was sent by the learner's controller to the https:// API address.
    lines = [item["line"] for item in https_server.loglines(job_id)]
    assert [line for line in lines if line.startswith("tls step")] == [
        "tls step 0",
        "tls step 1",
        "tls step 2",
    ]
    assert https_server.status(job_id) == "COMPLETED"

    # FFDL_URL, FFDL_TOKEN and FFDL_CA_BUNDLE, with no config file at all.
    listing = ffdl_cli(
        "list",
        env=environment_for(https_server, tmp_path / "no-home", pki.authority.cert_file),
    )
    assert listing.returncode == 0, listing.stderr
    assert job_id in listing.stdout and "COMPLETED" in listing.stdout


def test_the_python_client_verifies_the_server_by_the_ca_it_is_given(
    https_server: LiveServer, pki: Pki
) -> None:
    with Client(https_server.url, https_server.token, ca_bundle=pki.authority.cert_file) as ok:
        assert ok.health()["tls"] is True
        assert "transport_warning" not in ok.health()
        ok.list_models()
    for ca_bundle in (pki.stranger.cert_file, None):
        wary = Client(https_server.url, https_server.token, ca_bundle=ca_bundle)
        with wary, pytest.raises(ApiError) as refused:
            wary.list_models()
        assert refused.value.code == UNTRUSTED
        assert "does not trust" in refused.value.message
        assert "FFDL_CA_BUNDLE" in refused.value.message


def test_a_server_signed_by_another_ca_is_refused_by_the_cli_in_one_line(
    https_server: LiveServer, pki: Pki, tmp_path: Path
) -> None:
    refused = ffdl_cli(
        "list",
        env=environment_for(https_server, tmp_path, pki.stranger.cert_file),
    )
    assert refused.returncode == 1
    assert "Traceback" not in refused.stderr
    assert f"the ffdl server at {https_server.url} presented a certificate" in refused.stderr
    assert "(unable to get local issuer certificate)" in refused.stderr
    unreadable = ffdl_cli(
        "list",
        env=environment_for(https_server, tmp_path, tmp_path / "missing-ca.pem"),
    )
    assert unreadable.returncode == 1
    assert f"CA bundle {tmp_path / 'missing-ca.pem'}: cannot be read" in unreadable.stderr


def test_a_pool_of_workers_serves_https(pki: Pki, tmp_path: Path) -> None:
    config = tls_config(pki, workers="2")
    with serving(LiveServer(home=tmp_path / "pool", config=config)) as pool:
        assert pool.client.get("/health").json()["tls"] is True
        assert pool.client.get("/v1/models").status_code == 200
        with pytest.raises(httpx.HTTPError):
            # Plain HTTP to an HTTPS port gets no answer a client could take for the API's.
            httpx.get(f"http://127.0.0.1:{pool.port}/health", timeout=5).raise_for_status()


def test_up_refuses_a_key_that_does_not_match_and_an_expired_certificate(
    pki: Pki, tmp_path: Path
) -> None:
    other_key = write_unrelated_key(tmp_path / "other-key.pem")
    home = tmp_path / "home"
    home.mkdir()
    mismatch = ffdl_cli(
        "up",
        "--home",
        str(home),
        "--port",
        str(free_port()),
        "--tls-cert",
        str(pki.server.cert_file),
        "--tls-key",
        str(other_key),
        env={},
    )
    assert mismatch.returncode != 0
    assert (
        f"ffdl: TLS certificate {pki.server.cert_file} does not match the key {other_key}"
        in mismatch.stderr
    )
    assert not (home / "ffdl.db").exists()

    ended = datetime.now(UTC) - timedelta(days=2)
    expired = issue_server_certificate(
        pki.authority,
        tmp_path / "expired",
        valid_from=ended - timedelta(days=90),
        valid_until=ended,
    )
    (home / "config.yaml").write_text(
        yaml.safe_dump({"tls_cert": str(expired.cert_file), "tls_key": str(expired.key_file)})
    )
    stale = ffdl_cli("up", "--home", str(home), "--port", str(free_port()), env={})
    assert stale.returncode != 0
    assert f"ffdl: TLS certificate {expired.cert_file}: expired on" in stale.stderr
    assert not (home / "ffdl.db").exists()


def served_serial(server: LiveServer, authority: Authority) -> int:
    """The serial number of the certificate a new connection to ``server`` is shown."""
    context = client_context(authority.cert_file)
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return int(x509.load_der_x509_certificate(der).serial_number)


@pytest.mark.parametrize("workers", [None, "2"], ids=["one-process", "pool"])
def test_sighup_serves_a_renewed_certificate_and_refuses_a_bad_one(
    pki: Pki, tmp_path: Path, workers: str | None
) -> None:
    live_files = issue_server_certificate(pki.authority, tmp_path / "live", name="live")
    config = {
        **FAST_CONFIG,
        "tls_cert": str(live_files.cert_file),
        "tls_key": str(live_files.key_file),
        "ca_bundle": str(pki.authority.cert_file),
    }
    if workers is not None:
        config["workers"] = workers
    with serving(LiveServer(home=tmp_path / "home", config=config)) as server:
        assert server.proc is not None
        first = served_serial(server, pki.authority)
        renewed = issue_server_certificate(pki.authority, tmp_path / "renewed", name="renewed")
        shutil.copyfile(renewed.cert_file, live_files.cert_file)
        shutil.copyfile(renewed.key_file, live_files.key_file)
        os.kill(server.proc.pid, signal.SIGHUP)
        wait_for(
            lambda: served_serial(server, pki.authority) != first,
            timeout=30,
            what="the renewed certificate to be served",
        )
        second = served_serial(server, pki.authority)

        # A certificate whose key was not renewed with it: refused, the current one kept.
        stray = issue_server_certificate(pki.authority, tmp_path / "stray", name="stray")
        shutil.copyfile(stray.cert_file, live_files.cert_file)
        os.kill(server.proc.pid, signal.SIGHUP)
        wait_for(
            lambda: "still serving the current certificate" in server.log_tail(100),
            timeout=30,
            what="the refusal of a mismatched pair in the log",
        )
        assert f"does not match the key {live_files.key_file}" in server.log_tail(100)
        assert served_serial(server, pki.authority) == second
        assert server.client.get("/health").json()["tls"] is True


def test_sighup_to_a_plain_http_server_is_logged_and_ignored(tmp_path: Path) -> None:
    with serving(LiveServer(home=tmp_path / "plain")) as server:
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGHUP)
        wait_for(
            lambda: "speaks plain HTTP; nothing to reload" in server.log_tail(50),
            timeout=15,
            what="the SIGHUP to be logged",
        )
        assert server.proc.poll() is None
        assert server.client.get("/health").status_code == 200
