"""Log lines and evaluation metrics of a job, in FfDL's shapes and paging rules.

``pos`` >= 0 skips that many records from the start; ``pos`` < 0 starts that many records
before the end. ``since_time`` (ISO 8601 or epoch milliseconds) keeps records at or after it.
``rindex`` is the record's stable index within the job, usable to resume a stream.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ffdl.core.errors import BadRequest
from ffdl.server.store.models import LogLine, Metric

MAX_PAGE = 10_000


def parse_since_time(value: str | None) -> float | None:
    if value is None or value == "":
        return None
    try:
        return float(value) / 1000.0
    except ValueError:
        pass
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


def _window(
    session: Session, model: Any, job_id: str, since: float | None, pos: int | None, size: int
) -> list[Any]:
    query = select(model).where(model.job_id == job_id)
    if since is not None:
        query = query.where(model.time >= since)
    offset = pos or 0
    if offset < 0:
        count_q = select(func.count()).select_from(model).where(model.job_id == job_id)
        if since is not None:
            count_q = count_q.where(model.time >= since)
        total = int(session.scalar(count_q) or 0)
        offset = max(total + offset, 0)
    return list(session.scalars(query.order_by(model.id).offset(offset).limit(size)))


def _meta(job_id: str, row: Any) -> dict[str, Any]:
    return {
        "training_id": job_id,
        "time": int(row.time * 1000),
        "rindex": row.id,
        "learner": row.learner,
    }


def log_item(job_id: str, row: LogLine) -> dict[str, Any]:
    return {"meta": _meta(job_id, row), "line": row.text, "stream": row.stream}


def metric_item(job_id: str, row: Metric) -> dict[str, Any]:
    etimes: dict[str, Any] = {}
    if row.iteration is not None:
        etimes["iteration"] = {"type": "INT", "value": str(row.iteration)}
    etimes["time"] = {"type": "INT", "value": str(int(row.time * 1000))}
    return {
        "meta": _meta(job_id, row),
        "grouplabel": row.group,
        "etimes": etimes,
        "values": {
            name: {"type": "FLOAT", "value": repr(float(value))}
            for name, value in row.values.items()
        },
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


def lines_after(session: Session, job_id: str, after_id: int, limit: int) -> list[LogLine]:
    return list(
        session.scalars(
            select(LogLine)
            .where(LogLine.job_id == job_id, LogLine.id > after_id)
            .order_by(LogLine.id)
            .limit(limit)
        )
    )


def metrics_after(session: Session, job_id: str, after_id: int, limit: int) -> list[Metric]:
    return list(
        session.scalars(
            select(Metric)
            .where(Metric.job_id == job_id, Metric.id > after_id)
            .order_by(Metric.id)
            .limit(limit)
        )
    )
