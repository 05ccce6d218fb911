"""The HTTP client against in-process fake servers: requests, parsing, errors, event streams."""

from __future__ import annotations

import io
import json
import socket
import zipfile
from collections.abc import Callable, Iterator
from email.parser import BytesParser
from email.policy import HTTP
from pathlib import Path
from typing import Any

import httpx
import pytest

from ffdl.client.http import ApiError, Client, FollowEvent, iter_sse
from ffdl.core.errors import ArchiveError, BadRequest

URL = "http://ffdl.test"
TOKEN = "secret-token"
MODEL_ID = "training-abc12345"

Handler = Callable[[httpx.Request], httpx.Response]


def make_client(handler: Handler, token: str | None = TOKEN) -> Client:
    return Client(URL, token, transport=httpx.MockTransport(handler))


def multipart_files(request: httpx.Request) -> dict[str, tuple[str, bytes]]:
    """``field -> (filename, content)`` of a multipart/form-data request."""
    head = f"Content-Type: {request.headers['content-type']}\r\n\r\n".encode()
    message = BytesParser(policy=HTTP).parsebytes(head + request.read())
    files: dict[str, tuple[str, bytes]] = {}
    for part in message.iter_parts():
        payload = part.get_payload(decode=True)
        assert isinstance(payload, bytes)
        files[str(part.get_param("name", header="content-disposition"))] = (
            str(part.get_filename()),
            payload,
        )
    return files


def sse(*events: tuple[str, dict[str, Any]], keepalive: bool = False) -> bytes:
    chunks = [": keep-alive\n\n"] if keepalive else []
    chunks += [f"event: {kind}\ndata: {json.dumps(data)}\n\n" for kind, data in events]
    return "".join(chunks).encode()


def log(rindex: int) -> tuple[str, dict[str, Any]]:
    meta = {"training_id": MODEL_ID, "time": 1000 + rindex, "rindex": rindex, "learner": 1}
    return ("log", {"meta": meta, "line": f"line {rindex}"})


