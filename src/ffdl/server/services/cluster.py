"""The cluster and queue views: who holds which GPUs, and what waits for what."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select

from ffdl.core.resources import Placement, Resources
from ffdl.core.status import HOLDING_JOB_STATES, JobStatus
from ffdl.server.auth import Principal
from ffdl.server.platform import Platform
from ffdl.server.services.nodes import effective_nodes
from ffdl.server.services.queries import eta_text, iso
from ffdl.server.store.models import Job


def cluster_view(platform: Platform) -> dict[str, Any]:
    holding = [s.value for s in HOLDING_JOB_STATES]
    with platform.store.read() as session:
        rows = session.execute(
            select(
                Job.id,
                Job.tenant_id,
                Job.status,
                Job.placement,
                Job.gpus,
                Job.cpus,
                Job.memory_mb,
            ).where(Job.status.in_(holding))
        ).all()
    nodes = effective_nodes(platform)
    used = {n.name: Resources() for n in nodes}
    holders: dict[str, list[dict[str, Any]]] = {n.name: [] for n in nodes}
    for row in rows:
        per_learner = Resources(row.gpus, row.cpus, row.memory_mb)
        for lp in Placement.from_json(row.placement or []).learners:
            if lp.node not in used:
                continue
            used[lp.node] = used[lp.node] + per_learner
            holders[lp.node].append(
                {
                    "model_id": row.id,
                    "tenant": row.tenant_id,
                    "status": row.status,
                    "learner": lp.learner,
                    "gpu_ids": list(lp.gpu_ids),
                }
            )
    return {
        "nodes": [
            {
                "name": n.name,
                "gpus": n.gpus,
                "cpus": n.cpus,
                "memory": n.memory_mb,
                "memory_unit": "MiB",
                "gpu_type": n.gpu_type,
                "labels": n.labels,
                "schedulable": n.schedulable,
                "used": {
                    "gpus": used[n.name].gpus,
                    "cpus": used[n.name].cpus,
                    "memory": used[n.name].memory_mb,
                },
                "holders": holders[n.name],
            }
            for n in nodes
        ]
    }


def queue_view(platform: Platform, principal: Principal) -> dict[str, Any]:
    """Queued jobs in queue order; members see their own tenant's, admins everyone's."""
    query = select(Job).where(Job.status == JobStatus.QUEUED.value)
    if not principal.is_admin:
        query = query.where(Job.tenant_id == principal.tenant_id)
    with platform.store.read() as session:
        jobs = session.scalars(query).all()
    now = datetime.now(UTC).timestamp()
    unplaced = 1 << 30
    jobs = sorted(jobs, key=lambda j: (j.queue_position or unplaced, -j.priority, j.submitted_at))
    entries = []
    for job in jobs:
        eta_s = None if job.queue_eta_at is None else max(job.queue_eta_at - now, 0.0)
        entries.append(
            {
                "model_id": job.id,
                "name": job.name,
                "tenant": job.tenant_id,
                "priority": job.priority,
                "learners": job.learners,
                "gpus": job.gpus,
                "position": job.queue_position,
                "eta": eta_text(eta_s),
                "eta_s": eta_s,
                "reason": job.reason,
                "submitted": iso(job.submitted_at),
            }
        )
    return {"queue": entries}
