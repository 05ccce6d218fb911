"""The ORM schema (SQLAlchemy 2): tenants, users, tokens, jobs, learners, events, logs,
metrics, GPU samples and the cluster's history, and the replicas' loop leases.

Status columns are written only by ``transitions.py``. Log lines and metrics carry the
controller's per-attempt sequence number so that a retried report is never stored twice.
Every change to this schema comes with an Alembic migration in ``migrations/versions/``
(``ffdl db revision -m ...`` drafts one); a test fails while models and migrations differ.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
    true,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class Tenant(Base):
    __tablename__ = "tenants"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    max_gpus: Mapped[int | None] = mapped_column(Integer, default=None)
    max_running_jobs: Mapped[int | None] = mapped_column(Integer, default=None)
    created_at: Mapped[datetime]


class User(Base):
    __tablename__ = "users"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    name: Mapped[str] = mapped_column(String(200))
    role: Mapped[str] = mapped_column(String(16))  # platform-admin | admin | member
    created_at: Mapped[datetime]
    # The argon2id hash of the user's HTTP Basic password; None: no password, Basic refused.
    password_hash: Mapped[str | None] = mapped_column(String(255), default=None)


class ApiToken(Base):
    """A user's bearer token, stored only as its hash; ``id`` names it without revealing it.

    ``id``, ``name`` and ``expires_at`` are nullable because databases from before they
    existed gain them by ``ALTER TABLE``; bootstrap fills them in for such old rows.
    """

    __tablename__ = "api_tokens"
    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"))
    created_at: Mapped[datetime]
    id: Mapped[str | None] = mapped_column(String(32), default=None, unique=True, index=True)
    name: Mapped[str | None] = mapped_column(String(200), default=None)
    expires_at: Mapped[datetime | None] = mapped_column(default=None)
    last_used_at: Mapped[datetime | None] = mapped_column(default=None)


class AuditEvent(Base):
    """An administrative action: who did what to which object, and when.

    Separate from ``Event`` (a job's status history), which needs a job. ``tenant_id`` is
    the tenant the action concerns, so that its admins see what was done to it; ``None``
    for platform-wide actions such as draining a node.
    """

    __tablename__ = "audit_events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    actor_user_id: Mapped[str] = mapped_column(String(64))
    actor_tenant_id: Mapped[str] = mapped_column(String(64), index=True)
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(200))
    tenant_id: Mapped[str | None] = mapped_column(String(64), default=None, index=True)
    detail: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime]


class Job(Base):
    __tablename__ = "jobs"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id"))
    # The submit's Idempotency-Key (unique per user, see ``ux_jobs_user_idempotency``) and a
    # digest of the manifest and archive it came with, so a retry is told from a misuse.
    idempotency_key: Mapped[str | None] = mapped_column(String(200), default=None)
    idempotency_digest: Mapped[str | None] = mapped_column(String(64), default=None)
    name: Mapped[str] = mapped_column(String(200))
    description: Mapped[str] = mapped_column(Text, default="")
    manifest: Mapped[dict[str, Any]]
    status: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    error_code: Mapped[str | None] = mapped_column(String(8), default=None)
    exit_code: Mapped[int | None] = mapped_column(Integer, default=None)
    priority: Mapped[int] = mapped_column(Integer, default=50)
    learners: Mapped[int] = mapped_column(Integer)
    gpus: Mapped[int] = mapped_column(Integer)  # per learner
    cpus: Mapped[float] = mapped_column(Float)
    memory_mb: Mapped[int] = mapped_column(Integer)
    # Scheduling inputs copied out of the manifest so a pass never re-parses manifests.
    gpu_type: Mapped[str | None] = mapped_column(String(100), default=None)  # one type only
    gpu_types: Mapped[list[str] | None] = mapped_column(JSON, default=None)  # None: any type
    mix_gpu_types: Mapped[bool] = mapped_column(default=False, server_default=false())
    placement_policy: Mapped[str | None] = mapped_column(String(16), default=None)
    same_label: Mapped[str | None] = mapped_column(String(100), default=None)
    expected_duration_s: Mapped[float | None] = mapped_column(Float, default=None)
    placement: Mapped[list[Any] | None] = mapped_column(JSON, default=None)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    # Elastic jobs: the global batch size of the current attempt, a user's pinned GPU count
    # (`ffdl scale`), and the size a rescale in progress is heading for.
    elastic: Mapped[bool] = mapped_column(default=False)
    batch_size: Mapped[int | None] = mapped_column(Integer, default=None)
    pinned_gpus: Mapped[int | None] = mapped_column(Integer, default=None)
    pinned_gpu_type: Mapped[str | None] = mapped_column(String(100), default=None)
    # Finish-time fairness so far (``ffdl.elastic.fairness.finish_time_fairness``), elastic jobs.
    rho: Mapped[float | None] = mapped_column(Float, default=None)
    rescale_target: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    # Desired state written by the API and reconciled by the loops: "halt" | "cancel" | None.
    desired: Mapped[str | None] = mapped_column(String(16), default=None)
    master_port: Mapped[int | None] = mapped_column(Integer, default=None)
    results_location: Mapped[str | None] = mapped_column(Text, default=None)
    # The framework runtime the job runs on (resolved at submit, again at each deploy).
    runtime: Mapped[str | None] = mapped_column(String(200), default=None)
    queue_position: Mapped[int | None] = mapped_column(Integer, default=None)
    queue_eta_at: Mapped[float | None] = mapped_column(Float, default=None)  # epoch seconds
    # The start time the queue first showed for this job (epoch seconds), kept after it
    # starts so that a finished job can say how far its estimate was from its real start.
    first_queue_eta_at: Mapped[float | None] = mapped_column(Float, default=None)
    # How far a running job has come and when it should end, from what it reports
    # (``ffdl.scheduler.remaining``); queued jobs' ETAs use ``estimated_end_at``.
    progress: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    estimated_end_at: Mapped[float | None] = mapped_column(Float, default=None)
    # Measured GPU use over the job's life: the sample-time-weighted average utilisation in
    # percent, the seconds it covers, since when (epoch seconds) its GPUs have been idle, and
    # when that idleness was flagged as waste (an event and a metric).
    gpu_util_avg: Mapped[float | None] = mapped_column(Float, default=None)
    gpu_util_span_s: Mapped[float | None] = mapped_column(Float, default=None)
    gpu_idle_since: Mapped[float | None] = mapped_column(Float, default=None)
    gpu_idle_flagged_at: Mapped[float | None] = mapped_column(Float, default=None)
    # Automatic restarts (``services/restarts.py``): how many this run of the job has taken
    # (None in older databases: none), and the end of the back-off before the next attempt.
    restarts: Mapped[int | None] = mapped_column(Integer, default=0)
    # The numbers last given to the job's log lines and metrics: each job counts its own
    # from 1 (FfDL's rindex), under the job's row lock that its reports already take.
    last_line_number: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    last_metric_number: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Records numbered up to these moved to the archive (``RecordChunk``); 0 for none.
    archived_line_number: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    archived_metric_number: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    not_before: Mapped[datetime | None] = mapped_column(default=None)
    submitted_at: Mapped[datetime]
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
    status_changed_at: Mapped[datetime]
    __table_args__ = (
        # The list's order, a tenant's (a member's pages) and over every tenant (a platform
        # admin's); the id in each lets a page's offset be counted in the index alone.
        Index("ix_jobs_tenant_submitted_id", "tenant_id", "submitted_at", "id"),
        Index("ix_jobs_submitted_id", "submitted_at", "id"),
        # Counting jobs by tenant and status (``/metrics``) reads this index alone.
        Index("ix_jobs_tenant_status", "tenant_id", "status"),
    )


# Outside the class so that databases from before migrations get it from
# ``schema.add_missing_columns`` like any index; keys are NULL for most jobs, and NULLs
# never collide.
Index("ux_jobs_user_idempotency", Job.user_id, Job.idempotency_key, unique=True)


class Learner(Base):
    __tablename__ = "learners"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    index: Mapped[int] = mapped_column(Integer)  # 1-based LEARNER_ID
    attempt: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))
    node: Mapped[str] = mapped_column(String(200))
    gpu_ids: Mapped[list[Any]]
    handle: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    exit_code: Mapped[int | None] = mapped_column(Integer, default=None)
    error_code: Mapped[str | None] = mapped_column(String(8), default=None)
    reason: Mapped[str] = mapped_column(Text, default="")
    report_seq: Mapped[int] = mapped_column(Integer, default=0)
    last_heartbeat: Mapped[datetime | None] = mapped_column(default=None)
    # The learner's latest GPU sample: the mean utilisation (percent) of its GPUs, their
    # memory in use (MiB) and power (W) summed, per GPU in ``gpu_stats``, and when.
    gpu_util: Mapped[float | None] = mapped_column(Float, default=None)
    gpu_memory_mb: Mapped[float | None] = mapped_column(Float, default=None)
    gpu_power_w: Mapped[float | None] = mapped_column(Float, default=None)
    gpu_stats: Mapped[list[Any] | None] = mapped_column(JSON, default=None)
    gpu_sampled_at: Mapped[float | None] = mapped_column(Float, default=None)
    updated_at: Mapped[datetime]
    __table_args__ = (UniqueConstraint("job_id", "index", "attempt"),)


class Event(Base):
    __tablename__ = "events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    learner: Mapped[int | None] = mapped_column(Integer, default=None)
    from_status: Mapped[str | None] = mapped_column(String(16))
    to_status: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime]


class NodeState(Base):
    """Operator state of a node the backend reports: drained nodes take no new work."""

    __tablename__ = "node_states"
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    drained: Mapped[bool] = mapped_column(default=False)
    reason: Mapped[str] = mapped_column(Text, default="")
    changed_at: Mapped[datetime]


class DeployStep(Base):
    __tablename__ = "deploy_steps"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    step: Mapped[str] = mapped_column(String(64), primary_key=True)
    done_at: Mapped[datetime]


class LogLine(Base):
    __tablename__ = "log_lines"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    learner: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer)
    seq: Mapped[int] = mapped_column(Integer)
    # The line's place in its job's log, from 1 (``meta.rindex``; cursors of followers).
    number: Mapped[int] = mapped_column(Integer)
    stream: Mapped[str] = mapped_column(String(8))
    text: Mapped[str] = mapped_column(Text)
    time: Mapped[float] = mapped_column(Float)
    __table_args__ = (
        Index("ux_log_lines_job_number", "job_id", "number", unique=True),
        UniqueConstraint("job_id", "learner", "attempt", "seq"),
    )


class Metric(Base):
    __tablename__ = "metrics"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    learner: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer)
    seq: Mapped[int] = mapped_column(Integer)
    group: Mapped[str] = mapped_column(String(100))
    iteration: Mapped[int | None] = mapped_column(Integer, default=None)
    values: Mapped[dict[str, Any]]
    time: Mapped[float] = mapped_column(Float)
    # The record's place among its job's metrics, from 1 (as ``LogLine.number``).
    number: Mapped[int] = mapped_column(Integer)
    __table_args__ = (
        Index("ux_metrics_job_number", "job_id", "number", unique=True),
        UniqueConstraint("job_id", "learner", "attempt", "seq"),
    )


class RecordChunk(Base):
    """A run of a job's log lines or metrics (``kind``), numbered ``first_number`` to
    ``last_number`` without gaps, moved out of the database into the archive store at
    ``key`` as one compressed object (``ffdl.server.services.record_archive``)."""

    __tablename__ = "record_chunks"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(8))  # "log" | "metric"
    first_number: Mapped[int] = mapped_column(Integer)
    last_number: Mapped[int] = mapped_column(Integer)
    # The earliest and latest of the records' times (epoch seconds): a read from a time skips
    # the chunks whose records all come before it without fetching them.
    min_time: Mapped[float] = mapped_column(Float)
    max_time: Mapped[float] = mapped_column(Float)
    key: Mapped[str] = mapped_column(Text)
    size_bytes: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime]
    __table_args__ = (
        Index("ux_record_chunks_job_kind_first", "job_id", "kind", "first_number", unique=True),
    )


class GpuSample(Base):
    """One learner's GPUs over ``span_s`` seconds ending at ``time``.

    Controllers send a sample every few seconds; older ones are merged pairwise into longer
    spans so that a long job keeps a bounded series (``ffdl.server.services.gpu_samples``).
    """

    __tablename__ = "gpu_samples"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    learner: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer)
    node: Mapped[str] = mapped_column(String(200), default="")
    time: Mapped[float] = mapped_column(Float)
    span_s: Mapped[float] = mapped_column(Float)
    util: Mapped[float] = mapped_column(Float)  # mean over the learner's GPUs, percent
    memory_mb: Mapped[float] = mapped_column(Float)  # summed over its GPUs
    power_w: Mapped[float | None] = mapped_column(Float, default=None)
    gpus: Mapped[list[Any]] = mapped_column(JSON, default=list)
    __table_args__ = (Index("ix_gpu_samples_job", "job_id", "learner", "time"),)


class ClusterSample(Base):
    """The cluster at one moment: GPUs total, allocated and really busy, and the queue."""

    __tablename__ = "cluster_samples"
    time: Mapped[float] = mapped_column(Float, primary_key=True)
    span_s: Mapped[float] = mapped_column(Float)
    gpus_total: Mapped[int] = mapped_column(Integer)
    gpus_allocated: Mapped[int] = mapped_column(Integer)
    gpus_busy: Mapped[float] = mapped_column(Float)  # sum of utilisation / 100
    queue_length: Mapped[int] = mapped_column(Integer)
    running: Mapped[int] = mapped_column(Integer)


class WebhookEndpoint(Base):
    """A callback URL registered for one job and event type, and where its delivery stands.

    ``cursor`` is the id of the last ``Event`` delivered (or given up on): deliveries resume
    from it after a restart. ``attempts`` counts failed tries of the event after it, and
    ``next_attempt_at`` is the end of the back-off before the next try. The signing secret
    is sealed like data-store credentials.
    """

    __tablename__ = "webhook_endpoints"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    event_type: Mapped[str] = mapped_column(String(32))
    endpoint_id: Mapped[str] = mapped_column(String(64))
    url: Mapped[str] = mapped_column(Text)
    secret_sealed: Mapped[str] = mapped_column(Text)
    cursor: Mapped[int] = mapped_column(Integer, default=0)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime | None] = mapped_column(default=None)
    delivered: Mapped[int] = mapped_column(Integer, default=0)
    given_up: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str | None] = mapped_column(Text, default=None)
    last_delivery_at: Mapped[datetime | None] = mapped_column(default=None)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    __table_args__ = (UniqueConstraint("job_id", "event_type", "endpoint_id"),)


class Lease(Base):
    """Who runs one background loop (``name``: scheduler, lcm, ...) among the replicas.

    ``token`` grows by one at every change of holder: it is the fencing token that a loop's
    writes carry, so the writes of a holder that lost the lease (frozen, partitioned) are
    refused once another replica took it. See ``ffdl.server.leases``.
    """

    __tablename__ = "leases"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str | None] = mapped_column(String(128), default=None)
    token: Mapped[int] = mapped_column(Integer, default=0)
    acquired_at: Mapped[datetime | None] = mapped_column(default=None)
    expires_at: Mapped[datetime | None] = mapped_column(default=None)


class Replica(Base):
    """One running control-plane process (``ffdl up``, or one worker of its pool)."""

    __tablename__ = "replicas"
    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    url: Mapped[str] = mapped_column(String(500))
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    version: Mapped[str] = mapped_column(String(64))
    started_at: Mapped[datetime]
    seen_at: Mapped[datetime]
    # Set when the replica stopped cleanly; a replica that died just stops being seen.
    stopped_at: Mapped[datetime | None] = mapped_column(default=None)
    # When this replica last saw the database come back after an outage: the job monitor
    # counts no learner's silence from before it (``loops/monitor.py``).
    database_returned_at: Mapped[datetime | None] = mapped_column(default=None)
    # False for a replica that serves the API only (``run_loops: false``): it never leads a
    # loop, and the loops' replicas do not count it when they divide the loops.
    runs_loops: Mapped[bool] = mapped_column(default=True, server_default=true())
