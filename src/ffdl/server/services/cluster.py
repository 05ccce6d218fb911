"""The cluster and queue views: who holds which GPUs, and what waits for what; draining.

A caller sees its own tenant's jobs by id; another tenant's allocations show only as GPUs
"in use", so that the node view does not leak which jobs other tenants run. Platform
admins see everything, and only they drain and undrain nodes.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session

from ffdl.core.resources import Placement, Resources
from ffdl.core.status import HOLDING_JOB_STATES, JobStatus
from ffdl.elastic.fairness import entitlements
from ffdl.server.auth import Principal
from ffdl.server.leases import describe
from ffdl.server.platform import Platform
from ffdl.server.services import audit
from ffdl.server.services.admin import require_platform_admin
from ffdl.server.services.nodes import effective_nodes, set_drained
from ffdl.server.services.queries import eta_text, iso
from ffdl.server.store.models import Job, Learner, Tenant
from ffdl.server.store.transitions import utcnow

IN_USE = "in use"


def _holder(principal: Principal, row: Any, learner: int, gpu_ids: list[int]) -> dict[str, Any]:
    if principal.sees(row.tenant_id):
        return {
            "model_id": row.id,
            "tenant": row.tenant_id,
            "status": row.status,
            "learner": learner,
            "gpu_ids": gpu_ids,
        }
    return {"model_id": None, "tenant": None, "status": IN_USE, "learner": None, "gpu_ids": gpu_ids}


def cluster_view(platform: Platform, principal: Principal) -> dict[str, Any]:
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
        # Each current learner's latest GPU reading: how busy its node's GPUs really are.
        readings = session.execute(
            select(Learner.node, Learner.gpu_ids, Learner.gpu_util)
            .join(Job, and_(Job.id == Learner.job_id, Job.attempt == Learner.attempt))
            .where(Job.status.in_(holding), Learner.gpu_util.is_not(None))
        ).all()
    busy: dict[str, float] = {}
    for node, gpu_ids, util in readings:
        busy[node] = busy.get(node, 0.0) + len(gpu_ids or []) * float(util) / 100.0
    nodes = effective_nodes(platform)
    used = {n.name: Resources() for n in nodes}
    holders: dict[str, list[dict[str, Any]]] = {n.name: [] for n in nodes}
    for row in rows:
        per_learner = Resources(row.gpus, row.cpus, row.memory_mb)
        for lp in Placement.from_json(row.placement or []).learners:
            if lp.node not in used:
                continue
            used[lp.node] = used[lp.node] + per_learner
            holders[lp.node].append(_holder(principal, row, lp.learner, list(lp.gpu_ids)))
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
                # GPUs really busy: the sum of its learners' latest utilisation, in GPUs;
                # None until a learner on it has been sampled.
                "gpus_busy": round(busy[n.name], 2) if n.name in busy else None,
            }
            for n in nodes
        ]
    }


def queue_view(platform: Platform, principal: Principal) -> dict[str, Any]:
    """Queued jobs in queue order, and each tenant's share of the GPUs: the caller's tenant's,
    or everyone's for a platform admin."""
    total_gpus = sum(n.gpus for n in effective_nodes(platform) if n.schedulable)
    query = select(Job).where(Job.status == JobStatus.QUEUED.value)
    if not principal.is_platform_admin:
        query = query.where(Job.tenant_id == principal.tenant_id)
    with platform.store.read() as session:
        jobs = session.scalars(query).all()
        shares = tenant_shares(session, total_gpus)
    if not principal.is_platform_admin:
        shares = [s for s in shares if s["tenant"] == principal.tenant_id]
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
                "rho": job.rho,
            }
        )
    return {"queue": entries, "tenants": shares}


def tenant_shares(session: Session, total_gpus: int) -> list[dict[str, Any]]:
    """Each tenant with jobs running or queued: the GPUs it holds against those it is
    entitled to (its quota's share of the cluster among those tenants, as the elastic
    objective's ``max_min`` fairness weighs them; ``ffdl.elastic.fairness.entitlements``)."""
    holding = [s.value for s in HOLDING_JOB_STATES]
    held_rows = session.execute(
        select(Job.tenant_id, func.sum(Job.gpus * Job.learners))
        .where(Job.status.in_(holding))
        .group_by(Job.tenant_id)
    ).all()
    held = {tenant: gpus for tenant, gpus in held_rows}
    waiting = set(
        session.scalars(
            select(Job.tenant_id).where(Job.status == JobStatus.QUEUED.value).distinct()
        ).all()
    )
    quotas = {t: q for t, q in session.execute(select(Tenant.id, Tenant.max_gpus)).all()}
    active = sorted({t for t, gpus in held.items() if gpus} | waiting)
    share = entitlements(active, quotas)
    rows = []
    for tenant in active:
        entitled = share[tenant] * total_gpus
        gpus = int(held.get(tenant) or 0)
        rows.append(
            {
                "tenant": tenant,
                "gpus": gpus,
                "entitled_gpus": round(entitled, 2),
                "share": round(gpus / entitled, 3) if entitled > 0 else None,
                "max_gpus": quotas.get(tenant),
            }
        )
    return rows


def drain(
    platform: Platform, principal: Principal, name: str, drained: bool, reason: str = ""
) -> dict[str, Any]:
    """Drain or undrain a node (platform admins only), recorded in the audit log."""
    require_platform_admin(principal)
    result = set_drained(platform, principal, name, drained, reason)
    action = "node.drain" if drained else "node.undrain"
    with platform.store.write() as session:
        audit.record(session, principal, action, name, tenant_id=None, detail=reason)
    return result


def replicas_view(platform: Platform, principal: Principal) -> dict[str, Any]:
    """The control plane's replicas and which one runs each loop (platform admins only)."""
    require_platform_admin(principal)
    alive = timedelta(seconds=3 * platform.settings.lease_ttl_s)
    with platform.store.read() as session:
        view = describe(session, now=utcnow(), alive_within=alive)
    view["this_replica"] = platform.keeper.replica_id if platform.keeper else None
    return view
