"""A recording stand-in for the API's learner report endpoint, and tests of the stand-in.

The controller tests import ``RecordingApi`` from here: a real threaded HTTP server on
127.0.0.1 that accepts report batches, drops seqs it already has and, as the API does,
refuses a batch that is not numbered consecutively (400) or does not continue from the last
seq it holds (409 with ``expected_seq``); it can be told to fail with a status, to lose
responses, to go down and come back on the same port, or to ask for halt or cancel. Every
test using the ``api`` fixture also checks that the stream it received had no gaps.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

TOKEN = "job-token-123"
_REPORT_PATH = re.compile(r"^/v1/internal/jobs/([^/]+)/learners/(\d+)/reports$")


def wait_until(condition: Callable[[], object], timeout_s: float = 15.0, what: str = "") -> None:
    """Poll ``condition`` until it is true; fail the test when ``timeout_s`` passes first."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what or condition}")
        time.sleep(0.01)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, api: RecordingApi) -> None:
        self.api = api
        self.open_sockets: set[socket.socket] = set()
        super().__init__(("127.0.0.1", port), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.api.lock:
            self.open_sockets.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.api.lock:
            self.open_sockets.discard(request)
        super().shutdown_request(request)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        del format, args

    def _answer(self, status: int, document: dict[str, Any]) -> None:
        body = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        api = self.server.api
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        matched = _REPORT_PATH.match(self.path)
        if matched is None:
            self._answer(404, {"error": "no such route"})
            return
        if self.headers.get("Authorization") != f"Bearer {api.token}":
            self._answer(401, {"error": "bad token"})
            return
        verdict = api.handle(matched.group(1), int(matched.group(2)), json.loads(body))
        if verdict is None:
            # Accepted but the answer is lost: the client must resend, the seqs dedupe.
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self._answer(*verdict)


class RecordingApi:
    """The report endpoint, recording every item it accepts, in order, once."""

    def __init__(self, token: str = TOKEN) -> None:
        self.token = token
        self.lock = threading.Lock()
        self.accepted: list[dict[str, Any]] = []
        self.batches: list[dict[str, Any]] = []
        # When each batch arrived (time.monotonic), beside ``batches``.
        self.arrivals: list[float] = []
        self.violations: list[str] = []
        # First seqs of batches refused with 409 because they did not continue the stream.
        self.refusals: list[int] = []
        self.last_seq: dict[tuple[str, int, int], int] = {}
        self.fail_status: int | None = None
        self.fail_remaining = 0
        self.lose_responses = 0
        self.halt = False
        self.cancel = False
        # The batch answers carry (a job that rebatches in place); None: no batch.
        self.batch: dict[str, Any] | None = None
        # The gap between posts the answers ask (``pace_s``); None: not asked.
        self.pace_s: float | None = None
        # Answer halt once a status item with this value has been accepted.
        self.halt_after_status: str | None = None
        self.port = 0
        self._server: _Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._server = _Server(self.port, self)
        self.port = self._server.server_address[1]
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def stop(self) -> None:
        """Go down: stop listening and cut every open connection."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        with self.lock:
            sockets = list(server.open_sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def fail_next(self, status: int, count: int) -> None:
        with self.lock:
            self.fail_status, self.fail_remaining = status, count

    def handle(
        self, training_id: str, learner: int, body: dict[str, Any]
    ) -> tuple[int, dict[str, Any]] | None:
        with self.lock:
            self.batches.append(body)
            self.arrivals.append(time.monotonic())
            if self.fail_status is not None and self.fail_remaining != 0:
                self.fail_remaining -= 1
                return self.fail_status, {"error": "told to fail"}
            key = (training_id, learner, int(body["attempt"]))
            last = self.last_seq.get(key, 0)
            seqs = [item["seq"] for item in body["items"]]
            if seqs and seqs != list(range(seqs[0], seqs[0] + len(seqs))):
                self.violations.append(f"seqs not consecutive in one batch: {seqs}")
                return 400, {"error": "items must be numbered consecutively"}
            if seqs and seqs[0] > last + 1:
                self.refusals.append(seqs[0])
                detail = {"expected_seq": last + 1, "got": seqs[0]}
                return 409, {"error": "seq gap", "code": "C409", "detail": detail}
            accepted = 0
            for item in body["items"]:
                if item["seq"] > last:
                    last = item["seq"]
                    self.accepted.append(item)
                    accepted += 1
                    if item["type"] == "status" and item["status"] == self.halt_after_status:
                        self.halt = True
            self.last_seq[key] = last
            if self.lose_responses > 0:
                self.lose_responses -= 1
                return None
            answer = {"accepted": accepted, "last_seq": last, "halt": self.halt}
            if self.batch is not None:
                answer["batch"] = self.batch
            if self.pace_s is not None:
                answer["pace_s"] = self.pace_s
            return 200, {**answer, "cancel": self.cancel}

    # -- what was accepted ----------------------------------------------------------------

    def items(self, kind: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            return [item for item in self.accepted if kind is None or item["type"] == kind]

    def statuses(self) -> list[str]:
        return [item["status"] for item in self.items("status")]

    def final_status(self) -> dict[str, Any] | None:
        statuses = self.items("status")
        return statuses[-1] if statuses else None

    def log_texts(self, stream: str | None = None) -> list[str]:
        return [
            item["text"] for item in self.items("log") if stream is None or item["stream"] == stream
        ]

    def heartbeats(self) -> int:
        with self.lock:
            return sum(1 for batch in self.batches if not batch["items"])


@pytest.fixture
def api() -> Iterator[RecordingApi]:
    recording = RecordingApi()
    recording.start()
    yield recording
    recording.stop()
    assert recording.violations == []


def _post(api: RecordingApi, items: list[dict[str, Any]], token: str = TOKEN) -> Any:
    connection = http.client.HTTPConnection("127.0.0.1", api.port, timeout=5)
    connection.request(
        "POST",
        "/v1/internal/jobs/job-1/learners/1/reports",
        body=json.dumps({"attempt": 0, "items": items}),
        headers={"Authorization": f"Bearer {token}"},
    )
    response = connection.getresponse()
    document = response.status, json.loads(response.read())
    connection.close()
    return document


def test_stand_in_drops_seqs_it_already_has(api: RecordingApi) -> None:
    first = {"type": "log", "seq": 1, "time": 1.0, "stream": "stdout", "text": "a"}
    second = {"type": "log", "seq": 2, "time": 2.0, "stream": "stdout", "text": "b"}
    assert _post(api, [first])[1]["last_seq"] == 1
    status, answer = _post(api, [first, second])
    assert (status, answer["accepted"], answer["last_seq"]) == (200, 1, 2)
    assert api.log_texts() == ["a", "b"]


def test_stand_in_fails_when_told_and_checks_the_token(api: RecordingApi) -> None:
    api.fail_next(503, 1)
    assert _post(api, [])[0] == 503
    assert _post(api, [])[0] == 200
    assert _post(api, [], token="wrong")[0] == 401


def test_stand_in_comes_back_on_the_same_port(api: RecordingApi) -> None:
    port = api.port
    api.stop()
    with pytest.raises(OSError):
        _post(api, [])
    api.start()
    assert api.port == port
    assert _post(api, [])[0] == 200


def test_stand_in_refuses_gaps_as_the_api_does(api: RecordingApi) -> None:
    first = {"type": "log", "seq": 1, "time": 1.0, "stream": "stdout", "text": "a"}
    jump = {"type": "log", "seq": 5, "time": 2.0, "stream": "stdout", "text": "b"}
    status, answer = _post(api, [jump])
    assert (status, answer["detail"]["expected_seq"]) == (409, 1)
    assert _post(api, [first, jump])[0] == 400
    assert api.log_texts() == []
    assert api.violations == ["seqs not consecutive in one batch: [1, 5]"]
    api.violations.clear()
