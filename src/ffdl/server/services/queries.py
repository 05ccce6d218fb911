"""Reading jobs for a caller: tenant scoping and FfDL's Model JSON.

Every job lookup for a user goes through ``load_job`` or ``list_jobs`` (``job_page`` and
``count_jobs``): a caller sees its own tenant's jobs, a platform admin every tenant's, and
another tenant's job is not found.

The Model JSON has FfDL's fields with FfDL's names, types and formats (``training.command``,
``training.training_status`` with ``submitted``/``completed`` as epoch milliseconds in a
string, ``data_stores[].data_store_id``, ...) and adds ffdl's own next to them; a field
FfDL declared as a string is left out rather than sent as ``null``.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, func, select, tuple_
from sqlalchemy.orm import Session

from ffdl.core.errors import BadRequest, NotFound
from ffdl.core.manifest import redact_secrets
from ffdl.core.status import RUNNING_JOB_STATES, TERMINAL_JOB_STATES, JobStatus, user_actions
from ffdl.server.auth import Principal
from ffdl.server.services.gpu_samples import gpu_utilization_view
from ffdl.server.services.logs import metric_data
from ffdl.server.services.progress import progress_view, start_estimate
from ffdl.server.services.restarts import max_restarts
from ffdl.server.store.models import Event, Job, Learner, Metric

# Beyond this an offset only pages past every job; far larger ones overflow the database.
MAX_OFFSET = 1_000_000_000
# From this offset on, a page reads its ids first (``job_page``). Below it, skipping whole
# rows costs less than the extra step: bench_model_pages.py puts the break-even between
# offsets of 1,000 and 5,000 on both databases, at 10,000 jobs as at 100,000.
IDS_FIRST_FROM_OFFSET = 5_000
MAX_CURSOR = 200
# Statuses in which an attempt is over (besides going back to the queue).
_ATTEMPT_ENDS = TERMINAL_JOB_STATES | {JobStatus.HALTED}


def iso(value: datetime | None) -> str | None:
    return None if value is None else value.replace(tzinfo=UTC).isoformat()


def epoch_millis_text(value: datetime | None) -> str | None:
    """FfDL's timestamp: epoch milliseconds as a string, e.g. ``"1519135679722"``."""
    if value is None:
        return None
    return str(int(value.replace(tzinfo=UTC).timestamp() * 1000))


def load_job(session: Session, principal: Principal, job_id: str) -> Job:
    """The caller's job; another tenant's job is reported as not found."""
    job = session.get(Job, job_id)
    if job is None or not principal.sees(job.tenant_id):
        raise NotFound(f"Model not found: no model with id {job_id!r}")
    return job


def current_learners(session: Session, job: Job) -> list[Learner]:
    return list(
        session.scalars(
            select(Learner)
            .where(Learner.job_id == job.id, Learner.attempt == job.attempt)
            .order_by(Learner.index)
        )
    )


def list_jobs(
    session: Session,
    principal: Principal,
    *,
    status: str | None,
    limit: int,
    offset: int,
    after: str | None = None,
) -> tuple[list[Job], int]:
    """A page of the caller's jobs, newest first (``job_page``), and how many there are in
    all (``count_jobs``)."""
    page = job_page(session, principal, status=status, limit=limit, offset=offset, after=after)
    return page, count_jobs(session, principal, status=status)


def job_page(
    session: Session,
    principal: Principal,
    *,
    status: str | None,
    limit: int,
    offset: int,
    after: str | None = None,
) -> list[Job]:
    """A page of the caller's jobs, newest first.

    ``after`` (the ``next`` of the page before) starts the page just after that job: a
    range read on the jobs' (submitted, id) order however deep the page is, where
    ``offset`` must count past every job before it.
    """
    if not 1 <= limit <= 1000:
        raise BadRequest("limit must be between 1 and 1000", detail={"field": "limit"})
    if not 0 <= offset <= MAX_OFFSET:
        raise BadRequest(f"offset must be between 0 and {MAX_OFFSET}", detail={"field": "offset"})
    if after is not None and offset:
        raise BadRequest("give after or offset, not both", detail={"field": "after"})
    conditions = _visible(principal, status)
    if after is not None:
        submitted, job_id = parse_page_cursor(after)
        conditions.append(tuple_(Job.submitted_at, Job.id) < tuple_(submitted, job_id))
    order = (Job.submitted_at.desc(), Job.id.desc())
    query = select(Job).where(*conditions).order_by(*order).limit(limit)
    if offset < IDS_FIRST_FROM_OFFSET:
        return list(session.scalars(query.offset(offset)))
    # Skipped rows are read like returned ones: skip index entries instead. The page's ids
    # come from an index in list order alone, then only their rows are read (the last page
    # of 100,000 jobs: 2.2 to 2.9 times as fast on PostgreSQL, 1.2 to 1.9 times on SQLite,
    # by bench_model_pages.py).
    page = query.with_only_columns(Job.id).offset(offset).subquery()
    return list(session.scalars(select(Job).join(page, Job.id == page.c.id).order_by(*order)))


