"""Client-side settings: the only place the client and the CLI read environment variables.

``FFDL_HOME`` (platform home, default ``~/.ffdl``), ``FFDL_URL`` and ``FFDL_TOKEN`` (the
server to talk to) and ``FFDL_CONFIG`` (path of a ``client.json``); and FfDL's own
``DLAAS_URL``, ``DLAAS_USERNAME`` and ``DLAAS_PASSWORD`` (a server and HTTP Basic
credentials, as FfDL's CLI read them); ``FFDL_CA_BUNDLE``, the CA that signed an HTTPS
server's certificate when the system's trust store does not hold it. Empty values count as
unset.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_home() -> Path:
    return Path.home() / ".ffdl"


class ClientSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="FFDL_", extra="ignore", env_ignore_empty=True, populate_by_name=True
    )

    home: Path = Field(default_factory=_default_home)
    url: str | None = None
    token: str | None = None
    config: Path | None = None
    ca_bundle: Path | None = None
    # FfDL's variables keep their names (no FFDL_ prefix).
    dlaas_url: str | None = Field(default=None, validation_alias="DLAAS_URL")
    dlaas_username: str | None = Field(default=None, validation_alias="DLAAS_USERNAME")
    dlaas_password: str | None = Field(default=None, validation_alias="DLAAS_PASSWORD", repr=False)

    @property
    def client_file(self) -> Path:
        """The ``client.json`` the server writes into its home on first start."""
        return self.home.expanduser() / "client.json"
