"""HTTP Basic sign-in as FfDL's clients send it, on a real server over real HTTP: passwords an
admin sets (argon2id in the database), FfDL's 401, the back-off on guessing, bearer tokens
unchanged, and ``X-Watson-Userinfo`` only behind a declared trusted proxy."""

from __future__ import annotations

import base64
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from typing import Any

import httpx
import pytest
from argon2 import PasswordHasher

from ffdl.server.auth import ADMIN_USER, BAD_CREDENTIALS
from ffdl.server.passwords import (
    FAILURES_BEFORE_BACKOFF,
    MAX_BACKOFF_S,
    REMEMBER_S,
    SignIns,
)
from tests.integration.live import FAST_CONFIG, LiveServer, serving

PASSWORD = "correct horse battery"


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with serving(LiveServer(home=tmp_path_factory.mktemp("basic") / "home")) as server:
        for tenant in ("team-a", "team-b"):
            created = server.client.post("/v1/tenants", json={"id": tenant})
            assert created.status_code == 201, created.text
        yield server


@pytest.fixture(scope="module")
def proxied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    home = tmp_path_factory.mktemp("proxied") / "home"
    with serving(LiveServer(home=home, config={**FAST_CONFIG, "trusted_proxy": True})) as server:
        yield server


def basic(user: str, password: str) -> dict[str, str]:
    pair = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {pair}"}


def ffdl_cli_headers(user: str, password: str) -> dict[str, str]:
    """What FfDL's Go CLI sends with every call."""
    return {**basic(user, password), "X-Watson-Userinfo": f"bluemix-instance-id={user}"}


def add_user(server: LiveServer, tenant: str, name: str, *, role: str = "member") -> str:
    created = server.client.post(f"/v1/tenants/{tenant}/users", json={"name": name, "role": role})
    assert created.status_code == 201, created.text
    return str(created.json()["user"])


def set_password(
    server: LiveServer, user: str, password: str, headers: dict[str, str] | None = None, **body: Any
) -> httpx.Response:
    return server.client.put(
        f"/v1/users/{user}/password", json={"password": password, **body}, headers=headers
    )


def whoami(server: LiveServer, headers: dict[str, str]) -> str:
    """The user a request with ``headers`` acts as: the owner of a token it creates."""
    created = httpx.post(
        f"{server.url}/v1/tokens", json={"name": "whoami"}, headers=headers, timeout=30
    )
    assert created.status_code == 201, created.text
    return str(created.json()["user"])


def get(server: LiveServer, path: str, headers: dict[str, str]) -> httpx.Response:
    return httpx.get(f"{server.url}{path}", headers=headers, timeout=30)


def assert_refused(response: httpx.Response, *words: str, challenge: str = "Basic") -> None:
    assert response.status_code == 401, response.text
    body = response.json()
    assert body["code"] == 401 and body["ffdl_code"] == "C103", body
    for word in words:
        assert word in body["description"], body
    assert response.headers["www-authenticate"].startswith(challenge), response.headers


def db_password_hash(server: LiveServer, user: str) -> str | None:
    with closing(sqlite3.connect(server.home / "ffdl.db")) as db:
        row = db.execute("SELECT password_hash FROM users WHERE id = ?", (user,)).fetchone()
    return None if row is None else row[0]


def test_the_right_password_signs_in_as_that_user(live: LiveServer) -> None:
    alice = add_user(live, "team-a", "alice")
    assert set_password(live, alice, PASSWORD).status_code == 200
    response = get(live, "/v1/models", ffdl_cli_headers(alice, PASSWORD))
    assert response.status_code == 200, response.text
    assert whoami(live, basic(alice, PASSWORD)) == alice


def test_a_default_tenant_user_signs_in_by_its_bare_name(live: LiveServer) -> None:
    user = add_user(live, "default", "test-user")
    assert user == "default.test-user"
    assert set_password(live, user, PASSWORD).status_code == 200
    assert whoami(live, basic("test-user", PASSWORD)) == user
    assert whoami(live, basic(user, PASSWORD)) == user


def test_a_wrong_password_gets_ffdls_401_and_a_basic_challenge(live: LiveServer) -> None:
    carol = add_user(live, "team-a", "carol")
    assert set_password(live, carol, PASSWORD).status_code == 200
    response = get(live, "/v1/models", ffdl_cli_headers(carol, "wrong password"))
    assert_refused(response, "Bad username or password.")
    assert response.headers["www-authenticate"] == 'Basic realm="ffdl"'


