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

from ffdl.core.errors import BadRequest
from ffdl.core.limits import MAX_INT64, MAX_REPORT_TIME, bounded_int
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


def _window(
    session: Session, model: Any, job_id: str, since: Since, pos: int | None, size: int
) -> list[Any]:
    offset = _check_pos(pos)
    if since.time is not None:
        return _window_from(session, model, job_id, since.time, offset, size)
    # A job's records are numbered 1, 2, 3, ... without gaps, so a position is a number:
    # each page is one range read on (job_id, number), however deep it is.
    last = int(session.scalar(select(func.max(model.number)).where(model.job_id == job_id)) or 0)
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
    return records_after(session, model, job_id, start, size)


def _window_from(
    session: Session, model: Any, job_id: str, since: float, offset: int, size: int
) -> list[Any]:
    """A page of the records at or after ``since`` (epoch seconds)."""
    condition = [model.job_id == job_id, model.time >= since]
    if offset < 0:
        total = int(session.scalar(select(func.count()).select_from(model).where(*condition)) or 0)
        end = total - (-offset - 1)
        offset = max(end - size, 0)
        size = max(end - offset, 0)
    if size == 0:
        return []
    query = select(model).where(*condition).order_by(model.number).offset(offset).limit(size)
    return list(session.scalars(query))


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
    session: Session,
    job: Job,
    *,
    since_time: str | None,
    pagesize: int | None,
    pos: int | None,
) -> list[dict[str, Any]]:
    since = parse_since_time(since_time)
    rows = _window(session, LogLine, job.id, since, pos, _check_page(pagesize))
    return [log_item(job, row) for row in rows]


def emetrics(
    session: Session,
    job: Job,
    *,
    since_time: str | None,
    pagesize: int | None,
    pos: int | None,
) -> list[dict[str, Any]]:
    since = parse_since_time(since_time)
    rows = _window(session, Metric, job.id, since, pos, _check_page(pagesize))
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


def first_row_at(session: Session, model: Any, job_id: str, since: Since) -> int:
    """The number just before the first record a follow from ``since`` delivers (a cursor)."""
    condition = [model.job_id == job_id]
    if since.back is not None:
        newest = session.scalar(select(func.max(model.number)).where(*condition))
        return max(int(newest or 0) - since.back, 0)
    if since.time is None:
        return 0
    row = session.scalar(
        select(model.number)
        .where(*condition, model.time >= since.time)
        .order_by(model.number)
        .limit(1)
    )
    if row is None:
        # Nothing from then yet: only records that arrive later.
        last = session.scalar(select(func.max(model.number)).where(*condition))
        return int(last or 0)
    return int(row) - 1


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
