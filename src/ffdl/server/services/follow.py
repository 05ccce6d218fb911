"""Following a job as it runs: its new log lines, metrics and status events, until it stops.

One poll reads what was recorded after a :class:`Cursor` (log line and metric numbers, event
ids)
and moves the cursor past it; :func:`follow` repeats that until the job is terminal or
HALTED and everything it wrote has been read. Every live view of a job is built on it: the
Server-Sent Events stream, FfDL's log and metrics websockets and their streamed HTTP form.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from sqlalchemy import select

from ffdl.core.errors import Unavailable
from ffdl.core.status import JobStatus, is_terminal
from ffdl.server.platform import Platform
from ffdl.server.services.logs import plan_after
from ffdl.server.store.models import Event, Job, LogLine, Metric

POLL_S = 0.2
BATCH = 500
# The statuses on a job's way to running its command, and the stream of the lines the
# platform itself writes into a job's log (``[ffdl] ...``).
_OPENING = frozenset(
    status.value for status in (JobStatus.QUEUED, JobStatus.PENDING, JobStatus.DOWNLOADING)
)
PLATFORM_STREAM = "ffdl"


@dataclass
class Cursor:
    """The last log line, metric (their numbers in the job) and job event (its id) already
    delivered; 0 for none."""

    line: int = 0
    metric: int = 0
    event_id: int = 0


@dataclass
class Batch:
    """What one poll found; ``ended`` is the job's final status once nothing is left."""

    job: Job | None = None
    lines: list[LogLine] = field(default_factory=list)
    metrics: list[Metric] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    ended: str | None = None
    drained: bool = True

    @property
    def empty(self) -> bool:
        return not (self.lines or self.metrics or self.events)

    def in_order(self) -> list[tuple[str, LogLine | Metric | Event]]:
        """The batch's records as a reader should see them: ``("status", event)``,
        ``("log", line)`` and ``("emetric", metric)``.

        Status events and output live in separate tables, and a job's status event is
        recorded when the platform folds its learners' reports, after the lines that came
        with them. So each status goes where the job's life puts it: the way in (up to
        DOWNLOADING) before the batch's lines, PROCESSING just before the first line the
        command printed (after the platform's own lines about staging), and the way out
        (STORING, the ends, halts, rescales) after the batch's lines and metrics.
        """
        opening = [e for e in self.events if e.to_status in _OPENING]
        processing = [e for e in self.events if e.to_status == JobStatus.PROCESSING.value]
        closing = [e for e in self.events if e not in opening and e not in processing]
        first_output = next(
            (i for i, line in enumerate(self.lines) if line.stream != PLATFORM_STREAM),
            len(self.lines),
        )
        ordered: list[tuple[str, LogLine | Metric | Event]] = [("status", e) for e in opening]
        ordered += [("log", line) for line in self.lines[:first_output]]
        ordered += [("status", e) for e in processing]
        ordered += [("log", line) for line in self.lines[first_output:]]
        ordered += [("emetric", metric) for metric in self.metrics]
        ordered += [("status", e) for e in closing]
        return ordered


@dataclass(frozen=True)
class Wanted:
    """Which records a follower delivers."""

    lines: bool = True
    metrics: bool = True
    events: bool = True


def poll(platform: Platform, job_id: str, cursor: Cursor, wanted: Wanted = Wanted()) -> Batch:
    """Read what was recorded after ``cursor`` (at most ``BATCH`` of each kind) and advance it."""
    batch = Batch()
    with platform.store.read() as session:
        job = session.get(Job, job_id)
        status = job.status if job is not None else JobStatus.CANCELLED.value
        batch.job = job
        if wanted.events:
            batch.events = list(
                session.scalars(
                    select(Event)
                    .where(
                        Event.job_id == job_id, Event.id > cursor.event_id, Event.learner.is_(None)
                    )
                    .order_by(Event.id)
                )
            )
        lines = plan_after(session, LogLine, job, cursor.line, BATCH) if job else None
        metrics = plan_after(session, Metric, job, cursor.metric, BATCH) if job else None
    # Archived records (a follow from a job's beginning once it is archived) are fetched
    # here, outside the session.
    if wanted.lines and lines is not None:
        batch.lines = lines.resolve(platform.archive)
    if wanted.metrics and metrics is not None:
        batch.metrics = metrics.resolve(platform.archive)
    if batch.lines:
        cursor.line = batch.lines[-1].number
    if batch.metrics:
        cursor.metric = batch.metrics[-1].number
    if batch.events:
        cursor.event_id = batch.events[-1].id
    batch.drained = len(batch.lines) < BATCH and len(batch.metrics) < BATCH
    stopped = is_terminal(JobStatus(status)) or status == JobStatus.HALTED.value
    if stopped and batch.drained:
        batch.ended = status
    return batch


async def follow(
    platform: Platform,
    job_id: str,
    cursor: Cursor,
    wanted: Wanted = Wanted(),
    *,
    keepalive_s: float | None = None,
) -> AsyncIterator[Batch]:
    """Batches of new records until the job stops; the last one has ``ended`` set.

    With ``keepalive_s``, an empty batch comes after that long without news (for a stream
    that must show it is alive). While the database is away the follower waits, keeping
    the stream alive, and goes on from its cursor once it is back: nothing is skipped.
    """
    idle = 0.0
    job: Job | None = None
    while True:
        try:
            batch = await asyncio.to_thread(poll, platform, job_id, cursor, wanted)
        except Unavailable:
            batch = Batch(job=job)  # the store logged the outage; poll again shortly
        job = batch.job
        if not batch.empty or batch.ended is not None:
            yield batch
            idle = 0.0
            if batch.ended is not None:
                return
            if not batch.drained:
                continue
        await asyncio.sleep(POLL_S)
        idle += POLL_S
        if keepalive_s is not None and idle >= keepalive_s:
            yield Batch(job=batch.job)
            idle = 0.0
