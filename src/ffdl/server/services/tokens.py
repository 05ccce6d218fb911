"""API tokens as users manage them: list, create, revoke. Never shows a secret or its hash.

A user manages its own tokens; a tenant admin also those of its tenant's users (but not a
platform admin's), a platform admin everyone's. A token outside the caller's reach is a 404,
as if it did not exist. Revoking deletes the token, so the next request with it is refused.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import ColumnElement, and_, or_, select, true

from ffdl.core.errors import BadRequest, NotFound
from ffdl.server.auth import MAX_TOKEN_DAYS, Principal, Role, iso, issue_token, token_lifetime
from ffdl.server.platform import Platform
from ffdl.server.services import audit
from ffdl.server.store.models import ApiToken, User
from ffdl.server.store.transitions import utcnow

MAX_NAME = 200


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(default="", max_length=MAX_NAME)
    # Days until it expires; at most the platform's token_ttl_days (its default).
    ttl_days: float | None = Field(default=None, gt=0, le=MAX_TOKEN_DAYS)


def token_json(row: ApiToken) -> dict[str, Any]:
    expired = row.expires_at is not None and row.expires_at <= utcnow()
    return {
        "id": row.id,
        "user": row.user_id,
        "name": row.name or "",
        "created": iso(row.created_at),
        "expires": iso(row.expires_at),
        "last_used": iso(row.last_used_at),
        "expired": expired,
    }


def _within_reach(principal: Principal) -> ColumnElement[bool]:
    """A condition on ApiToken joined with User: the tokens the caller manages."""
    if principal.is_platform_admin:
        return true()
    own = ApiToken.user_id == principal.user_id
    if principal.is_tenant_admin:
        tenant_users = and_(
            User.tenant_id == principal.tenant_id, User.role != Role.PLATFORM_ADMIN.value
        )
        return or_(own, tenant_users)
    return own


def list_tokens(
    platform: Platform, principal: Principal, user: str | None = None
) -> list[dict[str, Any]]:
    query = select(ApiToken).join(User, User.id == ApiToken.user_id).where(_within_reach(principal))
    if user is not None:
        query = query.where(ApiToken.user_id == user)
    with platform.store.read() as session:
        rows = session.scalars(query.order_by(ApiToken.created_at, ApiToken.id)).all()
    return [{**token_json(row), "current": row.id == principal.token_id} for row in rows]


def create_token(platform: Platform, principal: Principal, body: TokenCreate) -> dict[str, Any]:
    """A new token for the caller; the secret is in the answer and nowhere else."""
    limit = platform.settings.token_ttl_days
    if body.ttl_days is not None and body.ttl_days > limit:
        raise BadRequest(
            f"ttl_days must be at most {limit:g} (the platform's token_ttl_days)",
            detail={"field": "ttl_days"},
        )
    lifetime = token_lifetime(platform.settings, body.ttl_days)
    with platform.store.write() as session:
        token, row = issue_token(session, principal.user_id, name=body.name, lifetime=lifetime)
        audit.record(
            session,
            principal,
            "token.create",
            str(row.id),
            tenant_id=principal.tenant_id,
            detail=f"user={principal.user_id} name={body.name!r} expires={iso(row.expires_at)}",
        )
        result = token_json(row)
    return {**result, "token": token}


def revoke_token(platform: Platform, principal: Principal, token_id: str) -> dict[str, Any]:
    query = (
        select(ApiToken, User.tenant_id)
        .join(User, User.id == ApiToken.user_id)
        .where(ApiToken.id == token_id, _within_reach(principal))
    )
    with platform.store.write() as session:
        found = session.execute(query).first()
        if found is None:
            raise NotFound(f"no token {token_id!r}")
        row, tenant_id = found
        session.delete(row)
        audit.record(
            session,
            principal,
            "token.revoke",
            token_id,
            tenant_id=tenant_id,
            detail=f"user={row.user_id} name={row.name or ''!r}",
        )
    return {"id": token_id, "user": row.user_id, "revoked": True}
