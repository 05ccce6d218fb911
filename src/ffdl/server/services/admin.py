"""Administration: tenants, their quotas, and users; each change goes to the audit log.

Platform admins create tenants and set quotas (a tenant admin raising its own quota would
defeat quotas); tenant admins add members and tenant admins to their own tenant.

Passwords (for HTTP Basic): a platform admin sets or removes anyone's; a tenant admin those of
its tenant's users except platform admins (that would hand it the platform); every user its
own, giving the current password when it has one, so that a stolen token cannot take over
the account's password. Users of other tenants are not found rather than forbidden, as jobs.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from ffdl.core.errors import BadRequest, ConflictError, Forbidden, NotFound
from ffdl.server.auth import Principal, Role, find_user, iso, issue_token, token_lifetime
from ffdl.server.passwords import check_password, hash_password
from ffdl.server.platform import Platform
from ffdl.server.services import audit
from ffdl.server.store.models import Tenant, User
from ffdl.server.store.transitions import utcnow

_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
# Far above any real cluster, far below what the database's integers hold.
MAX_QUOTA = 1_000_000
MAX_TEXT = 200


class TenantCreate(BaseModel):
    # Strict: a JSON true/false is not a quota of 1/0.
    model_config = ConfigDict(extra="forbid", strict=True)
    id: str = Field(max_length=63)
    name: str = Field(default="", max_length=MAX_TEXT)
    max_gpus: int | None = Field(default=None, ge=0, le=MAX_QUOTA)
    max_running_jobs: int | None = Field(default=None, ge=0, le=MAX_QUOTA)


class QuotaUpdate(BaseModel):
    """New limits; a field left out is unchanged, ``-1`` removes that limit."""

    model_config = ConfigDict(extra="forbid", strict=True)
    max_gpus: int | None = Field(default=None, ge=-1, le=MAX_QUOTA)
    max_running_jobs: int | None = Field(default=None, ge=-1, le=MAX_QUOTA)


class UserCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=63)
    role: str = Field(default=Role.MEMBER.value, max_length=32)


class PasswordSet(BaseModel):
    """A new password; ``current_password`` is needed to change one's own existing one."""

    model_config = ConfigDict(extra="forbid", strict=True)
    # Lengths are checked by ``check_password``, whose errors name the rule.
    password: str
    current_password: str | None = None


def require_admin(principal: Principal) -> None:
    """An admin of some tenant; platform-wide operations need ``require_platform_admin``."""
    if not principal.is_tenant_admin:
        raise Forbidden("only an admin may do this")


def require_platform_admin(principal: Principal) -> None:
    if not principal.is_platform_admin:
        raise Forbidden("only a platform admin may do this")


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
    """Every tenant for a platform admin; a tenant admin sees only its own."""
    require_admin(principal)
    query = select(Tenant).order_by(Tenant.id)
    if not principal.is_platform_admin:
        query = query.where(Tenant.id == principal.tenant_id)
    with platform.store.read() as session:
        return [tenant_json(t) for t in session.scalars(query)]


def create_tenant(platform: Platform, principal: Principal, body: TenantCreate) -> dict[str, Any]:
    require_platform_admin(principal)
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
        audit.record(
            session,
            principal,
            "tenant.create",
            body.id,
            tenant_id=body.id,
            detail=f"max_gpus={body.max_gpus} max_running_jobs={body.max_running_jobs}",
        )
    return tenant_json(tenant)


def update_quota(
    platform: Platform, principal: Principal, tenant_id: str, body: QuotaUpdate
) -> dict[str, Any]:
    require_platform_admin(principal)
    with platform.store.write() as session:
        tenant = session.get(Tenant, tenant_id)
        if tenant is None:
            raise NotFound(f"no tenant {tenant_id!r}")
        before = f"max_gpus={tenant.max_gpus} max_running_jobs={tenant.max_running_jobs}"
        if body.max_gpus is not None:
            tenant.max_gpus = None if body.max_gpus < 0 else body.max_gpus
        if body.max_running_jobs is not None:
            tenant.max_running_jobs = None if body.max_running_jobs < 0 else body.max_running_jobs
        after = f"max_gpus={tenant.max_gpus} max_running_jobs={tenant.max_running_jobs}"
        audit.record(
            session,
            principal,
            "tenant.quota",
            tenant_id,
            tenant_id=tenant_id,
            detail=f"{before} -> {after}",
        )
        result = tenant_json(tenant)
    platform.wakeups.notify("scheduler")
    return result


def _check_role(principal: Principal, tenant_id: str, role: str) -> None:
    roles = [r.value for r in Role]
    if role not in roles:
        raise BadRequest(
            f"role must be one of {', '.join(roles)}, got {role!r}", detail={"field": "role"}
        )
    if not principal.administers(tenant_id):
        raise Forbidden(f"only a platform admin or an admin of {tenant_id!r} may add its users")
    if role == Role.PLATFORM_ADMIN and not principal.is_platform_admin:
        raise Forbidden("only a platform admin may create platform admins")