class DroppedStream(httpx.SyncByteStream):
    """A response body that breaks off like a reset connection after its chunks."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    def __iter__(self) -> Iterator[bytes]:
        yield self.body
        raise httpx.ReadError("connection reset by peer")


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# -- requests and responses ---------------------------------------------------------------


def test_health_sends_bearer_token_and_returns_body() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"status": "ok", "version": "0.1.0"})

    with make_client(handler) as client:
        assert client.health() == {"status": "ok", "version": "0.1.0"}
    assert seen[0].url.path == "/health"
    assert seen[0].headers["authorization"] == f"Bearer {TOKEN}"


def test_no_token_sends_no_authorization_header() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert "authorization" not in request.headers
        return httpx.Response(200, json={"status": "ok", "version": "x"})

    assert make_client(handler, token=None).health()["status"] == "ok"


def test_submit_directory_uploads_manifest_and_zipped_code(tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.yml"
    manifest.write_text("name: digits\nframework:\n  command: python train.py\n")
    code = tmp_path / "code"
    (code / "pkg").mkdir(parents=True)
    (code / "train.py").write_text("print('hi')\n")
    (code / "pkg" / "model.py").write_text("X = 1\n")
    for skipped in ("__pycache__", ".git", ".venv"):
        (code / skipped).mkdir()
        (code / skipped / "junk").write_text("junk")
    created = {
        "model_id": MODEL_ID,
        "location": f"/v1/models/{MODEL_ID}",
        "status": "QUEUED",
        "warnings": ["memory rounded up"],
    }
    uploads: dict[str, tuple[str, bytes]] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        assert (request.method, request.url.path) == ("POST", "/v1/models")
        uploads.update(multipart_files(request))
        return httpx.Response(201, json=created)

    assert make_client(handler).submit(manifest, code) == created
    assert uploads["manifest"] == ("manifest.yml", manifest.read_bytes())
    with zipfile.ZipFile(io.BytesIO(uploads["model_definition"][1])) as archive:
        assert sorted(archive.namelist()) == ["pkg/model.py", "train.py"]
        assert archive.read("train.py") == b"print('hi')\n"


def test_submit_zip_is_uploaded_unchanged(tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.yml"
    manifest.write_text("name: digits\n")
    code_zip = tmp_path / "model.zip"
    with zipfile.ZipFile(code_zip, "w") as archive:
        archive.writestr("train.py", "print('zip')\n")
    uploads: dict[str, tuple[str, bytes]] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        uploads.update(multipart_files(request))
        return httpx.Response(201, json={"model_id": MODEL_ID, "warnings": []})

    make_client(handler).submit(manifest, code_zip)
    assert uploads["model_definition"][1] == code_zip.read_bytes()


def test_submit_rejects_missing_manifest_and_non_zip_code(tmp_path: Path) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise AssertionError("nothing may be sent")

    client = make_client(handler)
    not_zip = tmp_path / "notes.txt"
    not_zip.write_text("not a zip")
    with pytest.raises(BadRequest, match="cannot read manifest") as missing:
        client.submit(tmp_path / "missing.yml", tmp_path)
    assert missing.value.code == "C101"
    manifest = tmp_path / "manifest.yml"
    manifest.write_text("name: x\n")
    with pytest.raises(ArchiveError, match="neither a directory nor a zip"):
        client.submit(manifest, not_zip)


def test_list_models_sends_filters_as_query() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/models"
        assert dict(request.url.params) == {"status": "QUEUED", "limit": "5", "offset": "10"}
        return httpx.Response(200, json={"models": [{"model_id": MODEL_ID}], "total": 11})

    body = make_client(handler).list_models(status="QUEUED", limit=5, offset=10)
    assert body["total"] == 11


@pytest.mark.parametrize(
    ("call", "expected_body"),
    [
        (lambda c: c.halt(MODEL_ID), {"status": "halt"}),
        (lambda c: c.resume(MODEL_ID), {"status": "resume"}),
        (lambda c: c.set_priority(MODEL_ID, 7), {"priority": 7}),
        (lambda c: c.scale(MODEL_ID, 4), {"gpus": 4}),
    ],
)
def test_patch_operations_send_contract_bodies(
    call: Callable[[Client], dict[str, Any]], expected_body: dict[str, Any]
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert (request.method, request.url.path) == ("PATCH", f"/v1/models/{MODEL_ID}")
        assert json.loads(request.content) == expected_body
        return httpx.Response(202, json={"model_id": MODEL_ID, "priority": 7})

    assert call(make_client(handler))["model_id"] == MODEL_ID


def test_get_and_delete_model() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "DELETE":
            return httpx.Response(
                200, json={"model_id": MODEL_ID, "status": "CANCELLED", "deleted": False}
            )
        return httpx.Response(200, json={"model_id": MODEL_ID, "name": "digits"})

    client = make_client(handler)
    assert client.get_model(MODEL_ID)["name"] == "digits"
    assert client.delete(MODEL_ID) == {
        "model_id": MODEL_ID,
        "status": "CANCELLED",
        "deleted": False,
    }


def test_model_id_cannot_escape_its_path() -> None:
    paths: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.raw_path.decode())
        return httpx.Response(200, json={})

    make_client(handler).get_model("../health")
    assert paths == ["/v1/models/..%2Fhealth"]


def test_loglines_and_emetrics_pass_paging_and_return_items() -> None:
    line = {"meta": {"training_id": MODEL_ID, "time": 1, "rindex": 1, "learner": 1}, "line": "a"}
    record = {
        "meta": {"training_id": MODEL_ID, "time": 1, "rindex": 1},
        "grouplabel": "test",
        "etimes": {"iteration": {"type": "INT", "value": "5"}},
        "values": {"accuracy": {"type": "FLOAT", "value": "0.97"}},
    }

    def handler(request: httpx.Request) -> httpx.Response:
        params = dict(request.url.params)
        if request.url.path == f"/v1/logs/{MODEL_ID}/loglines":
            assert params == {"since_time": "2024-01-01T00:00:00Z", "pagesize": "10", "pos": "-5"}
            return httpx.Response(200, json={"models": [line]})
        assert request.url.path == f"/v1/logs/{MODEL_ID}/emetrics"
        assert params == {}
        return httpx.Response(200, json={"models": [record]})

    client = make_client(handler)
    assert client.loglines(MODEL_ID, "2024-01-01T00:00:00Z", pagesize=10, pos=-5) == [line]
    assert client.emetrics(MODEL_ID) == [record]


def test_pages_of_an_older_server_are_read_too() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        key = "lines" if request.url.path.endswith("/loglines") else "records"
        return httpx.Response(200, json={key: [{"line": "x"}, "not a record"]})

    client = make_client(handler)
    assert client.loglines(MODEL_ID) == [{"line": "x"}]
    assert client.emetrics(MODEL_ID) == [{"line": "x"}]


# -- errors -------------------------------------------------------------------------------


def test_error_body_becomes_api_error() -> None:
    detail = {"field": "framework.command", "reason": "is required"}

    def handler(request: httpx.Request) -> httpx.Response:
        body = {
            "code": 400,
            "error": "Bad Request",
            "description": "invalid manifest: framework.command: is required",
            "ffdl_code": "C101",
            "detail": detail,
        }
        return httpx.Response(400, json=body)

    with pytest.raises(ApiError) as caught:
        make_client(handler).list_models()
    error = caught.value
    assert (error.status, error.code, error.detail) == (400, "C101", detail)
    assert error.message == "invalid manifest: framework.command: is required"


@pytest.mark.parametrize(
    ("body", "code", "message"),
    [
        # An older ffdl server: the message in ``error``, its code in ``code``.
        ({"error": "no such model", "code": "C404", "detail": None}, "C404", "no such model"),
        # FfDL's own server: an empty description, the status phrase in ``error``.
        ({"code": 404, "error": "Not found", "description": ""}, "HTTP404", "Not found"),
    ],
)
def test_other_error_bodies_become_api_errors(
    body: dict[str, Any], code: str, message: str
) -> None:
    with pytest.raises(ApiError) as caught:
        make_client(lambda request: httpx.Response(404, json=body)).get_model(MODEL_ID)
    assert (caught.value.status, caught.value.code, caught.value.message) == (404, code, message)


@pytest.mark.parametrize(
    ("response", "code", "message"),
    [
        (httpx.Response(502, text="Bad Gateway from proxy"), "HTTP502", "Bad Gateway from proxy"),
        (httpx.Response(404, json={"detail": "Not Found"}), "HTTP404", "Not Found"),
        (
            httpx.Response(422, json={"detail": [{"loc": ["query", "limit"]}]}),
            "HTTP422",
            "request rejected (422)",
        ),
    ],
)
def test_non_contract_errors_still_map_to_api_error(
    response: httpx.Response, code: str, message: str
) -> None:
    with pytest.raises(ApiError) as caught:
        make_client(lambda request: response).get_model(MODEL_ID)
    assert (caught.value.code, caught.value.message) == (code, message)


def test_refused_connection_names_the_server_url() -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    with Client(url, TOKEN, timeout=5.0) as client, pytest.raises(ApiError) as caught:
        client.health()
    assert caught.value.code == "UNREACHABLE"
    assert caught.value.status == 0
    assert f"the ffdl server at {url} is unreachable" in caught.value.message


def test_non_json_success_body_is_an_api_error() -> None:
    with pytest.raises(ApiError, match="no JSON"):
        make_client(lambda request: httpx.Response(200, text="<html>")).health()


# -- downloads ----------------------------------------------------------------------------


def test_download_streams_to_destination(tmp_path: Path) -> None:
    payload = b"PK\x03\x04" + bytes(range(256)) * 1000

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == f"/v1/models/{MODEL_ID}/trained_model"
        return httpx.Response(200, content=payload, headers={"content-type": "application/zip"})

    dest = tmp_path / "out" / "model.zip"
    assert make_client(handler).download_trained_model(MODEL_ID, dest) == dest
    assert dest.read_bytes() == payload


def test_failed_download_leaves_no_file(tmp_path: Path) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == f"/v1/models/{MODEL_ID}/definition"
        return httpx.Response(
            404,
            json={
                "code": 404,
                "error": "Not Found",
                "description": "no such model",
                "ffdl_code": "C404",
            },
        )

    dest = tmp_path / "def.zip"
    with pytest.raises(ApiError) as caught:
        make_client(handler).download_definition(MODEL_ID, dest)
    assert caught.value.code == "C404"
    assert list(tmp_path.iterdir()) == []


def test_download_broken_midway_removes_partial_file(tmp_path: Path) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=DroppedStream(b"PK partial"))

    with pytest.raises(ApiError, match="failed"):
        make_client(handler).download_trained_model(MODEL_ID, tmp_path / "m.zip")
    assert list(tmp_path.iterdir()) == []


# -- server-sent events -------------------------------------------------------------------


def test_iter_sse_parses_events_comments_and_multiline_data() -> None:
    lines = [": ping", "", "event: log", 'data: {"a":', "data: 1}", "", "data: x", "", "event: y"]
    assert list(iter_sse(lines)) == [None, ("log", '{"a":\n1}'), ("message", "x")]


def test_follow_yields_events_until_end() -> None:
    status = ("status", {"status": "PROCESSING", "reason": "started", "time": "t"})
    metric = ("emetric", {"grouplabel": "train", "etimes": {}, "values": {}})
    body = sse(status, log(1), metric, ("end", {"status": "COMPLETED"}), keepalive=True)
    body += sse(log(2))  # anything after `end` is not read

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == f"/v1/models/{MODEL_ID}/events/stream"
        assert request.url.params["since_rindex"] == "0"
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    events = list(make_client(handler).follow(MODEL_ID))
    assert [e.kind for e in events] == ["status", "log", "emetric", "end"]
    assert events[-1] == FollowEvent("end", {"status": "COMPLETED"})
    assert events[1].data["line"] == "line 1"


@pytest.mark.parametrize("dropped", [True, False], ids=["reset", "closed-early"])
def test_follow_reconnects_from_last_rindex_without_duplicates(dropped: bool) -> None:
    requested_from: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requested_from.append(request.url.params["since_rindex"])
        if len(requested_from) == 1:
            first = sse(log(1), log(2))
            if dropped:
                return httpx.Response(200, stream=DroppedStream(first))
            return httpx.Response(200, content=first)
        # An inclusive server resends line 2; the client must not show it twice.
        return httpx.Response(200, content=sse(log(2), log(3), ("end", {"status": "FAILED"})))

    events = list(make_client(handler).follow(MODEL_ID, retry_delay=0))
    assert [e.data.get("line") for e in events if e.kind == "log"] == ["line 1", "line 2", "line 3"]
    assert events[-1].data == {"status": "FAILED"}
    assert requested_from == ["0", "2"]


def test_follow_gives_up_when_server_stays_unreachable() -> None:
    attempts: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        attempts.append(1)
        if len(attempts) == 1:
            return httpx.Response(200, content=sse(log(1)))
        raise httpx.ConnectError("connection refused")

    events: list[FollowEvent] = []
    with pytest.raises(ApiError, match="lost the event stream") as caught:
        for event in make_client(handler).follow(MODEL_ID, reconnect_window=0.3, retry_delay=0.01):
            events.append(event)
    assert caught.value.code == "UNREACHABLE"
    assert [e.kind for e in events] == ["log"]
    assert len(attempts) > 2


def test_follow_http_error_is_raised_without_retry() -> None:
    attempts: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        attempts.append(1)
        return httpx.Response(404, json={"error": f"model {MODEL_ID} not found", "code": "C404"})

    with pytest.raises(ApiError) as caught:
        list(make_client(handler).follow(MODEL_ID, retry_delay=0))
    assert caught.value.code == "C404"
    assert attempts == [1]


def test_follow_deadline_stops_an_endless_stream() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=sse(log(1)))

    with pytest.raises(ApiError, match="did not end within") as caught:
        list(make_client(handler).follow(MODEL_ID, retry_delay=0.01, deadline=0.2))
    assert caught.value.code == "TIMEOUT"
