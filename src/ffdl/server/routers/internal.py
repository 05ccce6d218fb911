"""``/v1/internal``: what learner controllers call, authenticated by their job token."""

from __future__ import annotations

import contextlib
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from ffdl.server.routers.deps import PlatformDep
from ffdl.server.routers.responses import content, errors
from ffdl.server.services.learner_files import (
    check_learner_access,
    code_archive,
    receive_upload,
    store_results,
)
from ffdl.server.services.reports import ReportBatch, ingest_reports

router = APIRouter(prefix="/v1/internal", tags=["internal"])

ZIP_TYPE = "application/zip"

# Documents the job token a controller sends; each route checks it.
job_token = HTTPBearer(
    auto_error=False,
    scheme_name="JobToken",
    description="The job token the platform gives a learner's controller (never user code).",
)
JobToken = Annotated[HTTPAuthorizationCredentials | None, Depends(job_token)]


def _bearer(request: Request) -> str | None:
    authorization = request.headers.get("authorization")
    if authorization and authorization.lower().startswith("bearer "):
        return authorization.split(" ", 1)[1].strip()
    return None


@router.post(
    "/jobs/{job_id}/learners/{learner}/reports",
    # 503: the database is away, or the sender left before its batch's turn.
    responses=errors(400, 401, 404, 409, 410, 503),
)
async def post_reports(
    request: Request,
    platform: PlatformDep,
    job_id: str,
    learner: int,
    batch: ReportBatch,
    _token: JobToken,
) -> dict[str, Any]:
    token = _bearer(request)

    async def store() -> dict[str, Any]:
        ack = await run_in_threadpool(ingest_reports, platform, job_id, learner, token, batch)
        answer = ack.to_json()
        answer["pace_s"] = platform.report_pace.observe(f"{job_id}/{learner}/{batch.attempt}")
        return answer

    return await platform.report_lanes.run(batch.items, store, request.is_disconnected)


@router.get(
    "/jobs/{job_id}/code",
    response_class=FileResponse,
    responses={
        **content(ZIP_TYPE, binary=True, description="The job's code archive, as submitted"),
        **errors(401, 404, 410),
    },
)
def get_code(request: Request, platform: PlatformDep, job_id: str, _token: JobToken) -> Any:
    """The code archive for a learner that runs where the platform's disk is out of reach."""
    path = code_archive(platform, job_id, _bearer(request))
    return FileResponse(path, media_type=ZIP_TYPE, filename=f"{job_id}-model.zip")


@router.put(
    "/jobs/{job_id}/learners/{learner}/results",
    responses=errors(400, 401, 404, 409, 410, 413),
    openapi_extra={
        "requestBody": {
            "required": True,
            "description": (
                "A zip: learner 1's results at the top and its LOG_DIR under "
                "logs/learner-1/; learner N's LOG_DIR under logs/learner-N/ only"
            ),
            "content": {ZIP_TYPE: {"schema": {"type": "string", "format": "binary"}}},
        }
    },
)
async def put_results(
    request: Request, platform: PlatformDep, job_id: str, learner: int, _token: JobToken
) -> dict[str, int]:
    """Store a learner's results and logs where the job's results are kept."""
    token = _bearer(request)
    # Refused before a byte of the body is read: wrong token, unknown job, ended job.
    await run_in_threadpool(check_learner_access, platform, job_id, token, learner)
    upload = await receive_upload(platform, request.stream(), request.headers.get("content-length"))
    try:
        stored = await run_in_threadpool(store_results, platform, job_id, learner, upload)
    finally:
        with contextlib.suppress(FileNotFoundError):
            upload.unlink()
    return stored.to_json()
