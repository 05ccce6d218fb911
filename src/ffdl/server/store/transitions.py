"""The status gate: the only writer of job and learner statuses.

Every change is checked against the status machine in ``ffdl.core.status`` and recorded as
an ``Event`` row in the caller's transaction, so a status and its event commit together or
not at all. A job reaching a terminal status has its data-store credentials erased in the
same transaction.

Compare-and-set: before changing a status the gate re-reads it from the database with the
row locked (``SELECT ... FOR UPDATE``; SQLite's write transactions lock the whole file) and
refuses with ``StatusChanged`` when it differs from the status the caller decided on. Two
replicas, or a request and a loop, can therefore never both move a job from the same status
(both deploy it, both preempt it): the second one's transaction rolls back. Jobs read and
locked together by ``lock_jobs`` are not read again: locked since, their statuses are the
stored ones until the transaction ends.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC, datetime

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from ffdl.core.errors import StatusChanged
from ffdl.core.status import (
    TERMINAL_JOB_STATES,
    JobStatus,
    LearnerStatus,
    Via,
    check_job_transition,
    check_learner_transition,
)
from ffdl.server.credentials import erase_manifest_secrets
from ffdl.server.store.models import Event, Job, Learner
from ffdl.server.telemetry.instruments import record_transition


def utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def set_job_status(
    session: Session,
    job: Job,
    target: JobStatus,
    reason: str = "",
    *,
    error_code: str | None = None,
    exit_code: int | None = None,
    via: Via | None = None,
) -> Event | None:
    """Move ``job`` to ``target`` (a no-op when already there) and record the event.

    ``via`` names the cause of a transition open only to it (a restart, a user's resume).
    Raises ``IllegalTransition`` when the status machine forbids the change.
    """
    current = JobStatus(job.status)
    if current == target:
        return None
    check_job_transition(current, target, via)
    _compare_and_lock(session, job, f"job {job.id}")
    now = utcnow()
    record_transition(
        session,
        tenant=job.tenant_id,
        from_status=current.value,
        to_status=target.value,
        now=now,
        submitted_at=job.submitted_at,
        queued_since=job.status_changed_at,
        first_start=target == JobStatus.PROCESSING and job.started_at is None,
        # The scheduler's mark on a victim (``loops.scheduler.PREEMPTED``).
        preempted=job.desired == "preempt",
        restart=via == Via.RESTART,
        error_code=error_code if error_code is not None else job.error_code,
    )
    job.status = target.value
    job.reason = reason
    job.status_changed_at = now
    if error_code is not None:
        job.error_code = error_code
    if exit_code is not None:
        job.exit_code = exit_code
    if target == JobStatus.PROCESSING and job.started_at is None:
        job.started_at = now
    if target == JobStatus.QUEUED:
        job.error_code = None
        job.exit_code = None
        job.finished_at = None
    if target == JobStatus.HALTED:
        job.placement = None  # a halted job holds nothing; it is placed afresh on resume
    if target in TERMINAL_JOB_STATES:
        # A finished job never deploys again: its data-store credentials go with it.
        erased = erase_manifest_secrets(job.manifest or {})
        if erased is not None:
            job.manifest = erased
    if target in TERMINAL_JOB_STATES or target == JobStatus.HALTED:
        job.finished_at = now
        job.queue_position = None
        job.queue_eta_at = None
    if target != JobStatus.QUEUED:
        job.queue_position = None
        job.queue_eta_at = None
    return _job_event(session, job, current.value, target.value, reason, now)


def note_job_event(session: Session, job: Job, reason: str) -> Event:
    """Record something that happened to ``job`` without changing its status (the event's
    from and to status are both the current one), e.g. GPUs flagged as idle."""
    return _job_event(session, job, job.status, job.status, reason, utcnow())


def _job_event(
    session: Session, job: Job, from_status: str, to_status: str, reason: str, at: datetime
) -> Event:
    event = Event(
        job_id=job.id,
        learner=None,
        from_status=from_status,
        to_status=to_status,
        reason=reason,
        created_at=at,
    )
    session.add(event)
    return event


def set_learner_status(
    session: Session,
    learner: Learner,
    target: LearnerStatus,
    reason: str = "",
    *,
    exit_code: int | None = None,
    error_code: str | None = None,
) -> Event | None:
    """Move one learner to ``target`` (a no-op when already there) and record the event."""
    current = LearnerStatus(learner.status)
    if current == target:
        return None
    check_learner_transition(current, target)
    _compare_and_lock(session, learner, f"learner {learner.index} of {learner.job_id}")
    now = utcnow()
    learner.status = target.value
    learner.updated_at = now
    if reason:
        learner.reason = reason
    if exit_code is not None:
        learner.exit_code = exit_code
    if error_code is not None:
        learner.error_code = error_code
    event = Event(
        job_id=learner.job_id,
        learner=learner.index,
        from_status=current.value,
        to_status=target.value,
        reason=reason,
        created_at=now,
    )
    session.add(event)
    return event


# Built once: a pass that moves hundreds of jobs spent more building these than running them.
_LOCK_JOB = select(Job.id).where(Job.id == bindparam("row_id")).with_for_update()
_JOB_STATUS = select(Job.status).where(Job.id == bindparam("row_id")).with_for_update()
_LEARNER_STATUS = select(Learner.status).where(Learner.id == bindparam("row_id")).with_for_update()


# ``session.info`` key: the ids of the jobs ``lock_jobs`` read and locked in the session's
# transaction (a write session is one transaction, ``Store.write``).
_LOCKED_JOBS = "ffdl_locked_jobs"


def lock_jobs(session: Session, job_ids: Collection[str]) -> dict[str, Job]:
    """Read and lock the jobs ``job_ids`` (those that exist) in one statement, by id.

    The status gate then changes their statuses without reading each again, so a loop pass
    that starts hundreds of jobs costs one round trip for them, not one per job.
    """
    if not job_ids:
        return {}
    locked = (
        select(Job)
        .where(Job.id.in_(job_ids))
        .with_for_update()
        # Fresh from the locked rows even when the session had read a job before.
        .execution_options(populate_existing=True)
    )
    jobs = {job.id: job for job in session.scalars(locked)}
    session.info.setdefault(_LOCKED_JOBS, set()).update(jobs)
    return jobs


def lock_job(session: Session, job_id: str) -> None:
    """Lock a job's row until the transaction ends. A transaction that writes a job's
    learners takes their job's row first, as the status gate and the report path do: with
    one lock order everywhere (job, then learner), two transactions never each hold a row
    the other waits for (PostgreSQL would break the deadlock by failing one of them)."""
    session.execute(_LOCK_JOB, {"row_id": job_id})


def _compare_and_lock(session: Session, row: Job | Learner, what: str) -> None:
    """Lock ``row`` and check that its stored status is still the one it was read with."""
    if row in session.new or row.id is None:
        return  # created in this transaction: nobody else can have moved it
    if isinstance(row, Job) and row.id in session.info.get(_LOCKED_JOBS, ()):
        return  # read with its lock in this transaction (``lock_jobs``)
    if isinstance(row, Learner):
        # The job's row first, as for every write of a job's records: its events then get
        # their ids in commit order, and the lock order (job, then learner) is the same
        # everywhere.
        lock_job(session, row.job_id)
        stored = session.execute(_LEARNER_STATUS, {"row_id": row.id}).scalar_one_or_none()
    else:
        stored = session.execute(_JOB_STATUS, {"row_id": row.id}).scalar_one_or_none()
    if stored is not None and stored != row.status:
        raise StatusChanged(what, row.status, stored)
