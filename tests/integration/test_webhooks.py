"""Event webhooks against a live server: a real HTTP receiver on 127.0.0.1 gets a real job's
status events, in order, signed, after retries, across a restart, and only while registered.
"""

from __future__ import annotations

import itertools
import json
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from ffdl.core.jobdirs import JobDirs
from ffdl.server.services.webhooks import (
    ATTEMPT_HEADER,
    EVENT_ID_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    verify_signature,
)
from tests.integration.live import FAST_CONFIG, LiveServer, manifest_yaml, serving, wait_for

WEBHOOK_CONFIG: dict[str, Any] = {
    **FAST_CONFIG,
    "webhook_allowed_hosts": ["127.0.0.1", "localhost"],
    "webhook_interval_s": 0.2,
    "webhook_retry_base_s": 0.1,
    "webhook_retry_max_s": 0.4,
    "webhook_max_attempts": 4,
    "webhook_timeout_s": 2.0,
}
BLOCKER = """
import os, time
while not os.path.exists(os.path.join(os.environ["JOB_STATE_DIR"], "release")):
    time.sleep(0.05)
print("done")
"""


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def payload(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(self.body)
        return loaded


class Receiver:
    """A threaded HTTP server that records every POST; some paths fail on purpose."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.fail_first: dict[str, int] = {}  # path -> how many requests to answer 503
        self.always_fail: set[str] = set()
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver.lock:
                    receiver.received.append(Received(self.path, dict(self.headers), body))
                    status = 204
                    if self.path in receiver.always_fail:
                        status = 500
                    elif receiver.fail_first.get(self.path, 0) > 0:
                        receiver.fail_first[self.path] -= 1
                        status = 503
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def at(self, path: str) -> list[Received]:
        with self.lock:
            return [r for r in self.received if r.path == path]

    def statuses(self, path: str) -> list[str]:
        return [r.payload["to_status"] for r in self.at(path)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    yield found
    found.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    home = tmp_path_factory.mktemp("webhooks")
    with serving(LiveServer(home=home, config=dict(WEBHOOK_CONFIG))) as live:
        yield live


def blocked_job(server: LiveServer) -> str:
    job_id = server.submit_ok(manifest_yaml("python train.py"), {"train.py": BLOCKER})
    return job_id


def release(server: LiveServer, job_id: str) -> None:
    """Let the blocked job finish, once its learner has its state directory."""
    state = JobDirs.of(server.home / "jobs", job_id).state
    wait_for(state.is_dir, what=f"{job_id}'s state directory")
    (state / "release").touch()


def register(
    client: httpx.Client, job_id: str, endpoint: str, url: str, event_type: str = "update"
) -> httpx.Response:
    return client.post(
        f"/v1/models/{job_id}/events/{event_type}/{endpoint}",
        json={"url": url, "type": event_type},
    )


def stored_events(home: Path, job_id: str, *, learners: bool = False) -> list[tuple[int, str]]:
    """The job's status events as the store has them: (id, to_status), in order."""
    with sqlite3.connect(home / "ffdl.db") as db:
        query = "SELECT id, to_status FROM events WHERE job_id = ?"
        if not learners:
            query += " AND learner IS NULL"
        return [(int(i), str(s)) for i, s in db.execute(query + " ORDER BY id", (job_id,))]


def delivery(server: LiveServer, job_id: str, endpoint: str, **wanted: Any) -> dict[str, Any]:
    """The endpoint's ``delivery`` state once it has recorded ``wanted`` (it records a pass
    after the receiver has answered)."""
    url = f"/v1/models/{job_id}/events/update/{endpoint}"

    def recorded() -> dict[str, Any] | None:
        state: dict[str, Any] = server.client.get(url).json()["delivery"]
        return state if all(state[k] == v for k, v in wanted.items()) else None

    found: dict[str, Any] = wait_for(recorded, what=f"{endpoint} to record {wanted}")
    return found


def first_deliveries(received: list[Received]) -> list[int]:
    """Event ids in the order first delivered (repeats allowed by at-least-once dropped)."""
    seen: list[int] = []
    for item in received:
        event_id = int(item.payload["event_id"])
        if event_id not in seen:
            seen.append(event_id)
    return seen


def test_receiver_gets_every_status_event_in_order_signed(
    server: LiveServer, receiver: Receiver
) -> None:
    job_id = blocked_job(server)
    created = register(server.client, job_id, "hook-1", receiver.url("/ordered"))
    assert created.status_code == 200, created.text
    view = created.json()
    secret = view["secret"]
    assert secret.startswith("whsec_") and view["created"] is True
    assert view["id"] == "hook-1" and view["url"] == receiver.url("/ordered")
    learners = register(server.client, job_id, "hook-all", receiver.url("/all"), "all")
    assert learners.status_code == 200, learners.text
    server.wait_status(job_id, {"PROCESSING"})
    release(server, job_id)
    server.wait_status(job_id, {"COMPLETED"})
    wait_for(lambda: "COMPLETED" in receiver.statuses("/ordered"), what="COMPLETED delivered")

    received = receiver.at("/ordered")
    expected = stored_events(server.home, job_id)
    assert first_deliveries(received) == [event_id for event_id, _ in expected]
    payloads = [r.payload for r in received]
    assert payloads[0]["from_status"] is None and payloads[0]["to_status"] == "QUEUED"
    for before, after in itertools.pairwise(payloads):
        assert after["from_status"] == before["to_status"]  # no gap in the chain
    now = time.time()
    for item in received:
        assert item.payload["model_id"] == job_id and item.payload["learner"] is None
        assert item.headers[EVENT_ID_HEADER] == str(item.payload["event_id"])
        assert item.headers[ATTEMPT_HEADER] == "1"
        stamp, sig = item.headers[TIMESTAMP_HEADER], item.headers[SIGNATURE_HEADER]
        assert verify_signature(secret, stamp, sig, item.body, now)
        assert not verify_signature("whsec_wrong", stamp, sig, item.body, now)
        assert not verify_signature(secret, stamp, sig, item.body + b" ", now)

    # ``all`` adds the learners' own status changes.
    wait_for(
        lambda: any(r.payload["learner"] == 1 for r in receiver.at("/all")),
        what="a learner event",
    )
    all_ids = stored_events(server.home, job_id, learners=True)
    wait_for(
        lambda: len(first_deliveries(receiver.at("/all"))) == len(all_ids),
        what="every event of the job and its learner",
    )

    listed = server.client.get(f"/v1/models/{job_id}/events/update")
    assert listed.status_code == 200
    endpoints = listed.json()["endpoints"]
    assert [e["id"] for e in endpoints] == ["hook-1"]
    one = server.client.get(f"/v1/models/{job_id}/events/update/hook-1").json()
    assert "secret" not in one and secret not in listed.text
    delivery(server, job_id, "hook-1", delivered=len(expected), last_event_id=expected[-1][0])


def test_failing_receiver_gets_the_events_after_retries(
    server: LiveServer, receiver: Receiver
) -> None:
    receiver.fail_first["/flaky"] = 3
    job_id = blocked_job(server)
    assert register(server.client, job_id, "flaky", receiver.url("/flaky")).status_code == 200
    release(server, job_id)
    server.wait_status(job_id, {"COMPLETED"})
    wait_for(lambda: "COMPLETED" in receiver.statuses("/flaky"), what="COMPLETED after retries")

    received = receiver.at("/flaky")
    expected = [event_id for event_id, _ in stored_events(server.home, job_id)]
    assert first_deliveries(received) == expected
    # The first event was tried four times, as the attempt header counts.
    first = [r.headers[ATTEMPT_HEADER] for r in received if r.payload["event_id"] == expected[0]]
    assert first == ["1", "2", "3", "4"]
    delivery(server, job_id, "flaky", given_up=0, delivered=len(expected))


def test_an_event_is_given_up_after_the_last_attempt(
    server: LiveServer, receiver: Receiver
) -> None:
    receiver.always_fail.add("/down")
    job_id = blocked_job(server)
    assert register(server.client, job_id, "down", receiver.url("/down")).status_code == 200

    def gave_up() -> dict[str, Any] | None:
        view: dict[str, Any] = server.client.get(f"/v1/models/{job_id}/events/update/down").json()
        return view if view["delivery"]["given_up"] >= 1 else None

    view = wait_for(gave_up, what="an event given up")
    assert view["delivery"]["last_error"] == "HTTP 500"
    first_id = stored_events(server.home, job_id)[0][0]
    tries = [r for r in receiver.at("/down") if r.payload["event_id"] == first_id]
    assert len(tries) == WEBHOOK_CONFIG["webhook_max_attempts"]
    # The next event is tried after the one given up on.
    wait_for(
        lambda: any(r.payload["event_id"] > first_id for r in receiver.at("/down")),
        what="the next event tried",
    )
    assert "gave up on event" in server.log_tail(400)
    release(server, job_id)


def test_another_tenants_endpoints_are_invisible(server: LiveServer, receiver: Receiver) -> None:
    job_id = blocked_job(server)
    assert register(server.client, job_id, "mine", receiver.url("/mine")).status_code == 200
    assert server.client.post("/v1/tenants", json={"id": "team-w"}).status_code == 201
    token = server.client.post("/v1/tenants/team-w/users", json={"name": "wes"}).json()["token"]
    with httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=30
    ) as other:
        base = f"/v1/models/{job_id}/events/update"
        for response in (
            other.get(base),
            other.get(f"{base}/mine"),
            other.delete(f"{base}/mine"),
            register(other, job_id, "theirs", receiver.url("/theirs")),
            register(other, job_id, "mine", receiver.url("/stolen")),
        ):
            assert response.status_code == 404, response.text
            assert job_id in response.text
            assert "/mine" not in response.text
    view = server.client.get(f"/v1/models/{job_id}/events/update/mine").json()
    assert view["url"] == receiver.url("/mine")
    listed = server.client.get(f"/v1/models/{job_id}/events/update").json()["endpoints"]
    assert [e["id"] for e in listed] == ["mine"]
    release(server, job_id)


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("ftp://127.0.0.1/x", "scheme must be http or https"),
        ("http://user:pw@127.0.0.1/x", "credentials"),
        ("http://127.0.0.1/" + "a" * 2100, "over 2048"),
        ("not-a-url", "scheme must be http or https"),
        ("", "required"),
        ("http://10.1.2.3/hook", "does not admit"),
        ("http://[::1]:9/hook", "does not admit"),
        ("http://127.0.0.1:99999/x", "invalid port"),
        ("http://127.0.0.1/a b", "spaces"),
    ],
)
def test_bad_callback_urls_are_refused_naming_the_field(
    server: LiveServer, url: str, words: str
) -> None:
    job_id = server.submit_ok(manifest_yaml("true"))
    response = register(server.client, job_id, "bad", url)
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["detail"]["field"] == "url"
    assert words in response.text
    assert "pw@" not in response.text  # a password in the URL is never echoed
    listed = server.client.get(f"/v1/models/{job_id}/events/update").json()
    assert listed["endpoints"] == []