def count_jobs(session: Session, principal: Principal, *, status: str | None) -> int:
    """How many jobs the caller sees (with ``status``, how many of them have it)."""
    return (
        session.scalar(select(func.count()).select_from(Job).where(*_visible(principal, status)))
        or 0
    )


def _visible(principal: Principal, status: str | None) -> list[ColumnElement[bool]]:
    conditions: list[ColumnElement[bool]] = []
    if not principal.is_platform_admin:
        conditions.append(Job.tenant_id == principal.tenant_id)
    if status is not None:
        try:
            value = JobStatus(status.upper()).value
        except ValueError as exc:
            raise BadRequest(f"unknown status {status!r}", detail={"field": "status"}) from exc
        conditions.append(Job.status == value)
    return conditions


def page_cursor(job: Job) -> str:
    """Where the page after ``job`` starts (``after``): opaque to clients."""
    text = f"{job.submitted_at.isoformat()}|{job.id}"
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def parse_page_cursor(after: str) -> tuple[datetime, str]:
    refused = BadRequest(
        "after must be the next of a page of models, as the server gave it",
        detail={"field": "after"},
    )
    if len(after) > MAX_CURSOR:
        raise refused
    try:
        text = base64.urlsafe_b64decode(after + "=" * (-len(after) % 4)).decode()
        stamp, job_id = text.split("|", 1)
        return datetime.fromisoformat(stamp), job_id
    except ValueError:
        raise refused from None


