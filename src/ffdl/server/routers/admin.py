"""``/v1/tenants``: tenants, quotas and new users; ``/v1/users``: users and their passwords."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from ffdl.server.routers.deps import PlatformDep, PrincipalDep
from ffdl.server.routers.responses import AUTHENTICATED, errors
from ffdl.server.services import admin

router = APIRouter(prefix="/v1/tenants", tags=["admin"], responses={**AUTHENTICATED, **errors(403)})


@router.get("")
def get_tenants(platform: PlatformDep, principal: PrincipalDep) -> dict[str, Any]:
    return {"tenants": admin.list_tenants(platform, principal)}


@router.post("", status_code=201, responses=errors(400, 409))
def post_tenant(
    platform: PlatformDep, principal: PrincipalDep, body: admin.TenantCreate
) -> dict[str, Any]:
    return admin.create_tenant(platform, principal, body)


@router.patch("/{tenant_id}", responses=errors(400, 404))
def patch_tenant(
    platform: PlatformDep, principal: PrincipalDep, tenant_id: str, body: admin.QuotaUpdate
) -> dict[str, Any]:
    return admin.update_quota(platform, principal, tenant_id, body)


@router.post("/{tenant_id}/users", status_code=201, responses=errors(400, 404, 409))
def post_user(
    platform: PlatformDep, principal: PrincipalDep, tenant_id: str, body: admin.UserCreate
) -> dict[str, Any]:
    return admin.create_user(platform, principal, tenant_id, body)


users_router = APIRouter(
    prefix="/v1/users", tags=["admin"], responses={**AUTHENTICATED, **errors(403, 404)}
)


@users_router.get("", responses=errors(400))
def get_users(
    platform: PlatformDep, principal: PrincipalDep, tenant: str | None = None
) -> dict[str, Any]:
    """Users, with their role and whether they have a password (admins: their tenant's)."""
    return {"users": admin.list_users(platform, principal, tenant)}


@users_router.put("/{user_id}/password", responses=errors(400))
def put_password(
    request: Request,
    platform: PlatformDep,
    principal: PrincipalDep,
    user_id: str,
    body: admin.PasswordSet,
) -> dict[str, Any]:
    """Set a user's password for HTTP Basic (admins), or change your own (with the current)."""
    client = request.client.host if request.client is not None else ""
    return admin.set_password(platform, principal, user_id, body, client)


@users_router.delete("/{user_id}/password")
def delete_password(platform: PlatformDep, principal: PrincipalDep, user_id: str) -> dict[str, Any]:
    """Remove a user's password: HTTP Basic is refused for that user from then on."""
    return admin.remove_password(platform, principal, user_id)
