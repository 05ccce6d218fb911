"""``/v1/internal``: what learner controllers call, authenticated by their job token."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header

from ffdl.server.routers.deps import PlatformDep
from ffdl.server.services.reports import ReportBatch, ingest_reports

router = APIRouter(prefix="/v1/internal", tags=["internal"])


@router.post("/jobs/{job_id}/learners/{learner}/reports")
def post_reports(
    platform: PlatformDep,
    job_id: str,
    learner: int,
    batch: ReportBatch,
    authorization: Annotated[str | None, Header()] = None,
) -> dict[str, Any]:
    token = None
    if authorization and authorization.lower().startswith("bearer "):
        token = authorization.split(" ", 1)[1].strip()
    return ingest_reports(platform, job_id, learner, token, batch).to_json()
