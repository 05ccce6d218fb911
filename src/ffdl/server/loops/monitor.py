"""The job monitor: notices silent controllers and stops the leftovers of finished jobs.

A learner whose controller has been quiet for two heartbeats, or for two of the gaps the
replicas ask between its posts when the learners are paced, is polled on the backend:
a controller that exited leaves its final result, which is applied as if reported; one
that vanished fails the learner (and so the job) with S201; one that runs but stays silent
past the heartbeat timeout is killed and failed. A controller that has not reported once
since its launch is still starting (a worker being spawned on a busy node), and has the
deploy timeout before it counts as lost. Either way, the output lines the lost controller
had read but not delivered are first recovered from its record (``salvage``).
Learners still alive in an attempt that is over (the others of a failed gang, a job gone
back to the queue to restart) are killed.

Silence is counted only over time the control plane could hear the controllers: from the
latest of the last heartbeat, this replica's start, the moment it took the monitor's lease,
and the end of the last database outage any replica saw (``Replica.database_returned_at``,
and this process's own). While the server was down, the monitor led nowhere, or the
database away, nobody could record a heartbeat (controllers spool their reports and carry
on), so afterwards each gets a full heartbeat timeout to get through again. One learner's
trouble (an exception polling or killing it) is logged as that learner's, and the pass
goes on with the others; a backend that cannot be reached now (``BackendUnavailable``)
is no trouble of the learner's: it is skipped and looked at again on the next pass. A
learner the backend reports gone with a reason (its node was lost) fails with that reason.

Each pass also records the cluster's history (``services/history.py``) when its interval
has passed: the monitor's leader is the one replica that writes it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ffdl.backends.base import BackendUnavailable, LearnerState
from ffdl.core.errors import IllegalTransition, Unavailable
from ffdl.core.status import (
    HOLDING_JOB_STATES,
    TERMINAL_JOB_STATES,
    TERMINAL_LEARNER_STATES,
    ErrorCode,
    JobStatus,
    LearnerStatus,
)
from ffdl.server.leases import live_replica_urls
from ffdl.server.platform import Platform
from ffdl.server.services.aggregate import aggregate_job
from ffdl.server.services.history import record_cluster_sample
from ffdl.server.services.queries import current_learners
from ffdl.server.services.salvage import salvage_output
from ffdl.server.store.models import Job, Learner, Replica
from ffdl.server.store.transitions import set_learner_status, utcnow

log = logging.getLogger("ffdl.monitor")


@dataclass(frozen=True, slots=True)
class _Watch:
    job_id: str
    index: int
    attempt: int
    handle: dict[str, Any]
    silent_s: float
    job_ended: bool
    # Why an ended attempt's learner is stopped, when ``job_ended``.
    stop_reason: str = "stopped: job ended"
    # Whether its controller has reported at all: one still starting (a Ray worker being
    # spawned on a busy node) is not silent yet, and gets the deploy timeout instead.
    heard: bool = True


def heard_since(platform: Platform, session: Session) -> datetime:
    """Since when, at the latest, the control plane has been able to hear every controller."""
    moments = [platform.started_at]
    returned = platform.store.availability.returned_at
    if returned is not None:
        moments.append(returned)
    if platform.keeper is not None:
        led = platform.keeper.led_since("monitor")
        if led is not None:
            moments.append(led)
    elsewhere = session.scalar(select(func.max(Replica.database_returned_at)))
    if elsewhere is not None:
        moments.append(elsewhere)
    return max(moments)


def quiet_after(platform: Platform, session: Session, learners: int, now: datetime) -> timedelta:
    """How long a learner may go without a post before the monitor polls it: two of its
    heartbeats, or two of the gaps the replicas ask between its posts
    (``ffdl.server.report_pace``) when that is longer. Polling every learner a pace
    holds back would cost a backend call per learner per pass, for nothing."""
    settings = platform.settings
    alive = timedelta(seconds=3 * settings.lease_ttl_s)
    every, api_only = live_replica_urls(session, now=now, alive_within=alive)
    pace = platform.report_pace.expected(learners, len(api_only or every))
    return timedelta(seconds=max(2 * settings.heartbeat_s, 2 * pace, 1.0))


def monitor_pass(platform: Platform) -> None:
    now = utcnow()
    live = [s.value for s in LearnerStatus if s not in TERMINAL_LEARNER_STATES]
    watches: list[_Watch] = []
    with platform.store.read() as session:
        since = heard_since(platform, session)
        rows = session.execute(
            select(Learner, Job.status, Job.attempt)
            .join(Job, Job.id == Learner.job_id)
            .where(Learner.status.in_(live))
        ).all()
        quiet = quiet_after(platform, session, len(rows), now)
        for learner, job_status, job_attempt in rows:
            status = JobStatus(job_status)
            # A job that holds nothing (QUEUED to restart, HALTED) has no attempt running.
            ended = status not in HOLDING_JOB_STATES or learner.attempt != job_attempt
            last = max(learner.last_heartbeat or learner.updated_at, since)
            if ended or now - last > quiet:
                watches.append(
                    _Watch(
                        learner.job_id,
                        learner.index,
                        learner.attempt,
                        dict(learner.handle or {}),
                        (now - last).total_seconds(),
                        ended,
                        _stop_reason(status, learner.attempt, job_attempt),
                        heard=learner.last_heartbeat is not None,
                    )
                )
    changed = False
    for watch in watches:
        try:
            changed |= _check(platform, watch)
        except BackendUnavailable as exc:
            log.debug(
                "learner %d of %s (attempt %d) not checked: %s",
                watch.index,
                watch.job_id,
                watch.attempt,
                exc,
            )
        except Unavailable:
            raise  # the database is away: the pass stops, and the next one looks again
        except Exception:
            log.exception(
                "checking learner %d of %s (attempt %d) failed; next pass tries again",
                watch.index,
                watch.job_id,
                watch.attempt,
            )
    if changed:
        platform.wakeups.notify("scheduler", "lcm")
    try:
        record_cluster_sample(platform)
    except BackendUnavailable as exc:
        log.debug("no cluster sample this pass: %s", exc)


def _stop_reason(status: JobStatus, attempt: int, job_attempt: int) -> str:
    if status in TERMINAL_JOB_STATES:
        return "stopped: job ended"
    if attempt != job_attempt:
        return f"stopped: attempt {attempt} was superseded by attempt {job_attempt}"
    if status == JobStatus.QUEUED:
        return "stopped: the job restarts"
    return f"stopped: job {status.value}"


def _check(platform: Platform, watch: _Watch) -> bool:
    settings = platform.settings
    if not watch.handle:
        # Not launched yet: the deploy timeout covers a launch that never happens.
        if watch.silent_s > settings.deploy_timeout_s or watch.job_ended:
            reason = watch.stop_reason if watch.job_ended else "learner was never launched"
            return _settle(platform, watch, LearnerStatus.FAILED, reason, None, None)
        return False
    if watch.job_ended:
        platform.backend.kill(watch.handle)
        return _settle(platform, watch, LearnerStatus.CANCELLED, watch.stop_reason, None, None)
    polled = platform.backend.poll(watch.handle)
    if polled.state == LearnerState.RUNNING:
        if watch.heard:
            allowed = settings.heartbeat_timeout_s
            reason = f"controller silent for {watch.silent_s:.0f}s; killed"
        else:
            allowed = max(settings.deploy_timeout_s, settings.heartbeat_timeout_s)
            reason = f"controller launched {watch.silent_s:.0f}s ago never reported; killed"
        if watch.silent_s <= allowed:
            return False
        platform.backend.kill(watch.handle)
        salvage_output(platform, watch.job_id, watch.index, watch.attempt, watch.handle)
        return _settle(
            platform, watch, LearnerStatus.FAILED, reason, ErrorCode.CONTROLLER_LOST.value, None
        )
    if polled.state == LearnerState.EXITED and polled.result:
        # It ended without its last reports reaching us (say it gave up while the API was
        # away): what it could not deliver is still in its record.
        salvage_output(platform, watch.job_id, watch.index, watch.attempt, watch.handle)
        result = polled.result
        try:
            target = LearnerStatus(str(result.get("status")))
        except ValueError:
            target = LearnerStatus.FAILED
        exit_code = result.get("exit_code")
        return _settle(
            platform,
            watch,
            target,
            str(result.get("reason") or ""),
            result.get("error_code"),
            int(exit_code) if isinstance(exit_code, int) else None,
        )
    # Gone without a trace (killed, say): the backend still ends and removes what its
    # sandbox left behind (cgroup, network namespace).
    platform.backend.kill(watch.handle)
    salvage_output(platform, watch.job_id, watch.index, watch.attempt, watch.handle)
    return _settle(
        platform,
        watch,
        LearnerStatus.FAILED,
        polled.reason or f"controller of learner {watch.index} is gone without a result",
        ErrorCode.CONTROLLER_LOST.value,
        None,
    )


def _settle(
    platform: Platform,
    watch: _Watch,
    target: LearnerStatus,
    reason: str,
    error_code: str | None,
    exit_code: int | None,
) -> bool:
    with platform.store.write() as session:
        learner = session.scalars(
            select(Learner).where(
                Learner.job_id == watch.job_id,
                Learner.index == watch.index,
                Learner.attempt == watch.attempt,
            )
        ).first()
        job = session.get(Job, watch.job_id)
        if learner is None or job is None:
            return False
        if LearnerStatus(learner.status) in TERMINAL_LEARNER_STATES:
            return False  # it reported meanwhile
        try:
            set_learner_status(
                session, learner, target, reason, exit_code=exit_code, error_code=error_code
            )
        except IllegalTransition:
            set_learner_status(
                session,
                learner,
                LearnerStatus.FAILED,
                reason,
                exit_code=exit_code,
                error_code=error_code,
            )
        if learner.attempt == job.attempt:
            learners = current_learners(session, job)
            aggregate_job(session, job, learners)
    return True