def test_an_unknown_user_and_a_user_without_password_get_the_same_answer(
    live: LiveServer,
) -> None:
    nobody = get(live, "/v1/models", basic("team-a.nobody", PASSWORD))
    assert_refused(nobody, "Bad username or password.")
    dave = add_user(live, "team-a", "dave")
    no_password = get(live, "/v1/models", basic(dave, PASSWORD))
    assert_refused(no_password, "Bad username or password.")
    assert no_password.json()["description"] == nobody.json()["description"]


def test_malformed_and_missing_credentials_are_refused_clearly(live: LiveServer) -> None:
    assert_refused(get(live, "/v1/models", {"Authorization": "Basic %%%"}), "malformed Basic")
    assert_refused(get(live, "/v1/models", {}), "missing credentials")
    expired = get(live, "/v1/models", {"Authorization": "Bearer not-a-token"})
    assert_refused(expired, "invalid or revoked token", challenge="Bearer")


def test_bearer_tokens_keep_working(live: LiveServer) -> None:
    assert live.client.get("/v1/models").status_code == 200
    assert whoami(live, {"Authorization": f"Bearer {live.token}"}) == ADMIN_USER


def test_the_database_holds_an_argon2id_hash_never_the_password(live: LiveServer) -> None:
    erin = add_user(live, "team-b", "erin")
    secret = "erin's secret passphrase"
    assert set_password(live, erin, secret).status_code == 200
    stored = db_password_hash(live, erin)
    assert stored is not None and stored.startswith("$argon2id$"), stored
    assert PasswordHasher().verify(stored, secret)
    for path in live.home.glob("ffdl.db*"):
        assert secret.encode() not in path.read_bytes(), path
    events = live.client.get("/v1/audit", params={"action": "user.password"}).json()["events"]
    mine = [event for event in events if event["target"] == erin]
    assert mine and mine[0]["detail"] == "set by an admin", mine
    assert secret not in live.client.get("/v1/audit").text


def test_a_changed_password_ends_sign_ins_with_the_old_one_at_once(live: LiveServer) -> None:
    frank = add_user(live, "team-a", "frank")
    assert set_password(live, frank, PASSWORD).status_code == 200
    # Signed in twice: the second is answered from the memory of recent sign-ins.
    for _ in range(2):
        assert get(live, "/v1/models", basic(frank, PASSWORD)).status_code == 200
    assert set_password(live, frank, "a brand new password").status_code == 200
    assert_refused(get(live, "/v1/models", basic(frank, PASSWORD)), "Bad username or password.")
    assert get(live, "/v1/models", basic(frank, "a brand new password")).status_code == 200
    removed = live.client.delete(f"/v1/users/{frank}/password")
    assert removed.status_code == 200 and removed.json()["has_password"] is False
    assert_refused(get(live, "/v1/models", basic(frank, "a brand new password")))


def test_a_hash_changed_by_another_server_process_is_honoured(live: LiveServer) -> None:
    """Remembered sign-ins are checked against the stored hash, not only this process's
    own changes: a password set through another API process ends the old one too."""
    gina = add_user(live, "team-a", "gina")
    assert set_password(live, gina, PASSWORD).status_code == 200
    assert get(live, "/v1/models", basic(gina, PASSWORD)).status_code == 200
    other = PasswordHasher().hash("set elsewhere entirely")
    with closing(sqlite3.connect(live.home / "ffdl.db")) as db, db:
        db.execute("UPDATE users SET password_hash = ? WHERE id = ?", (other, gina))
    assert_refused(get(live, "/v1/models", basic(gina, PASSWORD)))
    assert get(live, "/v1/models", basic(gina, "set elsewhere entirely")).status_code == 200


def test_a_hash_with_old_parameters_is_replaced_at_sign_in(live: LiveServer) -> None:
    hank = add_user(live, "team-a", "hank")
    weak = PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1).hash(PASSWORD)
    with closing(sqlite3.connect(live.home / "ffdl.db")) as db, db:
        db.execute("UPDATE users SET password_hash = ? WHERE id = ?", (weak, hank))
    assert get(live, "/v1/models", basic(hank, PASSWORD)).status_code == 200
    stored = db_password_hash(live, hank)
    assert stored is not None and stored != weak
    assert not PasswordHasher().check_needs_rehash(stored)
    assert PasswordHasher().verify(stored, PASSWORD)


