"""``/v1/models/{id}/events/stream``: log lines, metrics and status changes as Server-Sent Events.

The stream ends with an ``end`` event once the job is terminal or HALTED and everything it
wrote has been sent. ``since_rindex`` resumes after the last log line a client saw.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from ffdl.server.routers.deps import PlatformDep, PrincipalDep
from ffdl.server.routers.responses import AUTHENTICATED, errors, event_stream
from ffdl.server.services.follow import Batch, Cursor, follow
from ffdl.server.services.logs import log_item, metric_item
from ffdl.server.services.queries import iso, load_job

router = APIRouter(prefix="/v1/models", tags=["models"], responses=AUTHENTICATED)

_KEEPALIVE_S = 10.0


def _frame(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n"


def _frames(batch: Batch) -> list[str]:
    frames = []
    if batch.job is not None:
        frames += [_frame("log", log_item(batch.job, line)) for line in batch.lines]
        frames += [_frame("emetric", metric_item(batch.job, row)) for row in batch.metrics]
    for event in batch.events:
        status = {"status": event.to_status, "reason": event.reason, "time": iso(event.created_at)}
        frames.append(_frame("status", status))
    return frames


@router.get(
    "/{model_id}/events/stream",
    response_class=StreamingResponse,
    responses={
        **event_stream(
            ["log", "emetric", "status", "end"],
            "`log`, `emetric` and `status` events, then `end` once the job stops",
        ),
        **errors(400, 404),
    },
)
async def stream_events(
    platform: PlatformDep, principal: PrincipalDep, model_id: str, since_rindex: int = 0
) -> StreamingResponse:
    def check() -> None:
        with platform.store.read() as session:
            load_job(session, principal, model_id)

    await asyncio.to_thread(check)

    async def frames() -> AsyncIterator[str]:
        cursor = Cursor(log_id=since_rindex)
        async for batch in follow(platform, model_id, cursor, keepalive_s=_KEEPALIVE_S):
            if batch.empty and batch.ended is None:
                yield ": keep-alive\n\n"
                continue
            for frame in _frames(batch):
                yield frame
            if batch.ended is not None:
                yield _frame("end", {"status": batch.ended})

    return StreamingResponse(
        frames(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
