"""``/v1/logs/{id}``: FfDL's log lines and evaluation metrics, as ``{"models": [...]}`` pages."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from ffdl.server.routers.deps import PlatformDep, PrincipalDep
from ffdl.server.routers.ffdl_params import FFDL_QUERY, SearchType
from ffdl.server.routers.responses import AUTHENTICATED, errors
from ffdl.server.services import logs
from ffdl.server.services.queries import load_job

router = APIRouter(
    prefix="/v1/logs",
    tags=["logs"],
    responses={**AUTHENTICATED, **errors(400, 404)},
    dependencies=FFDL_QUERY,
)

SinceTime = Annotated[
    str | None,
    Query(
        description=(
            "Records from this time on: epoch milliseconds or ISO 8601. A negative whole "
            "number -N starts the page N records before the end."
        )
    ),
]
PageSize = Annotated[
    int | None, Query(description=f"Records per page (default {logs.DEFAULT_PAGE}).")
]
Pos = Annotated[
    int | None,
    Query(
        description=(
            "Records to skip from the start; negative: the page ends at the -pos-th record "
            "from the end (-1: the last page)."
        )
    ),
]


@router.get("/{model_id}/loglines")
def get_loglines(
    platform: PlatformDep,
    principal: PrincipalDep,
    model_id: str,
    since_time: SinceTime = None,
    pagesize: PageSize = None,
    pos: Pos = None,
    search_type: SearchType = None,
) -> dict[str, Any]:
    with platform.store.read() as session:
        job = load_job(session, principal, model_id)
    lines = logs.loglines(
        platform.store, platform.archive, job, since_time=since_time, pagesize=pagesize, pos=pos
    )
    return {"models": lines}


@router.get("/{model_id}/emetrics")
def get_emetrics(
    platform: PlatformDep,
    principal: PrincipalDep,
    model_id: str,
    since_time: SinceTime = None,
    pagesize: PageSize = None,
    pos: Pos = None,
    search_type: SearchType = None,
) -> dict[str, Any]:
    with platform.store.read() as session:
        job = load_job(session, principal, model_id)
    records = logs.emetrics(
        platform.store, platform.archive, job, since_time=since_time, pagesize=pagesize, pos=pos
    )
    return {"models": records}
