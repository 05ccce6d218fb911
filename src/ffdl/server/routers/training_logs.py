"""``/v1/models/{id}/logs`` and ``/metrics``: a job's log and metrics as FfDL served them.

- ``GET .../logs``: the recorded log lines as text (``application/octet-stream``, one line
  per line); with ``follow=true`` the answer streams on until the job stops.
- ``GET .../metrics``: the metrics records, one JSON object (FfDL's ``MetricData``) per line.
- A websocket on either path (what FfDL's ``logs --follow`` opens) sends the recorded lines
  (or records) and then the live ones until the job stops, and closes normally (1000).
  Each log message holds one or more whole lines; each metrics message one record.

``since_time`` (epoch milliseconds, ISO 8601/RFC 3339, or ``-N`` for the last N records)
starts later than the beginning. All of it follows the job with ``services/follow.py``, the
same follower as the Server-Sent Events stream. A websocket authenticates like any request
(its ``Authorization`` header); a refused one gets the usual error answer instead of the
upgrade.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Query, WebSocket
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.websockets import WebSocketDisconnect

from ffdl.core.errors import FfdlError
from ffdl.server.auth import Principal
from ffdl.server.platform import Platform
from ffdl.server.routers.deps import PlatformDep, PrincipalDep, connection_principal
from ffdl.server.routers.ffdl_params import FFDL_QUERY
from ffdl.server.routers.responses import AUTHENTICATED, content, errors
from ffdl.server.services.follow import Batch, Cursor, Wanted, follow, poll
from ffdl.server.services.logs import first_row_at, metric_data, parse_since_time
from ffdl.server.services.queries import load_job
from ffdl.server.store.models import LogLine, Metric

router = APIRouter(
    prefix="/v1/models",
    tags=["models"],
    responses={**AUTHENTICATED, **errors(400, 404)},
    dependencies=FFDL_QUERY,
)

STREAM_TYPE = "application/octet-stream"
LINES = Wanted(lines=True, metrics=False, events=False)
METRICS = Wanted(lines=False, metrics=True, events=False)
# The sub-protocol FfDL's command-line client asks for; echoed when offered.
FFDL_SUBPROTOCOL = "ws"

Follow = Annotated[bool, Query(description="Stream on until the job stops (default false).")]
SinceTime = Annotated[
    str | None,
    Query(
        description=(
            "Start at this time (epoch milliseconds or ISO 8601/RFC 3339), or -N for the "
            "last N records; the beginning when absent."
        )
    ),
]


def _log_text(batch: Batch) -> str:
    return "".join(f"{line.text}\n" for line in batch.lines)


def _metric_lines(batch: Batch) -> list[str]:
    return [json.dumps(metric_data(row)) for row in batch.metrics]


def _start(
    platform: Platform, principal: Principal, model_id: str, since_time: str | None, model: Any
) -> Cursor:
    """The caller's job checked, and the cursor just before its first record to send."""
    since = parse_since_time(since_time)
    with platform.store.read() as session:
        job_id = load_job(session, principal, model_id).id
    first = first_row_at(platform.store, platform.archive, model, job_id, since)
    return Cursor(line=first) if model is LogLine else Cursor(metric=first)


async def _batches(
    platform: Platform, model_id: str, cursor: Cursor, wanted: Wanted, following: bool
) -> AsyncIterator[Batch]:
    """The job's records after ``cursor``: those recorded so far, or (``following``) on
    until the job stops."""
    if following:
        async for batch in follow(platform, model_id, cursor, wanted):
            yield batch
        return
    while True:
        batch = await asyncio.to_thread(poll, platform, model_id, cursor, wanted)
        yield batch
        if batch.drained:
            return


def _streamed(
    platform: Platform,
    model_id: str,
    cursor: Cursor,
    wanted: Wanted,
    following: bool,
    render: Callable[[Batch], str],
) -> StreamingResponse:
    async def chunks() -> AsyncIterator[bytes]:
        async for batch in _batches(platform, model_id, cursor, wanted, following):
            text = render(batch)
            if text:
                yield text.encode()

    return StreamingResponse(
        chunks(), media_type=STREAM_TYPE, headers={"Cache-Control": "no-cache"}
    )


