"""A learner's code fetch outlasts an API that is away for a while (a control plane being
restarted), against a real HTTP server on 127.0.0.1 that starts listening seconds late."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ffdl.learner.remote_files import RemoteFileError, fetch_code
from tests.integration.live import free_port

ARCHIVE = b"PK\x05\x06" + b"\x00" * 18  # an empty zip archive
AWAY_S = 4.5  # past what three quick tries (over three seconds) would wait


class _CodeHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/zip")
        self.send_header("Content-Length", str(len(ARCHIVE)))
        self.end_headers()
        self.wfile.write(ARCHIVE)

    def log_message(self, format: str, *args: object) -> None:
        del format, args


@pytest.fixture
def late_api() -> Iterator[str]:
    """The URL of an API that answers only after ``AWAY_S``."""
    port = free_port()
    started: list[http.server.HTTPServer] = []

    def start() -> None:
        server = http.server.HTTPServer(("127.0.0.1", port), _CodeHandler)
        started.append(server)
        server.serve_forever()

    timer = threading.Timer(AWAY_S, start)
    timer.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        timer.cancel()
        for server in started:
            server.shutdown()
        timer.join()


def test_the_code_fetch_waits_out_an_api_that_is_away(late_api: str, tmp_path: Path) -> None:
    destination = tmp_path / "model.zip"

    size = fetch_code(late_api, "token", "training-late", str(destination))

    assert size == len(ARCHIVE) and destination.read_bytes() == ARCHIVE


def test_an_api_away_past_the_bound_fails_naming_the_tries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("ffdl.learner.remote_files.RETRY_FOR_S", 2.5)
    url = f"http://127.0.0.1:{free_port()}"

    with pytest.raises(
        RemoteFileError, match=r"ConnectionRefusedError.*\(tried 2 times over 1 s\)"
    ):
        fetch_code(url, "token", "training-away", str(tmp_path / "model.zip"))
    assert not list(tmp_path.iterdir())
