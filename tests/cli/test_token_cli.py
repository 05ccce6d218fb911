"""``ffdl token list|create|revoke`` and ``ffdl audit`` against a fake API (MockTransport)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner, Result

from ffdl.cli.main import CliContext, app
from ffdl.client.config import ClientConfig
from ffdl.client.http import Client

TOKENS: list[dict[str, Any]] = [
    {
        "id": "tok-0123abcd",
        "user": "admin",
        "name": "client.json",
        "created": "2024-05-01T10:00:00.123+00:00",
        "expires": "2024-07-30T10:00:00+00:00",
        "last_used": "2024-05-02T08:30:00+00:00",
        "expired": False,
        "current": True,
    },
    {
        "id": "tok-4567efgh",
        "user": "team-a.mia",
        "name": "laptop",
        "created": "2024-01-01T00:00:00+00:00",
        "expires": "2024-03-31T00:00:00+00:00",
        "last_used": None,
        "expired": True,
        "current": False,
    },
]
EVENTS: list[dict[str, Any]] = [
    {
        "id": 2,
        "time": "2024-05-01T10:05:00+00:00",
        "actor": "admin",
        "actor_tenant": "default",
        "action": "tenant.quota",
        "target": "team-a",
        "tenant": "team-a",
        "detail": "max_gpus=None max_running_jobs=None -> max_gpus=8 max_running_jobs=None",
    },
    {
        "id": 1,
        "time": "2024-05-01T10:00:00+00:00",
        "actor": "admin",
        "actor_tenant": "default",
        "action": "tenant.create",
        "target": "team-a",
        "tenant": "team-a",
        "detail": "",
    },
]


class FakeTokenApi:
    """The token and audit endpoints' contract, served through ``httpx.MockTransport``."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.tokens = list(TOKENS)
        self.events = list(EVENTS)

    def factory(self, config: ClientConfig) -> Client:
        return Client(config.url, config.token, transport=httpx.MockTransport(self.handle))

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        method, path, params = request.method, request.url.path, request.url.params
        if (method, path) == ("GET", "/v1/tokens"):
            user = params.get("user")
            rows = [t for t in self.tokens if user is None or t["user"] == user]
            return httpx.Response(200, json={"tokens": rows})
        if (method, path) == ("POST", "/v1/tokens"):
            body = json.loads(request.content)
            if len(body.get("name", "")) > 200:
                return httpx.Response(
                    400,
                    json={
                        "error": "invalid request: name: String should have at most 200 characters",
                        "code": "C100",
                        "detail": [{"field": "name", "reason": "too long"}],
                    },
                )
            created = {**TOKENS[0], "id": "tok-new", "name": body.get("name", ""), "current": False}
            return httpx.Response(201, json={**created, "token": "ffdl_s3cret"})
        if method == "DELETE" and path.startswith("/v1/tokens/"):
            token_id = path.rsplit("/", 1)[1]
            found = [t for t in self.tokens if t["id"] == token_id]
            if not found:
                return httpx.Response(
                    404, json={"error": f"no token {token_id!r}", "code": "C404", "detail": None}
                )
            return httpx.Response(
                200, json={"id": token_id, "user": found[0]["user"], "revoked": True}
            )
        if (method, path) == ("GET", "/v1/audit"):
            size, offset = int(params.get("pagesize", 100)), int(params.get("offset", 0))
            rows = [e for e in self.events if params.get("action") in (None, e["action"])]
            return httpx.Response(
                200, json={"events": rows[offset : offset + size], "total": len(rows)}
            )
        return httpx.Response(404, json={"error": f"{path} not found", "code": "C404"})


@pytest.fixture(autouse=True)
def environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FFDL_CONFIG", raising=False)
    monkeypatch.setenv("FFDL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("FFDL_URL", "http://ffdl.test")
    monkeypatch.setenv("FFDL_TOKEN", "env-token")
    monkeypatch.setenv("COLUMNS", "200")


@pytest.fixture
def api() -> FakeTokenApi:
    return FakeTokenApi()


def invoke(args: list[str], api: FakeTokenApi) -> Result:
    return CliRunner().invoke(app, args, obj=CliContext(client_factory=api.factory))


def test_token_list_shows_ids_and_times_never_secrets(api: FakeTokenApi) -> None:
    result = invoke(["token", "list"], api)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "tok-0123abcd (this one)" in out and "tok-4567efgh" in out
    assert "2024-05-01 10:00" in out and "2024-03-31 00:00 (expired)" in out
    assert "2024-05-02 08:30" in out and "laptop" in out and "team-a.mia" in out
    assert "ffdl_" not in out
    assert api.requests[0].url.params.get("user") is None


def test_token_list_for_one_user_and_when_there_are_none(api: FakeTokenApi) -> None:
    result = invoke(["token", "list", "--user", "nobody"], api)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "No tokens."
    assert api.requests[0].url.params["user"] == "nobody"


def test_token_create_prints_the_secret_once_with_its_id(api: FakeTokenApi) -> None:
    result = invoke(["token", "create", "--name", "ci", "--days", "7"], api)
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        "Created token tok-new (expires 2024-07-30 10:00 UTC)\nToken: ffdl_s3cret\n"
    )
    sent = json.loads(api.requests[0].content)
    assert sent == {"name": "ci", "ttl_days": 7.0}
    assert api.requests[0].headers["authorization"] == "Bearer env-token"


def test_token_create_without_options_sends_only_a_name(api: FakeTokenApi) -> None:
    assert invoke(["token", "create"], api).exit_code == 0
    assert json.loads(api.requests[0].content) == {"name": ""}


def test_token_create_errors_are_one_line(api: FakeTokenApi) -> None:
    result = invoke(["token", "create", "--name", "x" * 201], api)
    assert result.exit_code == 1
    assert result.stderr.startswith("Error (C100): invalid request: name:")
    assert len(result.stderr.splitlines()) == 1


def test_token_revoke_and_an_unknown_id(api: FakeTokenApi) -> None:
    result = invoke(["token", "revoke", "tok-4567efgh"], api)
    assert result.exit_code == 0, result.output
    assert result.stdout == "Revoked token tok-4567efgh of team-a.mia\n"
    assert (api.requests[0].method, api.requests[0].url.path) == (
        "DELETE",
        "/v1/tokens/tok-4567efgh",
    )
    missing = invoke(["token", "revoke", "tok-nope"], api)
    assert missing.exit_code == 1
    assert missing.stderr == "Error (C404): no token 'tok-nope'\n"


def test_token_without_a_verb_shows_help(api: FakeTokenApi) -> None:
    result = invoke(["token"], api)
    assert "list" in result.output and "create" in result.output and "revoke" in result.output
    assert api.requests == []


def test_audit_shows_newest_first_and_filters(api: FakeTokenApi) -> None:
    result = invoke(["audit"], api)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.index("tenant.quota") < out.index("tenant.create")
    assert "max_gpus=8" in out and "2 of 2" in out
    filtered = invoke(["audit", "--action", "tenant.create", "--limit", "5"], api)
    assert filtered.exit_code == 0
    params = api.requests[-1].url.params
    assert (params["action"], params["pagesize"], params["offset"]) == ("tenant.create", "5", "0")
    assert "tenant.quota" not in filtered.stdout
    assert invoke(["audit", "--limit", "0"], api).exit_code == 2