def create_user(
    platform: Platform, principal: Principal, tenant_id: str, body: UserCreate
) -> dict[str, Any]:
    """Create a user and return its first token (shown only this once)."""
    require_admin(principal)
    _check_role(principal, tenant_id, body.role)
    _check_name("name", body.name)
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
        session.flush()
        token, row = issue_token(
            session, user_id, name="first token", lifetime=token_lifetime(platform.settings)
        )
        audit.record(
            session,
            principal,
            "user.create",
            user_id,
            tenant_id=tenant_id,
            detail=f"role={body.role} token={row.id}",
        )
    return {
        "user": user_id,
        "tenant": tenant_id,
        "role": body.role,
        "token": token,
        "token_id": row.id,
    }


def _password_target(session: Session, principal: Principal, user_ref: str) -> User:
    """The user whose password ``principal`` may set or remove, or the error why not."""
    user = find_user(session, user_ref)
    if user is None or not principal.sees(user.tenant_id):
        raise NotFound(f"no user {user_ref!r}")
    if user.id == principal.user_id or principal.is_platform_admin:
        return user
    if not principal.administers(user.tenant_id):
        raise Forbidden("only an admin may set another user's password")
    if user.role == Role.PLATFORM_ADMIN:
        raise Forbidden("only a platform admin may set a platform admin's password")
    return user


def _check_current(
    platform: Platform, user_id: str, password_hash: str | None, current: str | None, client: str
) -> None:
    """Changing one's own password: the current one must be given, and right."""
    if password_hash is None:
        return
    if not current:
        raise BadRequest(
            "current_password is required to change your own password",
            detail={"field": "current_password"},
        )
    sign_ins = platform.sign_ins
    wait = sign_ins.blocked_for(user_id, client)
    if wait > 0:
        raise Forbidden(
            f"too many wrong current passwords: try again in {wait:.0f} s",
            detail={"field": "current_password", "retry_after": round(wait, 1)},
        )
    if not sign_ins.verify(password_hash, current).ok:
        sign_ins.failed(user_id, client)
        raise Forbidden("current_password is wrong", detail={"field": "current_password"})
    sign_ins.succeeded(user_id, client)


def user_json(user: User) -> dict[str, Any]:
    return {
        "user": user.id,
        "tenant": user.tenant_id,
        "name": user.name,
        "role": user.role,
        "has_password": user.password_hash is not None,
        "created": iso(user.created_at),
    }


def list_users(
    platform: Platform, principal: Principal, tenant_id: str | None = None
) -> list[dict[str, Any]]:
    """Users (never their password hashes): every tenant's for a platform admin, its own
    tenant's for a tenant admin; ``tenant_id`` narrows the list."""
    require_admin(principal)
    query = select(User).order_by(User.tenant_id, User.id)
    if not principal.is_platform_admin:
        query = query.where(User.tenant_id == principal.tenant_id)
    if tenant_id is not None:
        query = query.where(User.tenant_id == tenant_id)
    with platform.store.read() as session:
        return [user_json(user) for user in session.scalars(query)]


def set_password(
    platform: Platform, principal: Principal, user_ref: str, body: PasswordSet, client: str = ""
) -> dict[str, Any]:
    """Set ``user_ref``'s HTTP Basic password (argon2id); sign-ins with the old one end."""
    check_password(body.password, platform.settings.password_min_length)
    with platform.store.read() as session:
        user = _password_target(session, principal, user_ref)
        user_id, old_hash = user.id, user.password_hash
    # Verifying and hashing are slow on purpose: outside any transaction.
    if user_id == principal.user_id:
        _check_current(platform, user_id, old_hash, body.current_password, client)
    new_hash = hash_password(body.password)
    with platform.store.write() as session:
        user = _password_target(session, principal, user_id)
        verb = "set" if user.password_hash is None else "changed"
        how = f"{verb} by {'the user' if user.id == principal.user_id else 'an admin'}"
        user.password_hash = new_hash
        audit.record(
            session, principal, "user.password", user.id, tenant_id=user.tenant_id, detail=how
        )
        result = user_json(user)
    platform.sign_ins.forget_user(user_id)
    return result


def remove_password(platform: Platform, principal: Principal, user_ref: str) -> dict[str, Any]:
    """Remove ``user_ref``'s password: HTTP Basic is refused for it from now on."""
    with platform.store.write() as session:
        user = _password_target(session, principal, user_ref)
        user.password_hash = None
        audit.record(
            session,
            principal,
            "user.password",
            user.id,
            tenant_id=user.tenant_id,
            detail="removed",
        )
        result = user_json(user)
    platform.sign_ins.forget_user(result["user"])
    return result