def test_a_short_password_is_refused_and_changes_nothing(live: LiveServer) -> None:
    ivan = add_user(live, "team-a", "ivan")
    assert set_password(live, ivan, PASSWORD).status_code == 200
    refused = set_password(live, ivan, "short")
    assert refused.status_code == 400, refused.text
    body = refused.json()
    assert "too short" in body["description"] and "at least 8" in body["description"]
    assert body["detail"]["field"] == "password"
    assert get(live, "/v1/models", basic(ivan, PASSWORD)).status_code == 200


def test_who_may_set_whose_password(live: LiveServer) -> None:
    boss = add_user(live, "team-a", "boss", role="admin")
    member = add_user(live, "team-a", "judy")
    stranger = add_user(live, "team-b", "kim")
    assert set_password(live, boss, PASSWORD).status_code == 200
    as_boss = basic(boss, PASSWORD)

    # A tenant admin sets its own tenant's users' passwords...
    assert set_password(live, member, PASSWORD, headers=as_boss).status_code == 200
    # ...but another tenant's user is not even found, and nothing changes.
    other = set_password(live, stranger, PASSWORD, headers=as_boss)
    assert other.status_code == 404 and other.json()["ffdl_code"] == "C404", other.text
    assert db_password_hash(live, stranger) is None
    # Nor may an admin of the platform admin's own tenant take the platform over.
    chief = add_user(live, "default", "chief", role="admin")
    assert set_password(live, chief, PASSWORD).status_code == 200
    to_root = set_password(live, ADMIN_USER, PASSWORD, headers=basic(chief, PASSWORD))
    assert to_root.status_code == 403, to_root.text
    assert "platform admin" in to_root.json()["description"]
    assert db_password_hash(live, ADMIN_USER) is None
    # A member may not set a colleague's password.
    colleague = set_password(live, boss, "taken over!!", headers=basic(member, PASSWORD))
    assert colleague.status_code == 403, colleague.text


def test_admins_list_users_with_whether_they_have_a_password(live: LiveServer) -> None:
    owner = add_user(live, "team-b", "owner", role="admin")
    assert set_password(live, owner, PASSWORD).status_code == 200
    listing = get(live, "/v1/users", basic(owner, PASSWORD))
    assert listing.status_code == 200, listing.text
    users = {user["user"]: user for user in listing.json()["users"]}
    assert users[owner]["has_password"] is True and users[owner]["role"] == "admin"
    assert {user["tenant"] for user in users.values()} == {"team-b"}
    assert "$argon2" not in listing.text
    everyone = live.client.get("/v1/users").json()["users"]
    assert {ADMIN_USER, owner} <= {user["user"] for user in everyone}
    member = add_user(live, "team-b", "plain")
    assert set_password(live, member, PASSWORD).status_code == 200
    assert get(live, "/v1/users", basic(member, PASSWORD)).status_code == 403


def test_changing_your_own_password_needs_the_current_one(live: LiveServer) -> None:
    leo = add_user(live, "team-b", "leo")
    assert set_password(live, leo, PASSWORD).status_code == 200
    as_leo = basic(leo, PASSWORD)
    missing = set_password(live, leo, "my new password", headers=as_leo)
    assert missing.status_code == 400 and missing.json()["detail"]["field"] == "current_password"
    wrong = set_password(
        live, leo, "my new password", headers=as_leo, current_password="not it at all"
    )
    assert wrong.status_code == 403, wrong.text
    right = set_password(live, leo, "my new password", headers=as_leo, current_password=PASSWORD)
    assert right.status_code == 200, right.text
    assert whoami(live, basic(leo, "my new password")) == leo
    events = live.client.get("/v1/audit", params={"action": "user.password"}).json()["events"]
    assert next(e["detail"] for e in events if e["target"] == leo) == "changed by the user"


def test_repeated_failures_back_off_but_a_working_client_is_not_locked_out(
    live: LiveServer,
) -> None:
    mia = add_user(live, "team-b", "mia")
    assert set_password(live, mia, PASSWORD).status_code == 200
    assert get(live, "/v1/models", basic(mia, PASSWORD)).status_code == 200
    answers = []
    for _ in range(FAILURES_BEFORE_BACKOFF + 6):
        response = get(live, "/v1/models", basic(mia, "guess"))
        assert_refused(response)
        description = response.json()["description"]
        answers.append(description)
        if "too many failed sign-ins" in description:
            assert int(response.headers["retry-after"]) >= 1
            break
    assert answers[:FAILURES_BEFORE_BACKOFF] == [BAD_CREDENTIALS] * FAILURES_BEFORE_BACKOFF
    assert "try again in" in answers[-1], answers
    # The client that knows the password, already signed in, carries on.
    assert get(live, "/v1/models", basic(mia, PASSWORD)).status_code == 200


