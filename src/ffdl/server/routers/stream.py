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
from ffdl.server.store.models import Event, LogLine, Metric

router = APIRouter(prefix="/v1/models", tags=["models"], responses=AUTHENTICATED)

_KEEPALIVE_S = 10.0


def _frame(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n"


def _frames(batch: Batch) -> list[str]:
    frames = []
    for kind, record in batch.in_order():
        if isinstance(record, Event):
            status = {
                "status": record.to_status,
                "reason": record.reason,
                "time": iso(record.created_at),
            }
            frames.append(_frame("status", status))
        elif batch.job is not None and isinstance(record, LogLine):
            frames.append(_frame(kind, log_item(batch.job, record)))
        elif batch.job is not None and isinstance(record, Metric):
            frames.append(_frame(kind, metric_item(batch.job, record)))
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
        cursor = Cursor(line=since_rindex)
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
