"""The job monitor's rule: fold the learners' statuses into the job's status.

Called right after a learner report is stored and by the monitor loop, always inside the
caller's write transaction. A job is PROCESSING only when every learner is; any failed
learner fails the job, or restarts it from its last checkpoint while it has restarts left
(``services/restarts.py``); the monitor then stops the others.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from ffdl.core.status import (
    PIPELINE,
    TERMINAL_LEARNER_STATES,
    ErrorCode,
    JobStatus,
    LearnerStatus,
    is_terminal,
)
from ffdl.server.services.restarts import restart_failed
from ffdl.server.store.models import Job, Learner
from ffdl.server.store.transitions import set_job_status

_JOB_STEPS = (
    JobStatus.PENDING,
    JobStatus.DOWNLOADING,
    JobStatus.PROCESSING,
    JobStatus.STORING,
    JobStatus.COMPLETED,
)


def aggregate_job(session: Session, job: Job, learners: list[Learner]) -> None:
    status = JobStatus(job.status)
    if is_terminal(status) or not learners or status in (JobStatus.QUEUED, JobStatus.HALTED):
        return
    if status == JobStatus.RESCALING:
        return
    states = [LearnerStatus(lr.status) for lr in learners]
    failed = [lr for lr in learners if lr.status == LearnerStatus.FAILED.value]
    if status == JobStatus.HALTING:
        # Stopping was asked for (a halt or a preemption): a learner lost on the way out
        # still leaves the job resumable from its last checkpoint, as a halt does.
        if all(s in TERMINAL_LEARNER_STATES for s in states):
            if all(s == LearnerStatus.COMPLETED for s in states):
                set_job_status(session, job, JobStatus.COMPLETED, "completed before the halt")
            elif failed:
                first = min(failed, key=lambda lr: lr.updated_at)
                reason = f"halted; learner {first.index} ended: {first.reason or 'failed'}"
                set_job_status(session, job, JobStatus.HALTED, reason)
            else:
                set_job_status(session, job, JobStatus.HALTED, job.reason or "halted")
        return
    if failed:
        aggregate_job_failure(session, job, min(failed, key=lambda lr: lr.updated_at))
        return
    if LearnerStatus.HALTED in states:
        if all(s in TERMINAL_LEARNER_STATES for s in states):
            if all(s == LearnerStatus.COMPLETED for s in states):
                set_job_status(session, job, JobStatus.COMPLETED, "completed before the halt")
            else:
                set_job_status(session, job, JobStatus.HALTING, "learners halted")
                set_job_status(session, job, JobStatus.HALTED, job.reason or "halted")
        return
    if any(s == LearnerStatus.CANCELLED for s in states):
        return  # cancellation is finished by the lifecycle manager
    slowest = min(PIPELINE.index(s) for s in states)
    target_index = slowest
    current_index = _JOB_STEPS.index(status)
    for step in _JOB_STEPS[current_index + 1 : target_index + 1]:
        exit_code = 0 if step == JobStatus.COMPLETED else None
        set_job_status(session, job, step, _step_reason(step), exit_code=exit_code)


def aggregate_job_failure(session: Session, job: Job, learner: Learner) -> None:
    """``learner`` failed: restart ``job`` if it may, else fail it with the learner's reason
    and codes. A job its user cancels is left to the lifecycle manager, which ends it
    CANCELLED: its learners fail because of the cancellation, not of their own."""
    if job.desired == "cancel":
        return
    cause = learner.reason or f"learner {learner.index} failed"
    if restart_failed(session, job, cause):
        return
    set_job_status(
        session,
        job,
        JobStatus.FAILED,
        cause,
        error_code=_learner_error_code(learner),
        exit_code=learner.exit_code,
    )


def _learner_error_code(learner: Learner) -> str:
    return learner.error_code or ErrorCode.LEARNER_CRASHED.value


def _step_reason(step: JobStatus) -> str:
    return {
        JobStatus.DOWNLOADING: "staging data and code",
        JobStatus.PROCESSING: "training",
        JobStatus.STORING: "storing results",
        JobStatus.COMPLETED: "completed",
    }.get(step, "")
