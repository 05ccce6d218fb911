"""``/v1/logs/{id}``: FfDL's log lines and evaluation metrics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from ffdl.server.routers.deps import PlatformDep, PrincipalDep
from ffdl.server.routers.responses import AUTHENTICATED, errors
from ffdl.server.services import logs
from ffdl.server.services.queries import load_job

router = APIRouter(
    prefix="/v1/logs", tags=["logs"], responses={**AUTHENTICATED, **errors(400, 404)}
)


@router.get("/{model_id}/loglines")
def get_loglines(
    platform: PlatformDep,
    principal: PrincipalDep,
    model_id: str,
    since_time: str | None = None,
    pagesize: int | None = None,
    pos: int | None = None,
) -> dict[str, Any]:
    with platform.store.read() as session:
        load_job(session, principal, model_id)
        lines = logs.loglines(session, model_id, since_time=since_time, pagesize=pagesize, pos=pos)
    return {"lines": lines}


@router.get("/{model_id}/emetrics")
def get_emetrics(
    platform: PlatformDep,
    principal: PrincipalDep,
    model_id: str,
    since_time: str | None = None,
    pagesize: int | None = None,
    pos: int | None = None,
) -> dict[str, Any]:
    with platform.store.read() as session:
        load_job(session, principal, model_id)
        records = logs.emetrics(
            session, model_id, since_time=since_time, pagesize=pagesize, pos=pos
        )
    return {"records": records}
