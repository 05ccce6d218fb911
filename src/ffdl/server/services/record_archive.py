"""Retention of log lines and metrics: an ended job's records move out of the database into
the archive store as compressed chunks, and are read back from there.

A chunk holds up to ``archive_chunk_records`` records of one kind (``log`` or ``metric``) of
one job, numbered ``first..last`` without gaps, as gzip'd JSON lines at
``records/<job>/<kind>-<first>-<last>.jsonl.gz``, described by a ``RecordChunk`` row. Moving
one takes three steps, and no transaction is held over the store's I/O:

1. one read takes the rows after the job's mark (``Job.archived_line_number`` or
   ``archived_metric_number``);
2. the object is written, outside any session;
3. one write, under the job's row lock and only if the mark has not moved, inserts the
   chunk's row, deletes the rows and raises the mark.

A crash between two steps leaves at most an object nothing points to, which the next try
writes again with the same bytes. So at every commit, a job's records numbered up to its
mark are in its chunks and the rest in the database: a reader that reads the mark, the
chunks' rows and the database rows in one snapshot sees each record once
(``ffdl.server.services.logs``). A job's newest metrics record stays in the database, for the
model's summary.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from sqlalchemy import delete, or_, select
from sqlalchemy.orm import Session

from ffdl.core.status import TERMINAL_JOB_STATES
from ffdl.server.archive import (
    RecordArchive,
    archived_mark,
    chunk_key,
    encode_chunk,
    kind_of,
    last_number,
)
from ffdl.server.platform import Platform
from ffdl.server.settings import Settings
from ffdl.server.store.db import Store
from ffdl.server.store.models import Job, LogLine, Metric, RecordChunk
from ffdl.server.store.transitions import utcnow
from ffdl.server.telemetry.instruments import ARCHIVE_FAILURES, ARCHIVED_RECORDS
from ffdl.storage.base import StorageError

log = logging.getLogger("ffdl.archive")

# Jobs looked at in one pass; a pass that finds more wakes the loop again.
JOBS_PER_PASS = 20


def due_jobs(session: Session, settings: Settings, limit: int) -> list[str]:
    """Ended jobs whose records are due to move: ended ``archive_records_after_h`` ago and
    holding records after their marks (the newest metric always stays)."""
    hours = settings.archive_records_after_h
    if hours is None:
        return []
    cutoff = utcnow() - timedelta(hours=hours)
    return list(
        session.scalars(
            select(Job.id)
            .where(
                Job.status.in_([s.value for s in TERMINAL_JOB_STATES]),
                Job.finished_at.is_not(None),
                Job.finished_at < cutoff,
                or_(
                    Job.last_line_number > Job.archived_line_number,
                    Job.last_metric_number - 1 > Job.archived_metric_number,
                ),
            )
            .order_by(Job.finished_at)
            .limit(limit)
        )
    )


def _movable_end(job: Job, model: Any, chunk_records: int) -> int:
    keep_newest = 1 if model is Metric else 0
    return min(archived_mark(job, model) + chunk_records, last_number(job, model) - keep_newest)


def move_chunk(
    store: Store, archive: RecordArchive, job_id: str, model: Any, chunk_records: int
) -> int:
    """Move the next chunk (up to ``chunk_records``) of ``job_id``'s records of ``model``
    to the archive; the number of records moved (0 when none are due, or another replica
    moved them first)."""
    kind = kind_of(model)
    with store.read() as session:
        job = session.get(Job, job_id)
        if job is None:
            return 0
        mark = archived_mark(job, model)
        end = _movable_end(job, model, chunk_records)
        if end <= mark:
            return 0
        rows = list(
            session.scalars(
                select(model)
                .where(model.job_id == job_id, model.number > mark, model.number <= end)
                .order_by(model.number)
            )
        )
    if [r.number for r in rows] != list(range(mark + 1, end + 1)):
        log.warning(
            "%s's %s records %d..%d are not all stored; not archived", job_id, kind, mark + 1, end
        )
        return 0
    key = chunk_key(job_id, kind, mark + 1, end)
    data = encode_chunk(kind, rows)
    try:
        archive.store.put(key, data)
    except (StorageError, ValueError) as exc:
        ARCHIVE_FAILURES.labels("write").inc()
        log.warning("archiving %s's %s records failed: %s", job_id, kind, exc)
        return 0
    with store.write() as session:
        job = session.get(Job, job_id, with_for_update=True)
        if job is None or archived_mark(job, model) != mark:
            return 0
        session.add(
            RecordChunk(
                job_id=job_id,
                kind=kind,
                first_number=mark + 1,
                last_number=end,
                min_time=min(r.time for r in rows),
                max_time=max(r.time for r in rows),
                key=key,
                size_bytes=len(data),
                created_at=utcnow(),
            )
        )
        session.execute(
            delete(model).where(model.job_id == job_id, model.number > mark, model.number <= end)
        )
        if model is LogLine:
            job.archived_line_number = end
        else:
            job.archived_metric_number = end
    ARCHIVED_RECORDS.labels(kind).inc(len(rows))
    return len(rows)


def archive_pass(platform: Platform) -> int:
    """Move every due chunk of up to ``JOBS_PER_PASS`` jobs; the records moved. The
    ``archiver`` loop runs it; with more jobs due, it wakes itself for another pass."""
    with platform.store.read() as session:
        jobs = due_jobs(session, platform.settings, JOBS_PER_PASS + 1)
    parts = (platform.store, platform.archive)
    chunk_records = platform.settings.archive_chunk_records
    moved = 0
    for job_id in jobs[:JOBS_PER_PASS]:
        for model in (LogLine, Metric):
            while (count := move_chunk(*parts, job_id, model, chunk_records)) > 0:
                moved += count
    # More are due: go on at once, but only while passes get somewhere (a store that refuses
    # every write, or jobs whose records cannot move, wait for the next interval).
    if len(jobs) > JOBS_PER_PASS and moved:
        platform.wakeups.notify_here("archiver")
    if moved:
        log.info("archived %d records of %d jobs", moved, min(len(jobs), JOBS_PER_PASS))
    return moved
