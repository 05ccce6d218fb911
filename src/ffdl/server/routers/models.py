"""``/v1/models``: FfDL's training job resource.

On FfDL's paths the answers have FfDL's shapes (``services/queries.py``); FfDL's clients'
``?version=`` is accepted everywhere. Downloads answer ``application/octet-stream``, the only
type FfDL's client writes to a file. DELETE removes the job as FfDL did, cancelling it first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, File, Header, Query, Response, UploadFile
from fastapi.responses import FileResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from ffdl.core.archive import zip_directory
from ffdl.core.errors import BadRequest, NotFound, PayloadTooLarge
from ffdl.core.jobdirs import JobDirs
from ffdl.core.limits import MAX_COUNT, MAX_INT64, bounded_int
from ffdl.server.routers.deps import PlatformDep, PrincipalDep
from ffdl.server.routers.ffdl_params import FFDL_QUERY
from ffdl.server.routers.responses import AUTHENTICATED, download, errors, header
from ffdl.server.services import control
from ffdl.server.services.gpu_samples import gpu_series
from ffdl.server.services.queries import (
    list_jobs,
    load_job,
    model_detail,
    model_summary,
    page_cursor,
)
from ffdl.server.services.submit import submit_job

router = APIRouter(
    prefix="/v1/models",
    tags=["models"],
    responses={**AUTHENTICATED, **errors(400)},
    dependencies=FFDL_QUERY,
)
DOWNLOAD_TYPE = "application/octet-stream"


class ModelPatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    status: str | None = Field(default=None, max_length=32)
    # Any: a float or a string gets our own message naming the field, not pydantic's.
    priority: Any = None
    gpus: Any = None
    # With gpus or alone: the GPU type an elastic job runs on ("any" lifts the pin).
    gpu_type: str | None = Field(default=None, min_length=1, max_length=100)


def _read_limited(upload: UploadFile, limit: int, field: str) -> bytes:
    data = upload.file.read(limit + 1)
    if len(data) > limit:
        raise PayloadTooLarge(f"{field} exceeds {limit} bytes", detail={"field": field})
    return data


@router.post(
    "",
    status_code=201,
    responses={
        201: {
            "description": "Queued; `Location` names the new model",
            "headers": {"Location": header("the new model's URL")},
        },
        200: {
            "description": "A retry: the model this Idempotency-Key already made",
            "headers": {"Location": header("the model's URL")},
        },
        **errors(400, 409, 413, 507),
    },
)
def create_model(
    platform: PlatformDep,
    principal: PrincipalDep,
    manifest: Annotated[UploadFile, File(description="FfDL manifest (YAML)")],
    model_definition: Annotated[UploadFile, File(description="zip of the training code")],
    idempotency_key: Annotated[
        str | None,
        Header(
            description=(
                "Up to 200 printable ASCII characters, fresh for each new job. A submit "
                "with a key this user has already sent creates nothing: with the same "
                "manifest and model_definition it answers 200 with the job that key made "
                "(same model_id and Location); with others, 409."
            )
        ),
    ] = None,
) -> JSONResponse:
    settings = platform.settings
    manifest_bytes = _read_limited(manifest, settings.max_manifest_bytes, "manifest")
    archive = _read_limited(model_definition, settings.max_archive_bytes, "model_definition")
    submitted = submit_job(platform, principal, manifest_bytes, archive, idempotency_key)
    location = f"/v1/models/{submitted.job_id}"
    # 201 only for the request that created the job; its retries get 200 and the same body.
    return JSONResponse(
        status_code=200 if submitted.replayed else 201,
        headers={"Location": location},
        content={
            "model_id": submitted.job_id,
            "location": location,
            "status": submitted.status,
            "warnings": submitted.warnings,
        },
    )


@router.get("", responses=errors(400))
def get_models(
    platform: PlatformDep,
    principal: PrincipalDep,
    status: str | None = None,
    limit: Annotated[int, Query()] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_INT64)] = 0,
    after: Annotated[
        str | None,
        Query(description="the `next` of the page before: the page after it, at any depth"),
    ] = None,
) -> dict[str, Any]:
    """The caller's models, newest first. `next` (absent on the last page) pages on."""
    with platform.store.read() as session:
        jobs, total = list_jobs(
            session, principal, status=status, limit=limit, offset=offset, after=after
        )
        body: dict[str, Any] = {"models": [model_summary(job) for job in jobs], "total": total}
        if len(jobs) == limit:
            body["next"] = page_cursor(jobs[-1])
        return body


