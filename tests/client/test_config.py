"""Which server and token the client uses: options, environment, config files, defaults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ffdl.client.config import (
    DEFAULT_URL,
    NO_SERVER_MESSAGE,
    ClientConfig,
    ConfigError,
    resolve_client_config,
)

FFDL_VARIABLES = ("FFDL_HOME", "FFDL_URL", "FFDL_TOKEN", "FFDL_CONFIG", "FFDL_CA_BUNDLE")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in FFDL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    platform_home = tmp_path / "home"
    platform_home.mkdir()
    monkeypatch.setenv("FFDL_HOME", str(platform_home))
    return platform_home


def write_client_file(path: Path, url: str, token: str) -> Path:
    path.write_text(json.dumps({"url": url, "token": token}))
    return path


def test_nothing_configured_is_a_clear_error(home: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve_client_config()
    assert caught.value.message == NO_SERVER_MESSAGE


def test_home_client_file_is_used(home: Path) -> None:
    write_client_file(home / "client.json", "http://127.0.0.1:9000", "home-token")
    assert resolve_client_config() == ClientConfig("http://127.0.0.1:9000", "home-token")


def test_ffdl_config_beats_home_file(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_client_file(home / "client.json", "http://127.0.0.1:9000", "home-token")
    other = write_client_file(tmp_path / "other.json", "http://127.0.0.1:9100/", "other-token")
    monkeypatch.setenv("FFDL_CONFIG", str(other))
    assert resolve_client_config() == ClientConfig("http://127.0.0.1:9100", "other-token")


def test_environment_beats_files_field_by_field(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_client_file(home / "client.json", "http://127.0.0.1:9000", "home-token")
    monkeypatch.setenv("FFDL_TOKEN", "env-token")
    assert resolve_client_config() == ClientConfig("http://127.0.0.1:9000", "env-token")
    monkeypatch.setenv("FFDL_URL", "http://127.0.0.1:9200")
    assert resolve_client_config() == ClientConfig("http://127.0.0.1:9200", "env-token")


def test_options_beat_environment(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FFDL_URL", "http://127.0.0.1:9200")
    monkeypatch.setenv("FFDL_TOKEN", "env-token")
    resolved = resolve_client_config(url="http://127.0.0.1:9300", token="option-token")
    assert resolved == ClientConfig("http://127.0.0.1:9300", "option-token")


def test_token_alone_targets_default_url(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FFDL_TOKEN", "env-token")
    assert resolve_client_config() == ClientConfig(DEFAULT_URL, "env-token")


def test_empty_environment_values_count_as_unset(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FFDL_URL", "")
    monkeypatch.setenv("FFDL_TOKEN", "")
    monkeypatch.setenv("FFDL_CONFIG", "")
    with pytest.raises(ConfigError, match="no ffdl server configured"):
        resolve_client_config()


def test_missing_ffdl_config_file_is_an_error(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_client_file(home / "client.json", "http://127.0.0.1:9000", "home-token")
    monkeypatch.setenv("FFDL_CONFIG", str(tmp_path / "typo.json"))
    with pytest.raises(ConfigError, match=r"typo\.json does not exist"):
        resolve_client_config()


@pytest.mark.parametrize(
    ("content", "problem"),
    [("{not json", "cannot read"), ("[1, 2]", "must be a JSON object"), ('{"url": 5}', "'url'")],
)
def test_malformed_client_file_is_an_error(home: Path, content: str, problem: str) -> None:
    (home / "client.json").write_text(content)
    with pytest.raises(ConfigError, match=problem):
        resolve_client_config()


def test_the_ca_bundle_comes_from_the_environment_or_the_file_of_the_server_used(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = "https://127.0.0.1:8443"
    (home / "client.json").write_text(
        json.dumps({"url": served, "token": "t", "ca_bundle": "/etc/ffdl/ca.pem"})
    )
    # The file's server: its CA.
    assert resolve_client_config().ca_bundle == Path("/etc/ffdl/ca.pem")
    # Another server named in the environment is not verified by the file's CA.
    monkeypatch.setenv("FFDL_URL", "https://cp2.example:8443")
    monkeypatch.setenv("FFDL_TOKEN", "other")
    assert resolve_client_config().ca_bundle is None
    # FFDL_CA_BUNDLE wins everywhere.
    monkeypatch.setenv("FFDL_CA_BUNDLE", str(tmp_path / "private-ca.pem"))
    assert resolve_client_config().ca_bundle == tmp_path / "private-ca.pem"
    # A named config file that is gone is no error when the URL and token need nothing of it.
    monkeypatch.delenv("FFDL_CA_BUNDLE")
    monkeypatch.setenv("FFDL_CONFIG", str(tmp_path / "gone.json"))
    assert resolve_client_config() == ClientConfig("https://cp2.example:8443", "other")
