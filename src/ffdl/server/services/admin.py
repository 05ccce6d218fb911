"""Administration: tenants, their quotas, users and tokens. Admins only."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select

from ffdl.core.errors import BadRequest, ConflictError, Forbidden, NotFound
from ffdl.server.auth import Principal, create_token
from ffdl.server.platform import Platform
from ffdl.server.store.models import Tenant, User
from ffdl.server.store.transitions import utcnow

_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


class TenantCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    name: str = ""
    max_gpus: int | None = Field(default=None, ge=0)
    max_running_jobs: int | None = Field(default=None, ge=0)


class QuotaUpdate(BaseModel):
    """New limits; a field left out is unchanged, ``-1`` removes that limit."""

    model_config = ConfigDict(extra="forbid")
    max_gpus: int | None = Field(default=None, ge=-1)
    max_running_jobs: int | None = Field(default=None, ge=-1)


class UserCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    role: str = "member"


def require_admin(principal: Principal) -> None:
    if not principal.is_admin:
        raise Forbidden("only an admin may do this")


def tenant_json(tenant: Tenant) -> dict[str, Any]:
    return {
        "id": tenant.id,
        "name": tenant.name,
        "max_gpus": tenant.max_gpus,
        "max_running_jobs": tenant.max_running_jobs,
    }


def _check_name(kind: str, value: str) -> None:
    if not _NAME.match(value):
        raise BadRequest(
            f"{kind} must be 1-63 lowercase letters, digits or '-', got {value!r}",
            detail={"field": kind},
        )


def list_tenants(platform: Platform, principal: Principal) -> list[dict[str, Any]]:
    require_admin(principal)
    with platform.store.read() as session:
        return [tenant_json(t) for t in session.scalars(select(Tenant).order_by(Tenant.id))]


def create_tenant(platform: Platform, principal: Principal, body: TenantCreate) -> dict[str, Any]:
    require_admin(principal)
    _check_name("id", body.id)
    with platform.store.write() as session:
        if session.get(Tenant, body.id) is not None:
            raise ConflictError(f"tenant {body.id!r} already exists")
        tenant = Tenant(
            id=body.id,
            name=body.name or body.id,
            max_gpus=body.max_gpus,
            max_running_jobs=body.max_running_jobs,
            created_at=utcnow(),
        )
        session.add(tenant)
    return tenant_json(tenant)


def update_quota(
    platform: Platform, principal: Principal, tenant_id: str, body: QuotaUpdate
) -> dict[str, Any]:
    require_admin(principal)
    with platform.store.write() as session:
        tenant = session.get(Tenant, tenant_id)
        if tenant is None:
            raise NotFound(f"no tenant {tenant_id!r}")
        if body.max_gpus is not None:
            tenant.max_gpus = None if body.max_gpus < 0 else body.max_gpus
        if body.max_running_jobs is not None:
            tenant.max_running_jobs = None if body.max_running_jobs < 0 else body.max_running_jobs
        result = tenant_json(tenant)
    platform.wakeups.notify("scheduler")
    return result


def create_user(
    platform: Platform, principal: Principal, tenant_id: str, body: UserCreate
) -> dict[str, Any]:
    """Create a user and return its first token (shown only this once)."""
    require_admin(principal)
    _check_name("name", body.name)
    if body.role not in ("admin", "member"):
        raise BadRequest(
            f"role must be 'admin' or 'member', got {body.role!r}", detail={"field": "role"}
        )
    user_id = f"{tenant_id}.{body.name}"
    with platform.store.write() as session:
        if session.get(Tenant, tenant_id) is None:
            raise NotFound(f"no tenant {tenant_id!r}")
        if session.get(User, user_id) is not None:
            raise ConflictError(f"user {body.name!r} already exists in {tenant_id!r}")
        session.add(
            User(
                id=user_id, tenant_id=tenant_id, name=body.name, role=body.role, created_at=utcnow()
            )
        )
    token = create_token(platform.store, user_id)
    return {"user": user_id, "tenant": tenant_id, "role": body.role, "token": token}