@router.get("/{model_id}", responses=errors(404))
def get_model(platform: PlatformDep, principal: PrincipalDep, model_id: str) -> dict[str, Any]:
    with platform.store.read() as session:
        return model_detail(session, load_job(session, principal, model_id))


@router.get("/{model_id}/gpu", responses=errors(400, 404))
def get_model_gpu(
    platform: PlatformDep,
    principal: PrincipalDep,
    model_id: str,
    since: Annotated[
        float | None, Query(description="only samples after this time (epoch seconds)")
    ] = None,
) -> dict[str, Any]:
    """The job's GPU samples over time (each learner's mean utilisation, memory and power,
    and per GPU), oldest first, and its average utilisation so far."""
    with platform.store.read() as session:
        return gpu_series(session, load_job(session, principal, model_id), since)


@router.patch("/{model_id}", status_code=202, responses=errors(400, 404, 409))
def patch_model(
    platform: PlatformDep, principal: PrincipalDep, model_id: str, body: ModelPatch
) -> dict[str, Any]:
    fields = body.model_dump(exclude_none=True)
    scaling = set(fields) <= {"gpus", "gpu_type"}
    if not fields or (len(fields) != 1 and not scaling):
        raise BadRequest(
            'send exactly one of {"status": "halt"|"resume"|"cancel"}, {"priority": N}, '
            '{"gpus": N, "gpu_type": T} (either or both)'
        )
    if body.status is not None:
        action = body.status.lower()
        if action == "halt":
            control.halt_job(platform, principal, model_id)
        elif action == "resume":
            control.resume_job(platform, principal, model_id)
        elif action == "cancel":
            control.cancel_job(platform, principal, model_id)
        else:
            raise BadRequest(
                f"status must be 'halt', 'resume' or 'cancel', got {body.status!r}",
                detail={"field": "status"},
            )
    elif body.priority is not None:
        priority = bounded_int(body.priority, "priority", 0, 100, code="C104")
        control.set_priority(platform, principal, model_id, priority)
    else:
        gpus = (
            None if body.gpus is None else bounded_int(body.gpus, "gpus", 1, MAX_COUNT, code="C104")
        )
        control.scale_job(platform, principal, model_id, gpus, body.gpu_type)
    with platform.store.read() as session:
        return model_detail(session, load_job(session, principal, model_id))


@router.delete("/{model_id}", responses=errors(404, 409))
def delete_model(platform: PlatformDep, principal: PrincipalDep, model_id: str) -> dict[str, Any]:
    """Cancel the job if it is live, then remove it: `deleted` says whether it is gone."""
    return control.delete_job(platform, principal, model_id)


@router.get(
    "/{model_id}/definition",
    response_class=FileResponse,
    responses={
        **download(DOWNLOAD_TYPE, "The model definition as submitted (a zip)"),
        **errors(404),
    },
)
def get_definition(platform: PlatformDep, principal: PrincipalDep, model_id: str) -> FileResponse:
    with platform.store.read() as session:
        load_job(session, principal, model_id)
    path = JobDirs.of(platform.settings.jobs_dir, model_id).archive
    if not path.exists():
        raise NotFound(f"model definition of {model_id} is no longer stored")
    return FileResponse(path, media_type=DOWNLOAD_TYPE, filename=f"{model_id}-definition.zip")


@router.get(
    "/{model_id}/trained_model",
    response_class=Response,
    responses={**download(DOWNLOAD_TYPE, "The job's results directory (a zip)"), **errors(404)},
)
def get_trained_model(platform: PlatformDep, principal: PrincipalDep, model_id: str) -> Response:
    with platform.store.read() as session:
        job = load_job(session, principal, model_id)
        location = job.results_location
    # Results stored into a host path are read there; those uploaded to an object store (an
    # s3:// location, whose credentials are erased once the job ends) are read from the job's
    # own results directory, where they were written before the upload.
    own = JobDirs.of(platform.settings.jobs_dir, model_id).results
    stored = Path(location) if location and "://" not in location else None
    found = next((path for path in (stored, own) if path is not None and path.is_dir()), None)
    if found is None:
        raise NotFound(f"{model_id} has no trained model yet")
    return Response(
        zip_directory(found),
        media_type=DOWNLOAD_TYPE,
        headers={"Content-Disposition": f'attachment; filename="{model_id}-trained-model.zip"'},
    )