def test_x_watson_userinfo_is_ignored_unless_a_trusted_proxy_is_declared(
    live: LiveServer,
) -> None:
    forged = {"X-Watson-Userinfo": f"bluemix-instance-id={ADMIN_USER}"}
    # Refused, saying what happened and what works instead (FfDL's CLI sends only this
    # header for `logs` without --follow).
    assert_refused(get(live, "/v1/models", forged), "sent no credentials for this call")
    answer = get(live, "/v1/logs/training-any/loglines", forged)
    assert answer.status_code == 401
    assert "use `logs --follow`" in answer.json()["description"]
    assert "trusted_proxy" in answer.json()["description"]
    nina = add_user(live, "team-b", "nina")
    assert set_password(live, nina, PASSWORD).status_code == 200
    # FfDL's CLI sends the header along with Basic: it neither refuses nor changes the user.
    assert whoami(live, {**basic(nina, PASSWORD), **forged}) == nina


def test_behind_a_trusted_proxy_x_watson_userinfo_names_the_user(proxied: LiveServer) -> None:
    created = proxied.client.post("/v1/tenants/default/users", json={"name": "olga"})
    assert created.status_code == 201, created.text
    header = {"X-Watson-Userinfo": "bluemix-region=us-south;bluemix-instance-id=olga"}
    assert whoami(proxied, header) == "default.olga"
    assert get(proxied, "/v1/models", header).status_code == 200
    malformed = get(proxied, "/v1/models", {"X-Watson-Userinfo": "bluemix-region=us-south"})
    assert_refused(malformed, "Missing or malformed X-Watson-Userinfo header.")
    unknown = get(proxied, "/v1/models", {"X-Watson-Userinfo": "bluemix-instance-id=zed"})
    assert_refused(unknown, "names no user", "'zed'")
    # Without the header, the usual credentials decide.
    assert proxied.client.get("/v1/models").status_code == 200


# -- the sign-in memory and back-off, on a clock the test drives ---------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_remembered_sign_ins_expire_and_are_forgotten_per_user() -> None:
    clock = Clock()
    sign_ins = SignIns(clock)
    sign_ins.remember("a", "pw", "t.a", "$hash-a")
    sign_ins.remember("b", "pw", "t.b", "$hash-b")
    assert sign_ins.remembered("a", "pw") == ("t.a", "$hash-a")
    assert sign_ins.remembered("a", "other") is None
    sign_ins.forget_user("t.a")
    assert sign_ins.remembered("a", "pw") is None
    assert sign_ins.remembered("b", "pw") == ("t.b", "$hash-b")
    clock.now += REMEMBER_S
    assert sign_ins.remembered("b", "pw") is None


def test_back_off_doubles_caps_and_is_per_user_and_client() -> None:
    clock = Clock()
    sign_ins = SignIns(clock)
    for _ in range(FAILURES_BEFORE_BACKOFF - 1):
        sign_ins.failed("u", "10.0.0.1")
    assert sign_ins.blocked_for("u", "10.0.0.1") == 0.0
    sign_ins.failed("u", "10.0.0.1")
    assert sign_ins.blocked_for("u", "10.0.0.1") == 1.0
    sign_ins.failed("u", "10.0.0.1")
    assert sign_ins.blocked_for("u", "10.0.0.1") == 2.0
    assert sign_ins.blocked_for("u", "10.0.0.2") == 0.0
    assert sign_ins.blocked_for("v", "10.0.0.1") == 0.0
    for _ in range(30):
        sign_ins.failed("u", "10.0.0.1")
    assert sign_ins.blocked_for("u", "10.0.0.1") == MAX_BACKOFF_S
    sign_ins.succeeded("u", "10.0.0.1")
    assert sign_ins.blocked_for("u", "10.0.0.1") == 0.0


def test_verification_rejects_a_missing_hash_and_flags_old_parameters() -> None:
    sign_ins = SignIns()
    assert not sign_ins.verify(None, "anything").ok
    weak = PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1).hash("pw")
    result = sign_ins.verify(weak, "pw")
    assert result.ok and result.rehashed is not None and result.rehashed != weak
    assert not sign_ins.verify(weak, "not pw").ok
    assert not sign_ins.verify("not a hash", "pw").ok
