"""``Client.submit`` sends an Idempotency-Key and retries with the same key when the server
cannot be reached or a proxy says it is away, and only then; every request waits out a
platform whose database is away (503), for a bounded time (in-process transport)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from ffdl.client.http import ApiError, Client

URL = "http://ffdl.test"
CREATED = {"model_id": "training-abc12345", "location": "/v1/models/training-abc12345"}


def code(tmp_path: Path) -> tuple[Path, Path]:
    manifest = tmp_path / "manifest.yml"
    manifest.write_text("name: x\n")
    directory = tmp_path / "code"
    directory.mkdir(exist_ok=True)
    (directory / "train.py").write_text("print('hi')\n")
    return manifest, directory


def test_unreachable_and_lost_answers_are_retried_with_the_same_key(tmp_path: Path) -> None:
    keys: list[str] = []
    failures = [
        httpx.ConnectError("connection refused"),
        httpx.RemoteProtocolError("Server disconnected without sending a response."),
        httpx.ReadTimeout("timed out"),
    ]

    def handler(request: httpx.Request) -> httpx.Response:
        keys.append(request.headers["Idempotency-Key"])
        if failures:
            raise failures.pop(0)
        if len(keys) == 4:
            return httpx.Response(502, json={"error": "restarting", "code": "E502"})
        return httpx.Response(200, json=CREATED)

    retried: list[tuple[str, float]] = []
    client = Client(URL, "token", transport=httpx.MockTransport(handler))
    created = client.submit(
        *code(tmp_path),
        retry_delay=0.001,
        on_retry=lambda error, delay: retried.append((error.code, delay)),
    )
    assert created == CREATED
    assert len(keys) == 5 and len(set(keys)) == 1 and 16 <= len(keys[0]) <= 200
    assert [kind for kind, _ in retried] == ["UNREACHABLE"] * 3 + ["E502"]
    assert [delay for _, delay in retried] == [0.001, 0.002, 0.004, 0.008]

    # Each submit has a key of its own; a given one is sent as it is.
    client.submit(*code(tmp_path))
    client.submit(*code(tmp_path), idempotency_key="mine")
    assert keys[5] != keys[0] and keys[6] == "mine"


def test_refusals_are_not_retried_and_retries_end(tmp_path: Path) -> None:
    calls: list[int] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(409, json={"error": "key reused", "code": "C409"})

    with pytest.raises(ApiError) as refused:
        Client(URL, None, transport=httpx.MockTransport(refuse)).submit(*code(tmp_path))
    assert (refused.value.status, len(calls)) == (409, 1)

    def unreachable(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        raise httpx.ConnectError("connection refused")

    calls.clear()
    client = Client(URL, None, transport=httpx.MockTransport(unreachable))
    with pytest.raises(ApiError) as lost:
        client.submit(*code(tmp_path), retries=2, retry_delay=0.001)
    assert (lost.value.code, len(calls)) == ("UNREACHABLE", 3)


UNAVAILABLE = {
    "code": 503,
    "error": "Service Unavailable",
    "description": "the platform's database is unreachable (db:5432: refused); retry",
    "ffdl_code": "S503",
}


def test_a_503_is_waited_out_as_retry_after_says_and_then_the_answer_returned() -> None:
    answers = [503, 503, 200]

    def handler(request: httpx.Request) -> httpx.Response:
        status = answers.pop(0)
        if status == 503:
            return httpx.Response(503, json=UNAVAILABLE, headers={"Retry-After": "0.01"})
        return httpx.Response(200, json={"models": [], "total": 0})

    notices: list[tuple[str, float]] = []
    client = Client(
        URL,
        "token",
        transport=httpx.MockTransport(handler),
        on_unavailable=lambda error, delay: notices.append((error.code, delay)),
    )
    assert client.list_models() == {"models": [], "total": 0}
    assert notices == [("S503", 0.01), ("S503", 0.01)]
    assert answers == []


def test_a_503_that_outlasts_the_wait_is_raised_with_its_message() -> None:
    calls: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(503, json=UNAVAILABLE)  # no Retry-After: doubling delays

    client = Client(URL, "token", transport=httpx.MockTransport(handler), unavailable_wait_s=0.3)
    with pytest.raises(ApiError) as away:
        client.get_model("training-abc12345")
    assert (away.value.status, away.value.code) == (503, "S503")
    assert "database is unreachable" in away.value.message
    assert len(calls) == 2, "one try, then one more after 0.3 s (the whole budget)"

    calls.clear()
    impatient = Client(URL, "token", transport=httpx.MockTransport(handler), unavailable_wait_s=0)
    with pytest.raises(ApiError):
        impatient.halt("training-abc12345")
    assert len(calls) == 1
