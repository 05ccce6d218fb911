"""Automatic restarts: a failed attempt goes back through the queue while ``max_restarts``
allows, and resumes from the job's last checkpoint.

A learner that crashed (C201), a controller lost or silent (S201), a node whose learners
vanished: while the job has restarts left, the job goes back to QUEUED instead of FAILED,
its event naming the restart and the cause (``restart 1 of 3 after learner 1 exited with
code 1; ...``). The monitor then stops the rest of the gang (a QUEUED job holds nothing),
and the scheduler places it again as a new attempt once its back-off has passed. The
back-off doubles with every restart (``BACKOFF_FIRST_S``, capped at ``BACKOFF_MAX_S``) so
that a job which crashes at once does not loop. ``CHECKPOINT_DIR`` is the job's, not the
attempt's, so the SDK's ``load_checkpoint`` finds what the last attempt saved.

Never restarted: a job whose user asked it to halt or be cancelled (a learner that fails
while it stops is not a crash to retry), a job being halted for preemption or a drain
(it is requeued by that path), a job that completed. ``Job.restarts`` counts the restarts
of the current run; a user's resume of a FAILED job starts a new run with the whole budget
(``reset_for_resume``), a halt and resume keeps the count.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy.orm import Session

from ffdl.core.status import RUNNING_JOB_STATES, JobStatus, Via
from ffdl.server.store.models import Job
from ffdl.server.store.transitions import set_job_status, utcnow

# Seconds before the first restart, doubled for each later one, never more than the cap.
BACKOFF_FIRST_S = 5.0
BACKOFF_MAX_S = 300.0
# Statuses a restart can leave: the job runs (or is being rescaled) for its own sake.
_RESTARTABLE = frozenset({*RUNNING_JOB_STATES, JobStatus.RESCALING})


def max_restarts(job: Job) -> int:
    value = (job.manifest or {}).get("max_restarts")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def backoff_s(restart: int) -> float:
    """The wait before restart number ``restart`` (1-based)."""
    # The exponent is bounded so that a job with thousands of restarts cannot overflow it.
    return min(BACKOFF_FIRST_S * 2.0 ** min(max(restart - 1, 0), 30), BACKOFF_MAX_S)


def restart_failed(session: Session, job: Job, cause: str) -> bool:
    """Send ``job`` back to the queue because its attempt failed with ``cause``, if it may
    restart; False (nothing changed) when it has no restart left or must not restart."""
    if JobStatus(job.status) not in _RESTARTABLE or job.desired is not None:
        return False
    used = job.restarts or 0
    allowed = max_restarts(job)
    if used >= allowed:
        return False
    restart = used + 1
    now = utcnow()
    not_before = now + timedelta(seconds=backoff_s(restart))
    set_job_status(
        session,
        job,
        JobStatus.QUEUED,
        f"restart {restart} of {allowed} after {cause}",
        via=Via.RESTART,
    )
    job.restarts = restart
    job.not_before = not_before
    job.placement = None
    job.rescale_target = None  # a new attempt is sized afresh
    job.queue_position = None
    job.queue_eta_at = not_before.replace(tzinfo=UTC).timestamp()
    # The status line says why the job waits; the scheduler leaves it alone until then.
    job.reason = f"restarting after {cause}; back-off until {_clock(not_before)}"
    return True


def reset_for_resume(job: Job) -> None:
    """A user's resume of a FAILED job: a new run, with the whole restart budget."""
    job.restarts = 0
    job.not_before = None


def _clock(moment: datetime) -> str:
    return f"{moment:%H:%M:%S} UTC"
