"""The pool worker's HTTP protocol (``worker.DrainingH11Protocol``) in a real uvicorn server
on 127.0.0.1: a keep-alive connection is ended, with ``Connection: close`` on a response,
once it has served for ``max_age_s``; a client following HTTP never sends on a closed one."""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from ffdl.server.pool.counters import LoadMiddleware, WorkerCounters
from ffdl.server.pool.worker import DrainingH11Protocol
from tests.integration.live import free_port, wait_for

MAX_AGE_S = 0.3


@pytest.fixture
def port() -> Iterator[int]:
    async def hello(_request: Request) -> PlainTextResponse:
        return PlainTextResponse("hello")

    app = LoadMiddleware(Starlette(routes=[Route("/", hello)]), WorkerCounters())
    protocol = type("AgedProtocol", (DrainingH11Protocol,), {"max_age_s": MAX_AGE_S})
    chosen = free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=chosen, http=protocol, lifespan="off", log_level="warning"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, timeout=10, what="uvicorn")
    try:
        yield chosen
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_a_connection_is_closed_after_max_age_on_a_response_that_says_so(port: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    opened = time.monotonic()
    answered = 0
    while True:
        conn.request("GET", "/")
        response = conn.getresponse()
        assert response.read() == b"hello"
        answered += 1
        if response.getheader("connection") == "close":
            break
        assert time.monotonic() - opened < MAX_AGE_S + 2, "never told to close"
    assert time.monotonic() - opened >= MAX_AGE_S and answered > 1
    conn.close()
    # The next connection serves as the first did.
    fresh = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    fresh.request("GET", "/")
    response = fresh.getresponse()
    assert response.read() == b"hello" and response.getheader("connection") is None
    fresh.close()
