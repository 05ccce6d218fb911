"""Ingesting controller reports: statuses, log lines, metrics and heartbeats.

Each learner attempt numbers its report items; items at or below the stored ``report_seq``
were already applied and are skipped, so a controller may resend a batch whose response
it never saw without anything being stored twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field
from sqlalchemy import insert, select

from ffdl.core.errors import AuthError, Gone, IllegalTransition, NotFound
from ffdl.core.status import TERMINAL_LEARNER_STATES, JobStatus, LearnerStatus, is_terminal
from ffdl.server.platform import Platform
from ffdl.server.services.aggregate import aggregate_job
from ffdl.server.services.queries import current_learners
from ffdl.server.store.models import Job, Learner, LogLine, Metric
from ffdl.server.store.transitions import set_learner_status, utcnow


class ReportItem(BaseModel):
    type: Literal["status", "log", "emetric"]
    seq: int = Field(ge=1)
    time: float
    status: str | None = None
    reason: str | None = None
    exit_code: int | None = None
    error_code: str | None = None
    stream: str = "stdout"
    text: str = ""
    group: str = "train"
    iteration: int | None = None
    values: dict[str, float] = Field(default_factory=dict)


class ReportBatch(BaseModel):
    attempt: int
    items: list[ReportItem] = Field(default_factory=list, max_length=5000)


@dataclass(frozen=True, slots=True)
class ReportAck:
    accepted: int
    last_seq: int
    halt: bool
    cancel: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "accepted": self.accepted,
            "last_seq": self.last_seq,
            "halt": self.halt,
            "cancel": self.cancel,
        }


def ingest_reports(
    platform: Platform, job_id: str, learner_index: int, token: str | None, batch: ReportBatch
) -> ReportAck:
    if token is None or not platform.job_tokens.verify(job_id, token):
        raise AuthError("invalid job token")
    status_changed = False
    with platform.store.write() as session:
        job = session.get(Job, job_id)
        if job is None:
            raise NotFound(f"no job {job_id!r}")
        learner = session.scalars(
            select(Learner).where(
                Learner.job_id == job_id,
                Learner.index == learner_index,
                Learner.attempt == batch.attempt,
            )
        ).first()
        if learner is None:
            raise NotFound(f"no learner {learner_index} attempt {batch.attempt} in {job_id}")
        if batch.attempt != job.attempt:
            raise Gone(f"attempt {batch.attempt} of {job_id} was superseded")
        learner.last_heartbeat = utcnow()
        fresh = [item for item in batch.items if item.seq > learner.report_seq]
        logs: list[dict[str, Any]] = []
        metrics: list[dict[str, Any]] = []
        for item in fresh:
            if item.type == "log":
                logs.append(_log_row(job_id, learner_index, batch.attempt, item))
            elif item.type == "emetric":
                metrics.append(_metric_row(job_id, learner_index, batch.attempt, item))
            else:
                # Keep row order: flush pending lines before a status so a follower never
                # sees COMPLETED ahead of the last lines.
                _flush(session, logs, metrics)
                status_changed |= _apply_status(session, learner, item)
        _flush(session, logs, metrics)
        if fresh:
            learner.report_seq = fresh[-1].seq
        if status_changed:
            learners = current_learners(session, job)
            aggregate_job(session, job, learners)
        terminal = is_terminal(JobStatus(job.status))
        ack = ReportAck(
            accepted=len(fresh),
            last_seq=learner.report_seq,
            halt=job.desired == "halt"
            or job.status in (JobStatus.HALTING.value, JobStatus.RESCALING.value),
            cancel=job.desired == "cancel" or (terminal and not _learner_done(learner)),
        )
    if status_changed:
        platform.wakeups.notify("lcm", "scheduler", "monitor", "autoscaler")
    return ack


def _learner_done(learner: Learner) -> bool:
    return LearnerStatus(learner.status) in TERMINAL_LEARNER_STATES


def _flush(session: Any, logs: list[dict[str, Any]], metrics: list[dict[str, Any]]) -> None:
    if logs:
        session.execute(insert(LogLine), logs)
        logs.clear()
    if metrics:
        session.execute(insert(Metric), metrics)
        metrics.clear()


def _log_row(job_id: str, learner: int, attempt: int, item: ReportItem) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "learner": learner,
        "attempt": attempt,
        "seq": item.seq,
        "stream": item.stream[:8],
        "text": item.text,
        "time": item.time,
    }


def _metric_row(job_id: str, learner: int, attempt: int, item: ReportItem) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "learner": learner,
        "attempt": attempt,
        "seq": item.seq,
        "group": item.group[:100],
        "iteration": item.iteration,
        "values": item.values,
        "time": item.time,
    }


def _apply_status(session: Any, learner: Learner, item: ReportItem) -> bool:
    try:
        target = LearnerStatus(item.status or "")
    except ValueError:
        return False
    try:
        event = set_learner_status(
            session,
            learner,
            target,
            item.reason or "",
            exit_code=item.exit_code,
            error_code=item.error_code,
        )
    except IllegalTransition:
        # A late report about a learner we already finalised (e.g. killed): keep ours.
        return False
    return event is not None
