"""``/v1/internal``: what learner controllers call, authenticated by their job token."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ffdl.server.routers.deps import PlatformDep
from ffdl.server.routers.responses import errors
from ffdl.server.services.reports import ReportBatch, ingest_reports

router = APIRouter(prefix="/v1/internal", tags=["internal"])

# Documents the job token a controller sends; ``ingest_reports`` checks it.
job_token = HTTPBearer(
    auto_error=False,
    scheme_name="JobToken",
    description="The job token the platform gives a learner's controller (never user code).",
)


@router.post(
    "/jobs/{job_id}/learners/{learner}/reports",
    responses=errors(400, 401, 404, 409, 410),
)
def post_reports(
    request: Request,
    platform: PlatformDep,
    job_id: str,
    learner: int,
    batch: ReportBatch,
    _token: Annotated[HTTPAuthorizationCredentials | None, Depends(job_token)],
) -> dict[str, Any]:
    authorization = request.headers.get("authorization")
    token = None
    if authorization and authorization.lower().startswith("bearer "):
        token = authorization.split(" ", 1)[1].strip()
    return ingest_reports(platform, job_id, learner, token, batch).to_json()
