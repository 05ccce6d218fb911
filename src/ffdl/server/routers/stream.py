"""``/v1/models/{id}/events/stream``: log lines, metrics and status changes as Server-Sent Events.

The stream ends with an ``end`` event once the job is terminal or HALTED and everything it
wrote has been sent. ``since_rindex`` resumes after the last log line a client saw.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter
from fastapi.responses import StreamingResponse
from sqlalchemy import select

from ffdl.core.status import JobStatus, is_terminal
from ffdl.server.platform import Platform
from ffdl.server.routers.deps import PlatformDep, PrincipalDep
from ffdl.server.routers.responses import AUTHENTICATED, errors, event_stream
from ffdl.server.services.logs import lines_after, log_item, metric_item, metrics_after
from ffdl.server.services.queries import iso, load_job
from ffdl.server.store.models import Event, Job

router = APIRouter(prefix="/v1/models", tags=["models"], responses=AUTHENTICATED)

_POLL_S = 0.2
_KEEPALIVE_S = 10.0
_BATCH = 500


@dataclass
class _Cursor:
    log_id: int
    metric_id: int = 0
    event_id: int = 0
    frames: list[str] = field(default_factory=list)


def _frame(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n"


def _poll(platform: Platform, job_id: str, cursor: _Cursor) -> str | None:
    """Collect new frames into ``cursor``; return the job's status when it has ended."""
    with platform.store.read() as session:
        job = session.get(Job, job_id)
        status = job.status if job is not None else JobStatus.CANCELLED.value
        events = session.scalars(
            select(Event)
            .where(Event.job_id == job_id, Event.id > cursor.event_id, Event.learner.is_(None))
            .order_by(Event.id)
        ).all()
        lines = lines_after(session, job_id, cursor.log_id, _BATCH)
        metrics = metrics_after(session, job_id, cursor.metric_id, _BATCH)
    for line in lines:
        cursor.frames.append(_frame("log", log_item(job_id, line)))
        cursor.log_id = line.id
    for metric in metrics:
        cursor.frames.append(_frame("emetric", metric_item(job_id, metric)))
        cursor.metric_id = metric.id
    for event in events:
        cursor.frames.append(
            _frame(
                "status",
                {"status": event.to_status, "reason": event.reason, "time": iso(event.created_at)},
            )
        )
        cursor.event_id = event.id
    drained = len(lines) < _BATCH and len(metrics) < _BATCH
    finished = is_terminal(JobStatus(status)) or status == JobStatus.HALTED.value
    return status if finished and drained else None


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
        cursor = _Cursor(log_id=since_rindex)
        idle = 0.0
        while True:
            ended = await asyncio.to_thread(_poll, platform, model_id, cursor)
            if cursor.frames:
                for frame in cursor.frames:
                    yield frame
                cursor.frames.clear()
                idle = 0.0
            if ended is not None:
                yield _frame("end", {"status": ended})
                return
            await asyncio.sleep(_POLL_S)
            idle += _POLL_S
            if idle >= _KEEPALIVE_S:
                yield ": keep-alive\n\n"
                idle = 0.0

    return StreamingResponse(
        frames(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
