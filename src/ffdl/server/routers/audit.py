"""``/v1/audit``: the audit log of administrative actions, for admins."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from ffdl.server.routers.deps import PlatformDep, PrincipalDep
from ffdl.server.routers.responses import AUTHENTICATED, errors
from ffdl.server.services import audit

router = APIRouter(prefix="/v1/audit", tags=["admin"], responses={**AUTHENTICATED, **errors(403)})


@router.get("", responses=errors(400))
def get_audit(
    platform: PlatformDep,
    principal: PrincipalDep,
    pagesize: Annotated[int, Query(ge=1, le=audit.MAX_PAGESIZE)] = 100,
    offset: Annotated[int, Query(ge=0, le=audit.MAX_OFFSET)] = 0,
    action: Annotated[str | None, Query(max_length=64)] = None,
) -> dict[str, Any]:
    return audit.list_events(platform, principal, pagesize=pagesize, offset=offset, action=action)
