"""Log lines and evaluation metrics of a job, in FfDL's shapes and paging rules.

Paging follows FfDL's training-data service:

- ``pagesize`` records per page, 10 when not given;
- ``pos`` >= 0 skips that many records from the start; ``pos`` < 0 counts from the end: the
  page ends at the ``-pos``-th record from the end (``pos=-1``: the last ``pagesize``
  records);
- ``since_time`` keeps records at or after a time (epoch milliseconds or ISO 8601/RFC 3339);
  a negative integer ``-N`` instead starts the page ``N`` records before the end.

Records come oldest first. ``meta.rindex`` is the record's number in its job: a job's log
lines count 1, 2, 3, ... and so do its metrics (``record_numbers``), whichever replica
stored them; it resumes a stream. ``meta.time`` is its epoch milliseconds.

Records numbered up to a job's archive mark (retention, ``ffdl.server.services.record_archive``)
are read from their chunks in the archive store, fetched outside any session; the others from
the database. Which are where is read in one snapshot, so each record comes once.

Every number from the query is range-checked before it reaches SQLite (a 400 naming the
field, never an overflow), and every stored number is rendered defensively: a value that
slipped in before the report checks existed must not make the endpoint fail.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ffdl.core.errors import BadRequest, Unavailable
from ffdl.core.limits import MAX_INT64, MAX_REPORT_TIME, bounded_int
from ffdl.server.archive import (
    ChunkRef,
    RecordArchive,
    archived_mark,
    chunks_between,
    chunks_from_time,
)
from ffdl.server.store.db import Store
from ffdl.server.store.models import Job, LogLine, Metric

MAX_PAGE = 10_000
# FfDL's page size when a request names none.
DEFAULT_PAGE = 10
MAX_SINCE_TEXT = 64
# FfDL's typed values (``v1Any``): how a stored value is tagged.
ANY_TYPES = ("STRING", "JSONSTRING", "INT", "FLOAT")
_COUNT_BACK = re.compile(r"-[0-9]+")


@dataclass(frozen=True, slots=True)
class Since:
    """What ``since_time`` asked for: records from ``time`` (epoch seconds) on, or the page
    that starts ``back`` records before the end; neither when it was empty."""

    time: float | None = None
    back: int | None = None


def _since_error(message: str) -> BadRequest:
    return BadRequest(message, detail={"field": "since_time"})


def parse_since_time(value: str | None) -> Since:
    if value is None or value.strip() == "":
        return Since()
    value = value.strip()
    if len(value) > MAX_SINCE_TEXT:
        raise _since_error(f"since_time must be at most {MAX_SINCE_TEXT} characters")
    if _COUNT_BACK.fullmatch(value):
        back = int(value[1:])
        if back > MAX_INT64:
            raise _since_error(f"since_time counts back at most {MAX_INT64} records")
        return Since(back=back) if back else Since(time=0.0)
    try:
        millis = float(value)
    except ValueError:
        pass
    else:
        if not math.isfinite(millis) or not 0 <= millis / 1000.0 <= MAX_REPORT_TIME:
            raise _since_error(
                "since_time must be epoch milliseconds from 0 to "
                f"{MAX_REPORT_TIME * 1000:.0f}, or a negative whole number of records, "
                f"got {value!r}"
            )
        return Since(time=millis / 1000.0)
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError as exc:
        raise _since_error(
            "since_time must be epoch milliseconds, ISO 8601 (RFC 3339) or a negative "
            f"number of records, got {value!r}"
        ) from exc
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return Since(time=parsed.timestamp())


def _check_page(pagesize: int | None) -> int:
    size = DEFAULT_PAGE if pagesize is None else pagesize
    if not 1 <= size <= MAX_PAGE:
        raise BadRequest(f"pagesize must be between 1 and {MAX_PAGE}", detail={"field": "pagesize"})
    return size


def _check_pos(pos: int | None) -> int:
    return 0 if pos is None else bounded_int(pos, "pos", -MAX_INT64, MAX_INT64)


@dataclass(frozen=True)
class _Planned:
    """Records after ``after`` (at most ``limit``) as one snapshot found them: those in the
    archive's ``chunks``, then the database's ``rows``."""

    after: int
    limit: int
    chunks: list[ChunkRef]
    rows: list[Any]

    def resolve(self, archive: RecordArchive) -> list[Any]:
        """The records, with the chunks fetched (outside any session)."""
        found: list[Any] = []
        for chunk in self.chunks:
            after = found[-1].number if found else self.after
            found += archive.records(chunk, after=after, limit=self.limit - len(found))
            if len(found) >= self.limit:
                return found
        return (found + self.rows)[: self.limit]


def plan_after(session: Session, model: Any, job: Job, after: int, limit: int) -> _Planned:
    """What to read for ``job``'s records of ``model`` numbered after ``after``: the
    archived ones (up to the job's mark) from their chunks, the rest from the database."""
    after = _cursor(after)
    mark = archived_mark(job, model)
    if after >= mark:
        return _Planned(after, limit, [], records_after(session, model, job.id, after, limit))
    upto = min(mark, after + limit)
    chunks = chunks_between(session, job.id, model, after, upto)
    covered = upto - after
    rows = records_after(session, model, job.id, mark, limit - covered) if covered < limit else []
    return _Planned(after, limit, chunks, rows)


def _last_number(session: Session, model: Any, job: Job) -> int:
    stored = session.scalar(select(func.max(model.number)).where(model.job_id == job.id))
    return max(int(stored or 0), archived_mark(job, model))


def _window(
    store: Store,
    archive: RecordArchive,
    model: Any,
    job_id: str,
    since: Since,
    pos: int | None,
    size: int,
) -> list[Any]:
    offset = _check_pos(pos)
    if since.time is not None:
        return _window_from(store, archive, model, job_id, since.time, offset, size)
    # A job's records are numbered 1, 2, 3, ... without gaps, so a position is a number:
    # each page is one range read on (job_id, number), however deep it is.
    with store.read() as session:
        job = session.get(Job, job_id)
        if job is None:
            return []
        last = _last_number(session, model, job)
        if since.back is not None:
            start = max(last - since.back, 0)
        elif offset < 0:
            # FfDL's backward page: it ends at the (-pos)-th record from the end.
            end = last - (-offset - 1)
            start = max(end - size, 0)
            size = max(end - start, 0)
        else:
            start = offset
        if size == 0:
            return []
        planned = plan_after(session, model, job, start, size)
    return planned.resolve(archive)


# Reads from a time that found the archive's mark moved meanwhile start again this often
# before they give up (the mark moves once per chunk, so a second try practically succeeds).
_TIME_READ_TRIES = 3


def _window_from(
    store: Store,
    archive: RecordArchive,
    model: Any,
    job_id: str,
    since: float,
    offset: int,
    size: int,
) -> list[Any]:
    """A page of the records at or after ``since`` (epoch seconds), in number order.

    Archived records at or after ``since`` come first (they are numbered before every
    stored one); they are fetched outside a session, so the database part is read in a
    second session, which must find the archive's mark where the first did.
    """
    condition = [model.job_id == job_id, model.time >= since]
    for _ in range(_TIME_READ_TRIES):
        with store.read() as session:
            job = session.get(Job, job_id)
            if job is None:
                return []
            mark = archived_mark(job, model)
            chunks = chunks_from_time(session, job_id, model, since) if mark else []
            if not chunks:
                return _stored_slice(session, model, condition, [], offset, size)
        archived = [r for chunk in chunks for r in archive.records_from(chunk, since)]
        with store.read() as session:
            job = session.get(Job, job_id)
            if job is None:
                return []
            if archived_mark(job, model) == mark:
                return _stored_slice(session, model, condition, archived, offset, size)
    raise Unavailable("the job's records were being archived; try again")


def _stored_slice(
    session: Session,
    model: Any,
    condition: list[Any],
    archived: list[Any],
    offset: int,
    size: int,
) -> list[Any]:
    """``size`` records from ``offset`` of ``archived`` followed by the stored records that
    meet ``condition`` (a negative ``offset`` counts from the end, as ``pos`` does)."""
    if offset < 0:
        stored = int(session.scalar(select(func.count()).select_from(model).where(*condition)) or 0)
        end = len(archived) + stored - (-offset - 1)
        offset = max(end - size, 0)
        size = max(end - offset, 0)
    if size == 0:
        return []
    found = archived[offset : offset + size]
    if len(found) < size:
        query = (
            select(model)
            .where(*condition)
            .order_by(model.number)
            .offset(max(offset - len(archived), 0))
            .limit(size - len(found))
        )
        found += list(session.scalars(query))
    return found


def millis(seconds: object) -> int:
    """Epoch milliseconds of a stored time; 0 for anything unusable."""
    if isinstance(seconds, int | float) and math.isfinite(seconds):
        return int(min(max(float(seconds), 0.0), MAX_REPORT_TIME) * 1000)
    return 0


def _meta(job: Job, row: Any) -> dict[str, Any]:
    return {
        "training_id": job.id,
        "user_id": job.user_id,
        "time": millis(row.time),
        "rindex": row.number,
        "learner": row.learner,
    }


def _float_text(value: object) -> str | None:
    """FfDL's text of a metric value; None for a stored value that is not a finite number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return repr(number) if math.isfinite(number) else None


def typed_value(value: object) -> dict[str, str] | None:
    """A stored metric value as FfDL's ``{"type", "value"}``; None when it is unusable."""
    if isinstance(value, dict):
        kind, text = value.get("type"), value.get("value")
        if kind in ANY_TYPES and isinstance(text, str):
            return {"type": str(kind), "value": text}
        return None
    if isinstance(value, str):
        return {"type": "STRING", "value": value}
    text = _float_text(value)
    return None if text is None else {"type": "FLOAT", "value": text}


def metric_values(row: Metric) -> dict[str, dict[str, str]]:
    stored = row.values if isinstance(row.values, dict) else {}
    values = {}
    for name, value in stored.items():
        typed = typed_value(value)
        if typed is not None:
            values[str(name)] = typed
    return values


def log_item(job: Job, row: LogLine) -> dict[str, Any]:
    return {"meta": _meta(job, row), "line": row.text, "stream": row.stream}


def metric_item(job: Job, row: Metric) -> dict[str, Any]:
    etimes: dict[str, Any] = {}
    if row.iteration is not None:
        etimes["iteration"] = {"type": "INT", "value": str(row.iteration)}
    etimes["time"] = {"type": "INT", "value": str(millis(row.time))}
    return {
        "meta": _meta(job, row),
        "grouplabel": row.group,
        "etimes": etimes,
        "values": metric_values(row),
    }


def loglines(
    store: Store,
    archive: RecordArchive,
    job: Job,
    *,
    since_time: str | None,
    pagesize: int | None,
    pos: int | None,
) -> list[dict[str, Any]]:
    since = parse_since_time(since_time)
    rows = _window(store, archive, LogLine, job.id, since, pos, _check_page(pagesize))
    return [log_item(job, row) for row in rows]


def emetrics(
    store: Store,
    archive: RecordArchive,
    job: Job,
    *,
    since_time: str | None,
    pagesize: int | None,
    pos: int | None,
) -> list[dict[str, Any]]:
    since = parse_since_time(since_time)
    rows = _window(store, archive, Metric, job.id, since, pos, _check_page(pagesize))
    return [metric_item(job, row) for row in rows]


def _cursor(after: int) -> int:
    # Numbers are positive 64-bit integers: a larger cursor is past every record, not an
    # overflow.
    return min(max(after, -1), MAX_INT64)


def records_after(session: Session, model: Any, job_id: str, after: int, limit: int) -> list[Any]:
    """The job's log lines or metrics (``model``) numbered after ``after``, in order, at
    most ``limit``: one range read on ``(job_id, number)``."""
    return list(
        session.scalars(
            select(model)
            .where(model.job_id == job_id, model.number > _cursor(after))
            .order_by(model.number)
            .limit(limit)
        )
    )


def first_row_at(
    store: Store, archive: RecordArchive, model: Any, job_id: str, since: Since
) -> int:
    """The number just before the first record a follow from ``since`` delivers (a cursor)."""
    with store.read() as session:
        job = session.get(Job, job_id)
        if job is None:
            return 0
        last = _last_number(session, model, job)
        if since.back is not None:
            return max(last - since.back, 0)
        if since.time is None:
            return 0
        # The first chunk that has a record from then holds the first such record: every
        # chunk before it ends before then, and every stored record comes after it.
        chunks = chunks_from_time(session, job_id, model, since.time)[:1]
        if not chunks:
            number = session.scalar(
                select(model.number)
                .where(model.job_id == job_id, model.time >= since.time)
                .order_by(model.number)
                .limit(1)
            )
            # Nothing from then yet: only records that arrive later.
            return last if number is None else int(number) - 1
    (first,) = archive.records_from(chunks[0], since.time, limit=1)
    return int(first.number) - 1


def metric_data(row: Metric) -> dict[str, Any]:
    """One metrics record as FfDL's ``MetricData`` (what its client prints for
    ``logs --metrics``): ``type`` is the group, ``Values`` the plain numbers or texts."""
    values: dict[str, Any] = {}
    for name, typed in metric_values(row).items():
        if typed["type"] in ("FLOAT", "INT"):
            try:
                values[name] = (
                    float(typed["value"]) if typed["type"] == "FLOAT" else int(typed["value"])
                )
            except ValueError:
                values[name] = typed["value"]
        else:
            values[name] = typed["value"]
    stamp = datetime.fromtimestamp(millis(row.time) / 1000.0, UTC)
    data: dict[str, Any] = {
        "type": row.group,
        "timestamp": stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z",
        "Values": values,
    }
    if row.iteration is not None and -(2**31) <= row.iteration < 2**31:
        data["iteration"] = row.iteration
    return data
