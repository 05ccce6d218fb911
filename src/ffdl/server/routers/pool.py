"""``/v1/cluster/pool``: the elastic API pool (``ffdl up --workers MIN..MAX``) as it stands."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from ffdl.server.pool.view import pool_view
from ffdl.server.routers.deps import PlatformDep, PrincipalDep
from ffdl.server.routers.responses import AUTHENTICATED, errors
from ffdl.server.services.admin import require_platform_admin

router = APIRouter(prefix="/v1/cluster", tags=["cluster"], responses=AUTHENTICATED)


@router.get("/pool", responses=errors(403))
def get_pool(platform: PlatformDep, principal: PrincipalDep) -> dict[str, Any]:
    """The API pool (platform admins only): its size and bounds, each worker's state, the
    load signals the controller sees, its policy, and its recent changes with their
    reasons. Without a pool: ``enabled`` false, one process."""
    require_platform_admin(principal)
    return pool_view(platform.settings)
