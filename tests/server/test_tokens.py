"""API tokens on a real server: create, list, revoke, expiry, the bootstrap token, and a
database from before tokens had ids and expiry."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import update

from ffdl.server.auth import ADMIN_USER, authenticate, bootstrap, hash_token
from ffdl.server.settings import Settings
from ffdl.server.store.db import Store
from ffdl.server.store.models import ApiToken, User
from ffdl.server.store.schema import upgrade
from ffdl.server.store.transitions import utcnow
from tests.integration.live import LiveServer, serving, wait_for
from tests.server.factories import database_url, on_both_databases


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with serving(LiveServer(home=tmp_path_factory.mktemp("tokens") / "home")) as server:
        yield server


def bearer(server: LiveServer, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=30
    )


def test_create_list_and_revoke_a_token(live: LiveServer) -> None:
    created = live.client.post("/v1/tokens", json={"name": "ci pipeline"})
    assert created.status_code == 201, created.text
    body = created.json()
    secret, token_id = body["token"], body["id"]
    assert secret.startswith("ffdl_") and token_id and token_id not in secret
    assert body["user"] == ADMIN_USER and body["name"] == "ci pipeline" and body["expires"]

    with bearer(live, secret) as ci:
        assert ci.get("/v1/models").status_code == 200
        listing = ci.get("/v1/tokens")
        assert listing.status_code == 200
        # Neither the secret nor its hash is ever shown again.
        assert secret not in listing.text and hash_token(secret) not in listing.text
        rows = {t["id"]: t for t in listing.json()["tokens"]}
        mine = rows[token_id]
        assert set(mine) >= {"id", "user", "name", "created", "expires", "last_used"}
        assert mine["current"] is True and mine["last_used"] is not None
        assert not mine["expired"]

        revoked = live.client.delete(f"/v1/tokens/{token_id}")
        assert revoked.status_code == 200 and revoked.json()["revoked"] is True
        refused = ci.get("/v1/models")
        assert refused.status_code == 401 and refused.json()["ffdl_code"] == "C103"
    assert live.client.delete(f"/v1/tokens/{token_id}").status_code == 404
    assert token_id not in live.client.get("/v1/tokens").text
    audit = live.client.get("/v1/audit", params={"action": "token.revoke"}).json()["events"]
    assert token_id in [e["target"] for e in audit]


def test_an_expired_token_is_refused_saying_it_expired(live: LiveServer) -> None:
    # About 1.7 seconds.
    created = live.client.post("/v1/tokens", json={"name": "short", "ttl_days": 2e-5})
    assert created.status_code == 201, created.text
    with bearer(live, created.json()["token"]) as short:

        def refused() -> httpx.Response | None:
            response = short.get("/v1/models")
            return response if response.status_code == 401 else None

        response: httpx.Response = wait_for(refused, timeout=30, interval=0.2, what="expiry")
    body = response.json()
    assert body["ffdl_code"] == "C103" and "expired" in body["description"]
    assert body["detail"]["reason"] == "expired"
    listed = live.client.get("/v1/tokens").json()["tokens"]
    assert next(t for t in listed if t["id"] == created.json()["id"])["expired"] is True


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "x" * 201}, "name"),
        ({"ttl_days": 0}, "ttl_days"),
        ({"ttl_days": -1}, "ttl_days"),
        ({"ttl_days": 1e300}, "ttl_days"),
        ({"ttl_days": 91}, "ttl_days"),  # beyond the platform's token_ttl_days (90)
        ({"secret": "mine"}, "secret"),
    ],
)
def test_bad_token_requests_are_400s_naming_the_field(
    live: LiveServer, body: dict[str, Any], field: str
) -> None:
    response = live.client.post("/v1/tokens", json=body)
    assert response.status_code == 400, response.text
    detail = response.json()["detail"]
    named = detail["field"] if isinstance(detail, dict) else detail[0]["field"]
    assert named == field


def test_the_token_commands_against_the_server(live: LiveServer) -> None:
    def ffdl(*args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FFDL_")}
        env |= {"FFDL_CONFIG": str(live.home / "client.json"), "COLUMNS": "250"}
        command = [sys.executable, "-m", "ffdl.cli.main", *args]
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)

    created = ffdl("token", "create", "--name", "from the cli", "--days", "1")
    assert created.returncode == 0, created.stderr
    token_id = created.stdout.split("Created token ")[1].split()[0]
    secret = created.stdout.split("Token: ")[1].strip()
    listed = ffdl("token", "list")
    assert token_id in listed.stdout and "from the cli" in listed.stdout
    assert secret not in listed.stdout
    revoked = ffdl("token", "revoke", token_id)
    assert revoked.returncode == 0, revoked.stderr
    with bearer(live, secret) as gone:
        assert gone.get("/v1/models").status_code == 401
    audit = ffdl("audit", "--action", "token.revoke")
    assert audit.returncode == 0 and token_id in audit.stdout


# -- the bootstrap token ------------------------------------------------------------------


def _client_token(settings: Settings) -> str:
    return str(json.loads(settings.client_config_path.read_text())["token"])


@on_both_databases
def test_bootstrap_keeps_a_valid_client_token_and_renews_one_about_to_expire(
    tmp_path: Path, database: str
) -> None:
    settings = Settings(
        home=tmp_path, token_ttl_days=30, database_url=database_url(tmp_path, database)
    )
    store = Store(settings.db_url)
    upgrade(store)
    try:
        bootstrap(store, settings)
        first = _client_token(settings)
        with store.read() as session:
            row = session.get(ApiToken, hash_token(first))
            assert row is not None and row.expires_at is not None
            assert abs(row.expires_at - (utcnow() + timedelta(days=30))) < timedelta(minutes=5)
            admin = session.get(User, ADMIN_USER)
            assert admin is not None and admin.role == "platform-admin"
        bootstrap(store, settings)
        assert _client_token(settings) == first

        with store.write() as session:
            soon = utcnow() + timedelta(days=3)
            session.execute(
                update(ApiToken)
                .where(ApiToken.token_hash == hash_token(first))
                .values(expires_at=soon)
            )
        bootstrap(store, settings)
        renewed = _client_token(settings)
        assert renewed != first
        assert authenticate(store, f"Bearer {renewed}").is_platform_admin
    finally:
        store.dispose()


# -- a database from the previous version --------------------------------------------------

OLD_SCHEMA = """
CREATE TABLE tenants (
    id VARCHAR(64) NOT NULL, name VARCHAR(200) NOT NULL, max_gpus INTEGER,
    max_running_jobs INTEGER, created_at DATETIME NOT NULL, PRIMARY KEY (id)
);
CREATE TABLE users (
    id VARCHAR(64) NOT NULL, tenant_id VARCHAR(64) NOT NULL, name VARCHAR(200) NOT NULL,
    role VARCHAR(16) NOT NULL, created_at DATETIME NOT NULL, PRIMARY KEY (id),
    FOREIGN KEY(tenant_id) REFERENCES tenants (id)
);
CREATE TABLE api_tokens (
    token_hash VARCHAR(64) NOT NULL, user_id VARCHAR(64) NOT NULL,
    created_at DATETIME NOT NULL, PRIMARY KEY (token_hash),
    FOREIGN KEY(user_id) REFERENCES users (id)
);
"""
OLD_ADMIN_TOKEN = "ffdl_from-the-previous-version"
OLD_MEMBER_TOKEN = "ffdl_a-member-from-the-previous-version"


def _old_database(home: Path) -> None:
    home.mkdir(parents=True)
    with closing(sqlite3.connect(home / "ffdl.db")) as db, db:
        db.executescript(OLD_SCHEMA)
        created = "2020-01-01 00:00:00.000000"
        db.executemany(
            "INSERT INTO tenants (id, name, created_at) VALUES (?, ?, ?)",
            [("default", "Default tenant", created), ("team-o", "team-o", created)],
        )
        db.executemany(
            "INSERT INTO users (id, tenant_id, name, role, created_at) VALUES (?, ?, ?, ?, ?)",
            [
                ("admin", "default", "admin", "admin", created),
                ("team-o.olga", "team-o", "olga", "member", created),
            ],
        )
        db.executemany(
            "INSERT INTO api_tokens (token_hash, user_id, created_at) VALUES (?, ?, ?)",
            [
                (hashlib.sha256(OLD_ADMIN_TOKEN.encode()).hexdigest(), "admin", created),
                (hashlib.sha256(OLD_MEMBER_TOKEN.encode()).hexdigest(), "team-o.olga", created),
            ],
        )
    (home / "client.json").write_text(json.dumps({"url": "x", "token": OLD_ADMIN_TOKEN}))


def _columns(db_path: Path, table: str) -> set[str]:
    with closing(sqlite3.connect(db_path)) as db:
        return {row[1] for row in db.execute(f"PRAGMA table_info({table})")}


def _tables(db_path: Path) -> set[str]:
    with closing(sqlite3.connect(db_path)) as db:
        rows = db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        return {row[0] for row in rows}


def test_a_database_of_the_previous_version_is_upgraded_and_its_tokens_still_work(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    _old_database(home)
    assert _columns(home / "ffdl.db", "api_tokens") == {"token_hash", "user_id", "created_at"}
    with serving(LiveServer(home=home)) as server:
        columns = _columns(home / "ffdl.db", "api_tokens")
        assert {"id", "name", "expires_at", "last_used_at"} <= columns
        assert "audit_events" in _tables(home / "ffdl.db")
        # The client config's token was still valid, so it was kept.
        assert server.token == OLD_ADMIN_TOKEN
        with bearer(server, OLD_MEMBER_TOKEN) as olga:
            assert olga.get("/v1/models").status_code == 200
        # The old bootstrap admin is now the platform admin.
        assert server.client.post("/v1/tenants", json={"id": "team-n"}).status_code == 201
        tokens = server.client.get("/v1/tokens").json()["tokens"]
        assert {t["user"] for t in tokens} == {"admin", "team-o.olga"}
        assert all(t["id"] and t["expires"] and not t["expired"] for t in tokens)
        old = next(t for t in tokens if t["user"] == "team-o.olga")
        assert server.client.delete(f"/v1/tokens/{old['id']}").status_code == 200
        with bearer(server, OLD_MEMBER_TOKEN) as olga:
            assert olga.get("/v1/models").status_code == 401
    # A second start finds nothing left to migrate.
    store = Store(f"sqlite:///{home / 'ffdl.db'}")
    try:
        assert upgrade(store) == []
    finally:
        store.dispose()
