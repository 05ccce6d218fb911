"""The audit log: each administrative action with who did it, to what, and when.

Actions are written in the same transaction as the change they record, so the log never
shows a change that did not happen, nor misses one that did.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from ffdl.core.errors import BadRequest, Forbidden
from ffdl.server.auth import Principal, iso
from ffdl.server.platform import Platform
from ffdl.server.store.models import AuditEvent
from ffdl.server.store.transitions import utcnow

MAX_PAGESIZE = 1000
MAX_OFFSET = 1_000_000_000


def record(
    session: Session,
    principal: Principal,
    action: str,
    target: str,
    *,
    tenant_id: str | None,
    detail: str = "",
) -> None:
    """Add an audit event for ``action`` on ``target`` (concerning ``tenant_id``) to ``session``."""
    session.add(
        AuditEvent(
            actor_user_id=principal.user_id,
            actor_tenant_id=principal.tenant_id,
            action=action,
            target=target,
            tenant_id=tenant_id,
            detail=detail,
            created_at=utcnow(),
        )
    )


def event_json(event: AuditEvent) -> dict[str, Any]:
    return {
        "id": event.id,
        "time": iso(event.created_at),
        "actor": event.actor_user_id,
        "actor_tenant": event.actor_tenant_id,
        "action": event.action,
        "target": event.target,
        "tenant": event.tenant_id,
        "detail": event.detail,
    }


def list_events(
    platform: Platform,
    principal: Principal,
    *,
    pagesize: int,
    offset: int,
    action: str | None = None,
) -> dict[str, Any]:
    """Newest first: every event for a platform admin, its tenant's for a tenant admin."""
    if not principal.is_tenant_admin:
        raise Forbidden("only an admin may read the audit log")
    if not 1 <= pagesize <= MAX_PAGESIZE:
        raise BadRequest(
            f"pagesize must be between 1 and {MAX_PAGESIZE}", detail={"field": "pagesize"}
        )
    if not 0 <= offset <= MAX_OFFSET:
        raise BadRequest(f"offset must be between 0 and {MAX_OFFSET}", detail={"field": "offset"})
    query = select(AuditEvent)
    count = select(func.count()).select_from(AuditEvent)
    if not principal.is_platform_admin:
        own = or_(
            AuditEvent.tenant_id == principal.tenant_id,
            AuditEvent.actor_tenant_id == principal.tenant_id,
        )
        query, count = query.where(own), count.where(own)
    if action is not None:
        query, count = (
            query.where(AuditEvent.action == action),
            count.where(AuditEvent.action == action),
        )
    with platform.store.read() as session:
        events = session.scalars(
            query.order_by(AuditEvent.id.desc()).limit(pagesize).offset(offset)
        ).all()
        total = session.scalar(count) or 0
    return {"events": [event_json(event) for event in events], "total": int(total)}