def test_bad_registrations_name_what_is_wrong(server: LiveServer, receiver: Receiver) -> None:
    job_id = server.submit_ok(manifest_yaml("true"))
    url = receiver.url("/never")
    wrong_type = server.client.post(
        f"/v1/models/{job_id}/events/update/x", json={"url": url, "type": "all"}
    )
    assert wrong_type.status_code == 400 and wrong_type.json()["detail"]["field"] == "type"
    bad_id = register(server.client, job_id, "-dash", url)
    assert bad_id.status_code == 400 and bad_id.json()["detail"]["field"] == "endpoint_id"
    unknown = register(server.client, job_id, "x", url, "metrics")
    assert unknown.status_code == 404 and "event types: all, update" in unknown.text
    missing = register(server.client, "no-such-model", "x", url)
    assert missing.status_code == 404 and "no-such-model" in missing.text
    assert server.client.get(f"/v1/models/{job_id}/events/update/x").status_code == 404
    assert server.client.get(f"/v1/models/{job_id}/events/all").json()["endpoints"] == []


def test_re_registering_changes_the_url_and_keeps_the_secret(
    server: LiveServer, receiver: Receiver
) -> None:
    job_id = blocked_job(server)
    first = register(server.client, job_id, "moving", receiver.url("/old")).json()
    again = register(server.client, job_id, "moving", receiver.url("/new"))
    assert again.status_code == 200
    assert again.json()["created"] is False and "secret" not in again.json()
    assert again.json()["url"] == receiver.url("/new")
    release(server, job_id)
    server.wait_status(job_id, {"COMPLETED"})
    wait_for(lambda: "COMPLETED" in receiver.statuses("/new"), what="delivery to the new URL")
    last = receiver.at("/new")[-1]
    assert verify_signature(
        first["secret"],
        last.headers[TIMESTAMP_HEADER],
        last.headers[SIGNATURE_HEADER],
        last.body,
        time.time(),
    )


