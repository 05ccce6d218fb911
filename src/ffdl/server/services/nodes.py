"""Nodes as the platform schedules on them: the backend's nodes with operator state applied.

Draining a node (for maintenance) stops new work landing on it; the autoscaler then moves
or shrinks the jobs still there instead of killing them. Undrain returns it to service.
A backend that cannot be reached now offers no nodes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ffdl.backends.base import BackendUnavailable
from ffdl.core.errors import BadRequest, NotFound
from ffdl.core.resources import Node
from ffdl.core.status import HOLDING_JOB_STATES
from ffdl.server.auth import Principal
from ffdl.server.platform import Platform
from ffdl.server.services.admin import require_admin
from ffdl.server.store.models import Job, Learner, NodeState
from ffdl.server.store.transitions import utcnow

# A drain reason is a short note for other operators, shown in every node listing.
MAX_DRAIN_REASON = 200


def backend_nodes(platform: Platform) -> list[Node]:
    """The backend's nodes; none while it cannot be reached."""
    try:
        return platform.backend.nodes()
    except BackendUnavailable:
        return []


def effective_nodes(platform: Platform) -> list[Node]:
    with platform.store.read() as session:
        drained = set(session.scalars(select(NodeState.name).where(NodeState.drained)))
    return [
        replace(node, schedulable=False) if node.name in drained else node
        for node in backend_nodes(platform)
    ]


def set_drained(
    platform: Platform, principal: Principal, name: str, drained: bool, reason: str = ""
) -> dict[str, Any]:
    require_admin(principal)
    if len(reason) > MAX_DRAIN_REASON:
        raise BadRequest(
            f"reason must be at most {MAX_DRAIN_REASON} characters, got {len(reason)}",
            detail={"field": "reason"},
        )
    if name not in {node.name for node in backend_nodes(platform)}:
        raise NotFound(f"no node {name!r}")
    with platform.store.write() as session:
        state = session.get(NodeState, name)
        if state is None:
            state = NodeState(name=name, changed_at=utcnow())
            session.add(state)
        state.drained = drained
        state.reason = reason if drained else ""
        state.changed_at = utcnow()
        jobs = _jobs_on(session, name)
    platform.wakeups.notify("autoscaler", "scheduler")
    in_service = [node for node in effective_nodes(platform) if node.schedulable]
    return {
        "node": name,
        "drained": drained,
        "reason": reason if drained else "",
        # What a drain does to the work there: the jobs it moves, shrinks or halts, and the
        # nodes still in service that could take them.
        "jobs": len(jobs),
        "nodes_in_service": len(in_service),
    }


def _jobs_on(session: Session, name: str) -> set[str]:
    """The jobs holding a placement with a learner on node ``name``."""
    holding = [status.value for status in HOLDING_JOB_STATES]
    return set(
        session.scalars(
            select(Learner.job_id)
            .join(Job, Job.id == Learner.job_id)
            .where(Learner.node == name, Learner.attempt == Job.attempt)
            .where(Job.status.in_(holding))
        )
    )