@router.get(
    "/{model_id}/logs",
    response_class=StreamingResponse,
    responses=content(STREAM_TYPE, binary=True, description="The job's log lines as text"),
)
async def get_logs(
    platform: PlatformDep,
    principal: PrincipalDep,
    model_id: str,
    follow: Follow = False,
    since_time: SinceTime = None,
) -> StreamingResponse:
    cursor = await asyncio.to_thread(_start, platform, principal, model_id, since_time, LogLine)
    return _streamed(platform, model_id, cursor, LINES, follow, _log_text)


@router.get(
    "/{model_id}/metrics",
    response_class=StreamingResponse,
    responses=content(
        STREAM_TYPE,
        binary=True,
        description="The job's metrics records, one JSON object (FfDL's MetricData) per line",
    ),
)
async def get_metrics(
    platform: PlatformDep,
    principal: PrincipalDep,
    model_id: str,
    follow: Follow = False,
    since_time: SinceTime = None,
) -> StreamingResponse:
    cursor = await asyncio.to_thread(_start, platform, principal, model_id, since_time, Metric)
    return _streamed(
        platform,
        model_id,
        cursor,
        METRICS,
        follow,
        lambda batch: "".join(f"{line}\n" for line in _metric_lines(batch)),
    )


async def _refuse(websocket: WebSocket, error: FfdlError) -> None:
    """Answer a websocket handshake with the error (or, where the server cannot send an HTTP
    answer there, close it with a policy violation)."""
    answer = JSONResponse(error.to_json(), status_code=error.http_status, headers=error.headers)
    try:
        await websocket.send_denial_response(answer)
    except RuntimeError:
        await websocket.close(code=1008, reason=error.message[:120])


async def _until_disconnected(websocket: WebSocket) -> None:
    with contextlib.suppress(WebSocketDisconnect):
        while (await websocket.receive())["type"] != "websocket.disconnect":
            pass


async def _send_followed(
    websocket: WebSocket, platform: Platform, model_id: str, cursor: Cursor, metrics: bool
) -> None:
    wanted = METRICS if metrics else LINES
    async for batch in follow(platform, model_id, cursor, wanted):
        if metrics:
            for message in _metric_lines(batch):
                await websocket.send_text(message)
        elif batch.lines:
            await websocket.send_text(_log_text(batch))


async def _serve_socket(
    websocket: WebSocket, model_id: str, since_time: str | None, *, metrics: bool
) -> None:
    platform: Platform = websocket.app.state.platform

    def start() -> Cursor:
        principal = connection_principal(platform, websocket)
        return _start(platform, principal, model_id, since_time, Metric if metrics else LogLine)

    try:
        cursor = await asyncio.to_thread(start)
    except FfdlError as error:
        await _refuse(websocket, error)
        return
    offered = websocket.scope.get("subprotocols") or []
    await websocket.accept(subprotocol=FFDL_SUBPROTOCOL if FFDL_SUBPROTOCOL in offered else None)
    sender = asyncio.create_task(_send_followed(websocket, platform, model_id, cursor, metrics))
    watcher = asyncio.create_task(_until_disconnected(websocket))
    done, pending = await asyncio.wait({sender, watcher}, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    if sender in done and sender.exception() is None and watcher not in done:
        with contextlib.suppress(Exception):
            await websocket.close(code=1000)


@router.websocket("/{model_id}/logs")
async def follow_logs(websocket: WebSocket, model_id: str, since_time: SinceTime = None) -> None:
    await _serve_socket(websocket, model_id, since_time, metrics=False)


@router.websocket("/{model_id}/metrics")
async def follow_metrics(websocket: WebSocket, model_id: str, since_time: SinceTime = None) -> None:
    await _serve_socket(websocket, model_id, since_time, metrics=True)
