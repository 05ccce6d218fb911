"""Process-level Prometheus instruments: what this process observed as it ran.

Durations (API requests, loop passes, the optimizer, deploys) and the counts of what status
changes did (preemptions, rescales, restarts, failures by code) are observed where they
happen. Status changes are counted by ``record_transition``, which the one writer of a job's
status calls; the observation waits for its transaction to commit, so a change that rolls
back (a lost lease, a conflict) is never counted.

The instruments live in their own registry (``REGISTRY``), not the client library's global
one, so that the exposition holds ffdl's series only. Each process counts for itself:
replicas are separate scrape targets, and a counter restarts at zero with its process,
which Prometheus's ``rate`` and ``increase`` expect.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from sqlalchemy import event
from sqlalchemy.orm import Session, SessionTransaction

REGISTRY = CollectorRegistry(auto_describe=True)

# Seconds, from a fast API answer to a day in the queue.
_WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)
_FAST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
# A loop pass's, finer around the scheduling pass's goal of 0.2 s: a p99 read from the
# histogram can then say which side of it a pass falls (one series set per loop, so cheap).
_PASS_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2.5, 5, 10, 30)

API_REQUEST_SECONDS = Histogram(
    "ffdl_api_request_duration_seconds",
    "API request latency by route template, method and status code.",
    ["route", "method", "status"],
    buckets=_FAST_BUCKETS,
    registry=REGISTRY,
)
LOOP_PASS_SECONDS = Histogram(
    "ffdl_loop_pass_duration_seconds",
    "Duration of one pass of a background loop (scheduler, lcm, monitor, autoscaler, archiver).",
    ["loop"],
    buckets=_PASS_BUCKETS,
    registry=REGISTRY,
)
OPTIMIZER_SECONDS = Histogram(
    "ffdl_optimizer_duration_seconds",
    "Duration of the elastic optimizer's allocation in one autoscaler pass.",
    buckets=_FAST_BUCKETS,
    registry=REGISTRY,
)
DEPLOY_SECONDS = Histogram(
    "ffdl_deploy_duration_seconds",
    "Duration of one deploy by the lifecycle manager (prepare, stage, launch).",
    buckets=_FAST_BUCKETS,
    registry=REGISTRY,
)
QUEUE_DELAY_SECONDS = Histogram(
    "ffdl_queue_delay_seconds",
    "Time a job waited QUEUED before it was placed, per tenant.",
    ["tenant"],
    buckets=_WAIT_BUCKETS,
    registry=REGISTRY,
)
SUBMIT_TO_PROCESSING_SECONDS = Histogram(
    "ffdl_submit_to_processing_seconds",
    "Time from a job's submission to its first PROCESSING, per tenant.",
    ["tenant"],
    buckets=_WAIT_BUCKETS,
    registry=REGISTRY,
)
TRANSITIONS = Counter(
    "ffdl_job_transitions_total",
    "Job status changes, by the status entered.",
    ["tenant", "status"],
    registry=REGISTRY,
)
PREEMPTIONS = Counter(
    "ffdl_preemptions_total", "Jobs preempted by the scheduler.", ["tenant"], registry=REGISTRY
)
RESCALES = Counter(
    "ffdl_rescales_total", "Elastic rescales started.", ["tenant"], registry=REGISTRY
)
RESTARTS = Counter(
    "ffdl_restarts_total", "Automatic restarts after a failure.", ["tenant"], registry=REGISTRY
)
FAILURES = Counter(
    "ffdl_failures_total",
    "Jobs that failed, by ffdl error code.",
    ["tenant", "error_code"],
    registry=REGISTRY,
)
DATABASE_UP = Gauge(
    "ffdl_database_up",
    "1 while this process reaches its database, 0 while the database is unreachable.",
    registry=REGISTRY,
)
DATABASE_OUTAGES = Counter(
    "ffdl_database_outages_total",
    "Times this process found its database unreachable after reaching it.",
    registry=REGISTRY,
)
ARCHIVED_RECORDS = Counter(
    "ffdl_archived_records_total",
    "Log lines and metrics records moved out of the database into the archive store.",
    ["kind"],
    registry=REGISTRY,
)
ARCHIVE_FAILURES = Counter(
    "ffdl_archive_failures_total",
    "Chunks of records that could not be written to or read from the archive store.",
    ["operation"],
    registry=REGISTRY,
)
REPORT_BATCHES = Gauge(
    "ffdl_report_batches",
    "Learners' report batches in this process, by lane (records: log lines and metrics "
    "only; status: any other) and state (waiting for a turn, or being stored).",
    ["lane", "state"],
    registry=REGISTRY,
)

REPORTING_LEARNERS = Gauge(
    "ffdl_reporting_learners",
    "Learners that posted a report to this process lately (what its report pace is set by).",
    registry=REGISTRY,
)
REPORT_PACE = Gauge(
    "ffdl_report_pace_seconds",
    "The gap this process asks each learner to leave between its report posts.",
    registry=REGISTRY,
)
PROCESS_FROZEN_OBJECTS = Gauge(
    "ffdl_process_frozen_objects",
    "Objects this process froze after start-up, which garbage collections no longer walk.",
    registry=REGISTRY,
)
PROCESS_FROZEN_OBJECTS.set_function(gc.get_freeze_count)

# Where a session keeps the observations waiting for its commit (``after_commit``).
PENDING_OBSERVATIONS = "ffdl_telemetry_pending"


def after_commit(session: Session, observe: Callable[[], None]) -> None:
    """Run ``observe`` once ``session``'s transaction commits; never if it rolls back."""
    session.info.setdefault(PENDING_OBSERVATIONS, []).append(observe)


