"""The cluster over time: GPUs total, allocated and really busy, the queue and the running
jobs, one ``cluster_samples`` row every ``cluster_sample_s`` (the monitor's leader records
it, so replicas do not record twice).

Retention is bounded by thinning: rows younger than an hour are kept as recorded; older
ones are merged into one row per minute up to a day, one per ten minutes up to thirty
days, and rows older than that are dropped. A merged row holds the span-weighted means of
the rows it replaces, and their whole span.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from sqlalchemy import and_, delete, func, select
from sqlalchemy.orm import Session

from ffdl.core.resources import Placement
from ffdl.core.status import HOLDING_JOB_STATES, JobStatus
from ffdl.server.platform import Platform
from ffdl.server.services.nodes import effective_nodes
from ffdl.server.store.models import ClusterSample, Job, Learner

HOUR, DAY = 3600.0, 86400.0
# (rows older than this, are merged into buckets of this many seconds)
TIERS = ((HOUR, 60.0), (DAY, 600.0))
KEPT_FOR_S = 30 * DAY


def record_cluster_sample(platform: Platform, now: float | None = None) -> bool:
    """Record a sample if ``cluster_sample_s`` has passed since the last; whether it did."""
    at = time.time() if now is None else now
    interval = platform.settings.cluster_sample_s
    if interval <= 0:
        return False
    with platform.store.read() as session:
        last = session.scalar(select(func.max(ClusterSample.time)))
    if last is not None and at - last < interval * 0.95:
        return False
    # The backend may be remote: asked before the write transaction, never inside it.
    total = sum(node.gpus for node in effective_nodes(platform) if node.schedulable)
    holding = [status.value for status in HOLDING_JOB_STATES]
    with platform.store.write() as session:
        jobs = session.execute(select(Job.gpus, Job.placement).where(Job.status.in_(holding))).all()
        queued = session.scalar(
            select(func.count()).select_from(Job).where(Job.status == JobStatus.QUEUED.value)
        )
        readings = session.execute(
            select(Learner.gpu_ids, Learner.gpu_util)
            .join(Job, and_(Job.id == Learner.job_id, Job.attempt == Learner.attempt))
            .where(Job.status.in_(holding), Learner.gpu_util.is_not(None))
        ).all()
        allocated = sum(
            gpus * len(Placement.from_json(placement or []).learners) for gpus, placement in jobs
        )
        busy = sum(len(gpu_ids or []) * float(util) / 100.0 for gpu_ids, util in readings)
        span = interval if last is None else min(at - last, 3 * interval)
        session.add(
            ClusterSample(
                time=at,
                span_s=span,
                gpus_total=total,
                gpus_allocated=allocated,
                gpus_busy=round(busy, 3),
                queue_length=int(queued or 0),
                running=len(jobs),
            )
        )
        thin(session, at)
    return True


def thin(session: Session, now: float) -> None:
    """Merge and drop old rows as the module docstring says."""
    session.flush()
    session.execute(delete(ClusterSample).where(ClusterSample.time < now - KEPT_FOR_S))
    for older_than, bucket in TIERS:
        rows = session.scalars(
            select(ClusterSample)
            .where(ClusterSample.time < now - older_than)
            .order_by(ClusterSample.time)
        ).all()
        groups: dict[int, list[ClusterSample]] = defaultdict(list)
        for row in rows:
            groups[int(row.time // bucket)].append(row)
        for group in groups.values():
            if len(group) > 1:
                _merge(session, group)


def _merge(session: Session, rows: list[ClusterSample]) -> None:
    keep, gone = rows[-1], rows[:-1]
    span = sum(row.span_s for row in rows) or 1.0

    def mean(name: str) -> float:
        return sum(float(getattr(row, name)) * row.span_s for row in rows) / span

    keep.gpus_busy = round(mean("gpus_busy"), 3)
    keep.gpus_allocated = round(mean("gpus_allocated"))
    keep.queue_length = round(mean("queue_length"))
    keep.running = round(mean("running"))
    keep.gpus_total = round(mean("gpus_total"))
    keep.span_s = span
    session.execute(delete(ClusterSample).where(ClusterSample.time.in_([row.time for row in gone])))


def history(session: Session, since: float | None) -> dict[str, Any]:
    """``GET /v1/cluster/history``: the samples after ``since``, oldest first."""
    query = select(ClusterSample)
    if since is not None:
        query = query.where(ClusterSample.time > since)
    rows = session.scalars(query.order_by(ClusterSample.time)).all()
    return {
        "samples": [
            {
                "time": row.time,
                "span_s": row.span_s,
                "gpus_total": row.gpus_total,
                "gpus_allocated": row.gpus_allocated,
                "gpus_busy": row.gpus_busy,
                "queue_length": row.queue_length,
                "running": row.running,
            }
            for row in rows
        ]
    }