def test_deleting_an_endpoint_stops_its_deliveries(server: LiveServer, receiver: Receiver) -> None:
    job_id = blocked_job(server)
    assert register(server.client, job_id, "gone", receiver.url("/gone")).status_code == 200
    assert register(server.client, job_id, "kept", receiver.url("/kept")).status_code == 200
    server.wait_status(job_id, {"PROCESSING"})
    wait_for(lambda: "PROCESSING" in receiver.statuses("/gone"), what="PROCESSING delivered")
    deleted = server.client.delete(f"/v1/models/{job_id}/events/update/gone")
    assert deleted.status_code == 200 and deleted.json()["deleted"] is True
    assert server.client.get(f"/v1/models/{job_id}/events/update/gone").status_code == 404
    assert server.client.delete(f"/v1/models/{job_id}/events/update/gone").status_code == 404
    before = len(receiver.at("/gone"))
    release(server, job_id)
    server.wait_status(job_id, {"COMPLETED"})
    # The endpoint kept gets the job's end; the one deleted gets nothing more.
    wait_for(lambda: "COMPLETED" in receiver.statuses("/kept"), what="COMPLETED to the kept one")
    assert len(receiver.at("/gone")) == before
    assert "COMPLETED" not in receiver.statuses("/gone")


def test_a_host_name_is_sent_to_the_address_checked_with_its_own_host_header(
    server: LiveServer, receiver: Receiver
) -> None:
    job_id = server.submit_ok(manifest_yaml("true"))
    port = receiver.server.server_address[1]
    url = f"http://localhost:{port}/named"
    assert register(server.client, job_id, "named", url).status_code == 200
    server.wait_status(job_id, {"COMPLETED"})
    wait_for(lambda: "COMPLETED" in receiver.statuses("/named"), what="COMPLETED by name")
    assert {r.headers["Host"] for r in receiver.at("/named")} == {f"localhost:{port}"}


