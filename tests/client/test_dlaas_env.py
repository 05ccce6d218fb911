"""FfDL's ``DLAAS_URL``/``DLAAS_USERNAME``/``DLAAS_PASSWORD``: the ``ffdl`` command run as a
subprocess against a real server signs in with HTTP Basic, and where they stand among the
client's other settings."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from ffdl.client.config import (
    ClientConfig,
    ConfigError,
    client_for,
    resolve_client_config,
)
from ffdl.client.settings import ClientSettings
from tests.integration.live import LiveServer, code_zip, manifest_yaml, serving

PASSWORD = "p@ss:word with spaces"
USER = "team-d.dana"


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with serving(LiveServer(home=tmp_path_factory.mktemp("dlaas") / "home")) as server:
        assert server.client.post("/v1/tenants", json={"id": "team-d"}).status_code == 201
        created = server.client.post("/v1/tenants/team-d/users", json={"name": "dana"})
        assert created.status_code == 201, created.text
        assert (
            server.client.put(f"/v1/users/{USER}/password", json={"password": PASSWORD})
        ).status_code == 200
        yield server


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def submit(server: LiveServer, headers: dict[str, str], name: str) -> str:
    response = httpx.post(
        f"{server.url}/v1/models",
        headers=headers,
        files={
            "manifest": ("manifest.yml", manifest_yaml("true", name=name).encode()),
            "model_definition": ("model.zip", code_zip({"README": "x"}), "application/zip"),
        },
        timeout=60,
    )
    assert response.status_code == 201, response.text
    return str(response.json()["model_id"])


def run_cli(
    server: LiveServer, *args: str, stdin: str | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """``ffdl ARGS`` with only ``env`` of the ffdl/DLAAS variables set; the platform's own
    ``client.json`` (the admin's token) is in its home, where the CLI would find it."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("FFDL_", "DLAAS_", "COLUMNS"))}
    return subprocess.run(
        [sys.executable, "-m", "ffdl.cli.main", *args],
        env={**base, "FFDL_HOME": str(server.home), "COLUMNS": "250", **env},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_ffdl_list_with_dlaas_variables_lists_that_users_jobs(live: LiveServer) -> None:
    mine = submit(live, basic(USER, PASSWORD), "dana-job")
    admins = submit(live, {"Authorization": f"Bearer {live.token}"}, "admin-job")
    result = run_cli(live, "list", DLAAS_URL=live.url, DLAAS_USERNAME=USER, DLAAS_PASSWORD=PASSWORD)
    assert result.returncode == 0, result.stderr
    assert mine in result.stdout
    # Signed in as dana, not with the admin token of the client.json beside it.
    assert admins not in result.stdout


def test_credentials_in_dlaas_url_work_as_in_ffdls_cli(live: LiveServer) -> None:
    mine = submit(live, basic(USER, PASSWORD), "in-url")
    host = live.url.removeprefix("http://")
    url = f"http://{quote(USER, safe='')}:{quote(PASSWORD, safe='')}@{host}"
    result = run_cli(live, "list", DLAAS_URL=url)
    assert result.returncode == 0, result.stderr
    assert mine in result.stdout


def test_a_wrong_dlaas_password_prints_ffdls_message(live: LiveServer) -> None:
    result = run_cli(
        live, "list", DLAAS_URL=live.url, DLAAS_USERNAME=USER, DLAAS_PASSWORD="wrong password"
    )
    assert result.returncode == 1
    assert "Bad username or password." in result.stderr, result.stderr


def test_ffdl_user_password_from_stdin_and_from_prompts(live: LiveServer) -> None:
    created = live.client.post("/v1/tenants/team-d/users", json={"name": "eve"})
    assert created.status_code == 201, created.text
    # The platform admin (the token in the home's client.json) sets eve's first password.
    first = run_cli(live, "user", "password", "team-d.eve", "--password-stdin", stdin="first pw!\n")
    assert first.returncode == 0, first.stderr
    assert "first pw!" not in first.stdout + first.stderr
    as_eve = {"DLAAS_URL": live.url, "DLAAS_USERNAME": "team-d.eve"}
    assert run_cli(live, "list", DLAAS_PASSWORD="first pw!", **as_eve).returncode == 0
    listed = run_cli(live, "user", "list", "--tenant", "team-d")
    assert listed.returncode == 0, listed.stderr
    assert [line for line in listed.stdout.splitlines() if "team-d.eve" in line and "yes" in line]
    # Eve changes her own: the new password on the first line, the current on the second.
    without = run_cli(
        live,
        "user",
        "password",
        "team-d.eve",
        "--password-stdin",
        stdin="second pw!\n",
        DLAAS_PASSWORD="first pw!",
        **as_eve,
    )
    assert without.returncode == 1 and "current_password" in without.stderr, without.stderr
    changed = run_cli(
        live,
        "user",
        "password",
        "team-d.eve",
        "--password-stdin",
        stdin="second pw!\nfirst pw!\n",
        DLAAS_PASSWORD="first pw!",
        **as_eve,
    )
    assert changed.returncode == 0, changed.stderr
    old = run_cli(live, "list", DLAAS_PASSWORD="first pw!", **as_eve)
    assert old.returncode == 1 and "Bad username or password." in old.stderr
    assert run_cli(live, "list", DLAAS_PASSWORD="second pw!", **as_eve).returncode == 0
    short = run_cli(live, "user", "password", "team-d.eve", "--password-stdin", stdin="abc\n")
    assert short.returncode == 1 and "too short" in short.stderr, short.stderr
    # At a prompt: the new password twice, then the current one when the server asks for it.
    prompted = run_cli(
        live,
        "user",
        "password",
        "team-d.eve",
        stdin="third pw!\nthird pw!\nsecond pw!\n",
        DLAAS_PASSWORD="second pw!",
        **as_eve,
    )
    assert prompted.returncode == 0, prompted.stderr
    assert "current password" in prompted.stdout + prompted.stderr
    assert run_cli(live, "list", DLAAS_PASSWORD="third pw!", **as_eve).returncode == 0


def test_the_python_client_signs_in_with_basic(live: LiveServer) -> None:
    mine = submit(live, basic(USER, PASSWORD), "python-client")
    settings = ClientSettings(
        home=live.home, dlaas_url=live.url, dlaas_username=USER, dlaas_password=PASSWORD
    )
    with client_for(resolve_client_config(settings=settings)) as client:
        ids = [model["model_id"] for model in client.list_models()["models"]]
    assert mine in ids


# -- precedence, without a server ----------------------------------------------------------


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    (home / "client.json").write_text(
        json.dumps({"url": "http://127.0.0.1:9000", "token": "file-token"})
    )
    return home


def settings(home: Path, **values: str) -> ClientSettings:
    return ClientSettings(home=home, **values)  # type: ignore[arg-type]


def test_dlaas_variables_beat_the_config_file(home: Path) -> None:
    config = resolve_client_config(
        settings=settings(
            home, dlaas_url="http://127.0.0.1:7000", dlaas_username="u", dlaas_password="pw"
        )
    )
    assert config == ClientConfig("http://127.0.0.1:7000", None, "u", "pw")
    auth = config.auth()
    assert isinstance(auth, httpx.BasicAuth)


def test_ffdl_variables_beat_dlaas_variables(home: Path) -> None:
    values = {"dlaas_url": "http://127.0.0.1:7000", "dlaas_username": "u", "dlaas_password": "p"}
    config = resolve_client_config(
        settings=settings(home, url="http://127.0.0.1:6000", token="tok", **values)
    )
    assert config == ClientConfig("http://127.0.0.1:6000", "tok")
    assert config.auth() is None
    # FFDL_TOKEN alone keeps DLAAS_URL, with the token instead of the password.
    only_token = resolve_client_config(settings=settings(home, token="tok", **values))
    assert only_token == ClientConfig("http://127.0.0.1:7000", "tok")


def test_dlaas_credentials_alone_go_to_the_config_files_server(home: Path) -> None:
    config = resolve_client_config(settings=settings(home, dlaas_username="u", dlaas_password="pw"))
    assert config == ClientConfig("http://127.0.0.1:9000", None, "u", "pw")


def test_the_config_files_token_never_goes_to_a_dlaas_url(home: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve_client_config(settings=settings(home, dlaas_url="http://elsewhere:7000"))
    assert "DLAAS_USERNAME and DLAAS_PASSWORD are not" in caught.value.message


def test_half_of_the_dlaas_credentials_is_a_clear_error(home: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve_client_config(settings=settings(home, dlaas_username="u"))
    assert "DLAAS_PASSWORD is not" in caught.value.message


def test_a_dlaas_url_without_scheme_is_http_and_its_user_info_is_taken_out(home: Path) -> None:
    config = resolve_client_config(
        settings=settings(home, dlaas_url="u%40x:p%3Aw@127.0.0.1:7000/", dlaas_username="env")
    )
    assert config == ClientConfig("http://127.0.0.1:7000", None, "u@x", "p:w")
    assert "p:w" not in repr(config)
