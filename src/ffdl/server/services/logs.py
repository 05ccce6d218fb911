"""Log lines and evaluation metrics of a job, in FfDL's shapes and paging rules.

``pos`` >= 0 skips that many records from the start; ``pos`` < 0 starts that many records
before the end. ``since_time`` (ISO 8601 or epoch milliseconds) keeps records at or after it.
``rindex`` is the record's stable index within the job, usable to resume a stream.

Every number from the query is range-checked before it reaches SQLite (a 400 naming the
field, never an overflow), and every stored number is rendered defensively: a value that
slipped in before the report checks existed must not make the endpoint fail.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ffdl.core.errors import BadRequest
from ffdl.core.limits import MAX_INT64, MAX_REPORT_TIME, bounded_int
from ffdl.server.store.models import LogLine, Metric

MAX_PAGE = 10_000
MAX_SINCE_TEXT = 64


def parse_since_time(value: str | None) -> float | None:
    if value is None or value == "":
        return None
    if len(value) > MAX_SINCE_TEXT:
        raise BadRequest(
            f"since_time must be at most {MAX_SINCE_TEXT} characters",
            detail={"field": "since_time"},
        )
    try:
        millis = float(value)
    except ValueError:
        pass
    else:
        if not math.isfinite(millis) or not 0 <= millis / 1000.0 <= MAX_REPORT_TIME:
            raise BadRequest(
                f"since_time in epoch milliseconds must be from 0 to {MAX_REPORT_TIME * 1000:.0f}",
                detail={"field": "since_time"},
            )
        return millis / 1000.0
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise BadRequest(
            f"since_time must be ISO 8601 or epoch milliseconds, got {value!r}",
            detail={"field": "since_time"},
        ) from exc
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def _check_page(pagesize: int | None) -> int:
    size = 100 if pagesize is None else pagesize
    if not 1 <= size <= MAX_PAGE:
        raise BadRequest(f"pagesize must be between 1 and {MAX_PAGE}", detail={"field": "pagesize"})
    return size


def _check_pos(pos: int | None) -> int:
    return 0 if pos is None else bounded_int(pos, "pos", -MAX_INT64, MAX_INT64)


def _window(
    session: Session, model: Any, job_id: str, since: float | None, pos: int | None, size: int
) -> list[Any]:
    query = select(model).where(model.job_id == job_id)
    if since is not None:
        query = query.where(model.time >= since)
    offset = _check_pos(pos)
    if offset < 0:
        count_q = select(func.count()).select_from(model).where(model.job_id == job_id)
        if since is not None:
            count_q = count_q.where(model.time >= since)
        total = int(session.scalar(count_q) or 0)
        offset = max(total + offset, 0)
    return list(session.scalars(query.order_by(model.id).offset(offset).limit(size)))


def _millis(seconds: object) -> int:
    """Epoch milliseconds of a stored time; 0 for anything unusable."""
    if isinstance(seconds, int | float) and math.isfinite(seconds):
        return int(min(max(float(seconds), 0.0), MAX_REPORT_TIME) * 1000)
    return 0


def _meta(job_id: str, row: Any) -> dict[str, Any]:
    return {
        "training_id": job_id,
        "time": _millis(row.time),
        "rindex": row.id,
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


def log_item(job_id: str, row: LogLine) -> dict[str, Any]:
    return {"meta": _meta(job_id, row), "line": row.text, "stream": row.stream}


def metric_item(job_id: str, row: Metric) -> dict[str, Any]:
    etimes: dict[str, Any] = {}
    if row.iteration is not None:
        etimes["iteration"] = {"type": "INT", "value": str(row.iteration)}
    etimes["time"] = {"type": "INT", "value": str(_millis(row.time))}
    stored = row.values if isinstance(row.values, dict) else {}
    values = {}
    for name, value in stored.items():
        text = _float_text(value)
        if text is not None:
            values[str(name)] = {"type": "FLOAT", "value": text}
    return {
        "meta": _meta(job_id, row),
        "grouplabel": row.group,
        "etimes": etimes,
        "values": values,
    }


def loglines(
    session: Session,
    job_id: str,
    *,
    since_time: str | None,
    pagesize: int | None,
    pos: int | None,
) -> list[dict[str, Any]]:
    rows = _window(
        session, LogLine, job_id, parse_since_time(since_time), pos, _check_page(pagesize)
    )
    return [log_item(job_id, row) for row in rows]


def emetrics(
    session: Session,
    job_id: str,
    *,
    since_time: str | None,
    pagesize: int | None,
    pos: int | None,
) -> list[dict[str, Any]]:
    rows = _window(
        session, Metric, job_id, parse_since_time(since_time), pos, _check_page(pagesize)
    )
    return [metric_item(job_id, row) for row in rows]


def _row_id(after_id: int) -> int:
    # Ids are positive 64-bit integers: a larger cursor is past every row, not an overflow.
    return min(max(after_id, -1), MAX_INT64)


def lines_after(session: Session, job_id: str, after_id: int, limit: int) -> list[LogLine]:
    after_id = _row_id(after_id)
    return list(
        session.scalars(
            select(LogLine)
            .where(LogLine.job_id == job_id, LogLine.id > after_id)
            .order_by(LogLine.id)
            .limit(limit)
        )
    )


def metrics_after(session: Session, job_id: str, after_id: int, limit: int) -> list[Metric]:
    after_id = _row_id(after_id)
    return list(
        session.scalars(
            select(Metric)
            .where(Metric.job_id == job_id, Metric.id > after_id)
            .order_by(Metric.id)
            .limit(limit)
        )
    )