def test_deleting_the_model_deletes_its_endpoints(server: LiveServer, receiver: Receiver) -> None:
    job_id = server.submit_ok(manifest_yaml("true"))
    assert register(server.client, job_id, "doomed", receiver.url("/doomed")).status_code == 200
    server.wait_status(job_id, {"COMPLETED"})
    assert server.client.delete(f"/v1/models/{job_id}").status_code == 200
    with sqlite3.connect(server.home / "ffdl.db") as db:
        rows = db.execute("SELECT count(*) FROM webhook_endpoints WHERE job_id = ?", (job_id,))
        assert rows.fetchone()[0] == 0
    assert server.client.get(f"/v1/models/{job_id}/events/update").status_code == 404


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["stop", "crash"])
def test_a_server_restart_mid_job_loses_no_event(
    tmp_path: Path, receiver: Receiver, sig: signal.Signals
) -> None:
    path = f"/restart-{sig.name}"
    live = LiveServer(home=tmp_path / "home", config=dict(WEBHOOK_CONFIG))
    with serving(live):
        job_id = blocked_job(live)
        assert register(live.client, job_id, "restart", receiver.url(path)).status_code == 200
        live.wait_status(job_id, {"PROCESSING"})
        wait_for(lambda: "PROCESSING" in receiver.statuses(path), what="PROCESSING delivered")
        live.stop(sig)
        before = first_deliveries(receiver.at(path))
        # The job finishes while the server is down; its controller reports when it is back.
        release(live, job_id)
        live.start()
        live.wait_status(job_id, {"COMPLETED"})
        wait_for(lambda: "COMPLETED" in receiver.statuses(path), what="COMPLETED after restart")
        expected = [event_id for event_id, _ in stored_events(live.home, job_id)]
        ids = [int(r.payload["event_id"]) for r in receiver.at(path)]
        assert first_deliveries(receiver.at(path)) == expected
        if sig == signal.SIGTERM:
            # A clean stop records what was delivered: nothing is sent twice.
            assert ids == expected
        else:
            # A crash may repeat what was delivered but not yet recorded (at least once):
            # the restarted server resumes at its cursor, so one run restarts, in order.
            descents = sum(1 for a, b in itertools.pairwise(ids) if b <= a)
            assert descents <= 1 and set(ids) == set(expected)
            assert ids[len(before) :] == sorted(ids[len(before) :])
        delivery(live, job_id, "restart", last_event_id=expected[-1])