def _data_stores(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """FfDL's ``data_stores``: each store's id as ``data_store_id``, its type as the user
    wrote it and its connection (string values) with every secret redacted; ffdl keeps the
    store's ``id`` and containers beside them."""
    stores = []
    for store in manifest.get("data_stores") or []:
        item = dict(store)
        connection = redact_secrets(store.get("connection") or {})
        item["connection"] = {str(key): str(value) for key, value in connection.items()}
        item["data_store_id"] = str(store.get("id", ""))
        item["type"] = str(store.get("type") or "")  # kept as the manifest wrote it
        stores.append(item)
    return stores


def _store_refs(manifest: dict[str, Any], container: str) -> list[str]:
    """Ids of the stores with a ``container`` section (FfDL's ``input_data``/``output_data``)."""
    return [
        str(store.get("id", ""))
        for store in manifest.get("data_stores") or []
        if store.get(container)
    ]


def _without_none(fields: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in fields.items() if value is not None}


def training_status(job: Job) -> dict[str, Any]:
    """FfDL's ``TrainingStatus`` (``status_description`` is the status, as FfDL sent it;
    ``status_message`` says why) with ffdl's exit code and ISO 8601 times added."""
    fields = _without_none(
        {
            "status": job.status,
            "status_description": job.status,
            "status_message": job.reason or "",
            "submitted": epoch_millis_text(job.submitted_at),
            "completed": epoch_millis_text(job.finished_at),
            "error_code": job.error_code,
        }
    )
    fields.update(
        {
            "exit_code": job.exit_code,
            "started": iso(job.started_at),
            "submitted_at": iso(job.submitted_at),
            "started_at": iso(job.started_at),
            "completed_at": iso(job.finished_at),
        }
    )
    return fields


def model_summary(job: Job) -> dict[str, Any]:
    """The Model JSON without the per-job sub-queries (used by list pages)."""
    manifest = job.manifest
    framework = manifest.get("framework") or {}
    command = str(framework.get("command", ""))
    queue = None
    if job.status == JobStatus.QUEUED.value:
        eta_s = None
        if job.queue_eta_at is not None:
            eta_s = max(job.queue_eta_at - datetime.now(UTC).timestamp(), 0.0)
        queue = {
            "position": job.queue_position,
            "eta": eta_text(eta_s),
            "eta_s": eta_s,
            "reason": job.reason,
        }
    return {
        "model_id": job.id,
        "location": f"/v1/models/{job.id}",
        "name": job.name,
        "description": job.description,
        "framework": {
            "name": str(framework.get("name", "")),
            "version": str(framework.get("version", "")),
            "command": command,
            # The runtime the platform chose for it (ffdl's addition).
            "runtime": job.runtime,
        },
        "training": {
            "command": command,
            "cpus": job.cpus,
            "gpus": job.gpus,
            "memory": job.memory_mb,
            "memory_unit": "MiB",
            "learners": job.learners,
            "input_data": _store_refs(manifest, "training_data"),
            "output_data": _store_refs(manifest, "training_results"),
            "training_status": training_status(job),
        },
        "data_stores": _data_stores(manifest),
        "version": str(manifest.get("version", "")),
        "tenant": job.tenant_id,
        "user": job.user_id,
        "priority": job.priority,
        "placement": job.placement or [],
        # What ``ffdl scale`` pinned an elastic job to (None: the autoscaler's choice).
        "pinned": {"gpus": job.pinned_gpus, "gpu_type": job.pinned_gpu_type},
        # An elastic job's finish-time fairness so far (``ffdl.elastic.fairness``): its time
        # in the cluster over what its work would have taken on an equal share.
        "rho": job.rho,
        "queue": queue,
        # ffdl's additions: how far it has come and when it should end, and how far the
        # first start time the queue showed was from its real start.
        "progress": progress_view(job, datetime.now(UTC).timestamp()),
        "start_estimate": start_estimate(job),
        "gpu_utilization": gpu_utilization_view(job),
        "actions": user_actions(JobStatus(job.status)),
        "results": {
            "location": job.results_location,
            "download": f"/v1/models/{job.id}/trained_model",
        },
    }


def latest_metrics(session: Session, job: Job) -> list[dict[str, Any]]:
    """FfDL's ``metrics`` summary of a model: its latest metrics record, if any."""
    row = session.scalar(
        select(Metric).where(Metric.job_id == job.id).order_by(Metric.number.desc()).limit(1)
    )
    return [] if row is None else [metric_data(row)]


def model_detail(session: Session, job: Job) -> dict[str, Any]:
    body = model_summary(job)
    body["metrics"] = latest_metrics(session, job)
    learners = current_learners(session, job)
    body["gpu_utilization"] = gpu_utilization_view(job, learners)
    body["learners"] = [
        {
            "learner": lr.index,
            "status": lr.status,
            "node": lr.node,
            "gpu_ids": lr.gpu_ids,
            "exit_code": lr.exit_code,
            "attempt": lr.attempt,
            "reason": lr.reason,
            "gpu_util": lr.gpu_util,
            "gpu_memory_mb": lr.gpu_memory_mb,
        }
        for lr in learners
    ]
    events = session.scalars(select(Event).where(Event.job_id == job.id).order_by(Event.id)).all()
    body["attempts"] = job_attempts(events)
    body["restarts"] = {"taken": job.restarts or 0, "max": max_restarts(job)}
    body["events"] = [
        {
            "time": iso(ev.created_at),
            "from": ev.from_status,
            "to": ev.to_status,
            "reason": ev.reason,
            "learner": ev.learner,
        }
        for ev in events
    ]
    return body


def job_attempts(events: Sequence[Event]) -> list[dict[str, Any]]:
    """Every attempt of a job, from its status events: an attempt starts when the job is
    placed (each placement is a new attempt, numbered as ``Job.attempt`` counts them) and
    ends when the job leaves its resources: finished, halted, requeued, or placed anew.

    ``status`` is how the attempt ended (FAILED for one that was restarted after a
    failure) or, while it runs, the job's status; ``reason`` the event that says why.
    """
    attempts: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for ev in events:
        if ev.learner is not None or ev.from_status == ev.to_status:
            continue  # a learner's event, or a note that changed no status
        target = JobStatus(ev.to_status)
        if target == JobStatus.PENDING:
            if current is not None:
                current["ended"] = iso(ev.created_at)
            current = {
                "attempt": len(attempts) + 1,
                "started": iso(ev.created_at),
                "ended": None,
                "status": target.value,
                "reason": ev.reason,
            }
            attempts.append(current)
            continue
        if current is None:
            continue
        current["reason"] = ev.reason
        if target == JobStatus.QUEUED:
            # Back to the queue from a running status is a restart after a failure; from
            # RESCALING, a new size that found no room: the attempt keeps that status.
            if ev.from_status is not None and JobStatus(ev.from_status) in RUNNING_JOB_STATES:
                current["status"] = JobStatus.FAILED.value
        else:
            current["status"] = target.value
        if target == JobStatus.QUEUED or target in _ATTEMPT_ENDS:
            current["ended"] = iso(ev.created_at)
            current = None
    return attempts


def eta_text(eta_s: float | None) -> str:
    if eta_s is None:
        return "unknown"
    if eta_s < 60:
        return f"{int(eta_s)}s"
    if eta_s < 3600:
        return f"{int(eta_s // 60)}m"
    return f"{eta_s / 3600:.1f}h"