def _run_pending(session: Session) -> None:
    for observe in session.info.pop(PENDING_OBSERVATIONS, ()):
        observe()


def _drop_pending(session: Session, previous: SessionTransaction) -> None:
    # A savepoint rolled back leaves the transaction around it, and what it will commit:
    # whoever opened the savepoint drops the observations made inside it
    # (``store.group_commit``). Only the whole transaction's rollback drops them all.
    if previous.nested:
        return
    session.info.pop(PENDING_OBSERVATIONS, None)


event.listen(Session, "after_commit", _run_pending)
event.listen(Session, "after_soft_rollback", _drop_pending)


def record_transition(
    session: Session,
    *,
    tenant: str,
    from_status: str,
    to_status: str,
    now: datetime,
    submitted_at: datetime,
    queued_since: datetime,
    first_start: bool,
    preempted: bool,
    restart: bool,
    error_code: str | None,
) -> None:
    """Count one job status change (naive UTC times) once its transaction commits."""

    def observe() -> None:
        TRANSITIONS.labels(tenant, to_status).inc()
        if from_status == "QUEUED" and to_status == "PENDING":
            QUEUE_DELAY_SECONDS.labels(tenant).observe(_seconds(queued_since, now))
        if first_start:
            SUBMIT_TO_PROCESSING_SECONDS.labels(tenant).observe(_seconds(submitted_at, now))
        if to_status == "HALTING" and preempted:
            PREEMPTIONS.labels(tenant).inc()
        if to_status == "RESCALING":
            RESCALES.labels(tenant).inc()
        if to_status == "QUEUED" and restart:
            RESTARTS.labels(tenant).inc()
        if to_status == "FAILED":
            FAILURES.labels(tenant, error_code or "none").inc()

    after_commit(session, observe)


def _seconds(start: datetime, end: datetime) -> float:
    return max((end - start).total_seconds(), 0.0)


class Timer:
    """``with Timer(histogram):`` observes the block's wall time, even when it raises."""

    def __init__(self, observe: Callable[[float], None]) -> None:
        self._observe = observe
        self._started = 0.0

    def __enter__(self) -> Timer:
        self._started = time.perf_counter()
        return self

    def __exit__(self, *_: object) -> None:
        self._observe(time.perf_counter() - self._started)
