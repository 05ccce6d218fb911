"""``/v1/tenants``: tenants, quotas and users, for admins."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

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
