"""What a user asks of an existing job: halt, resume, re-prioritise, cancel, delete.

Each request records the desired state (and the status change it implies at once) and
wakes the loops that carry it out; none of them touches a learner process directly. A
platform admin acting on another tenant's job is an administrative action: it is audited.
"""

from __future__ import annotations

import shutil
import time
from typing import Any

from sqlalchemy import delete as sql_delete
from sqlalchemy.orm import Session

from ffdl.core.errors import BadRequest, ConflictError
from ffdl.core.jobdirs import JobDirs
from ffdl.core.manifest import Manifest
from ffdl.core.resources import CPU_SLOTS
from ffdl.core.status import (
    HALTABLE_JOB_STATES,
    HOLDING_JOB_STATES,
    RESUMABLE_JOB_STATES,
    JobStatus,
    Via,
    is_terminal,
)
from ffdl.server.auth import Principal
from ffdl.server.platform import Platform
from ffdl.server.services import audit
from ffdl.server.services.nodes import effective_nodes
from ffdl.server.services.queries import load_job
from ffdl.server.services.restarts import reset_for_resume
from ffdl.server.store.models import Job
from ffdl.server.store.transitions import set_job_status

_CANCEL_WAIT_S = 15.0


def _load_for_change(
    session: Session, principal: Principal, job_id: str, action: str, detail: str = ""
) -> Job:
    """The job to change; auditing the change when the job is another tenant's."""
    job = load_job(session, principal, job_id)
    if job.tenant_id != principal.tenant_id:
        audit.record(session, principal, action, job_id, tenant_id=job.tenant_id, detail=detail)
    return job


def halt_job(platform: Platform, principal: Principal, job_id: str) -> None:
    with platform.store.write() as session:
        job = _load_for_change(session, principal, job_id, "job.halt")
        status = JobStatus(job.status)
        if status == JobStatus.QUEUED:
            set_job_status(session, job, JobStatus.HALTED, "halted by user while queued")
        elif status in HALTABLE_JOB_STATES:
            job.desired = "halt"
            set_job_status(session, job, JobStatus.HALTING, "halt requested by user")
        elif status in (JobStatus.HALTING, JobStatus.HALTED):
            return
        else:
            raise ConflictError(
                f"cannot halt {job_id}: it is {status.value}",
                detail={"status": status.value},
            )
    platform.wakeups.notify("lcm", "scheduler")


def resume_job(platform: Platform, principal: Principal, job_id: str) -> None:
    """Put a HALTED or FAILED job back in the queue; its next attempt starts from the job's
    last checkpoint. Resuming a FAILED job starts a new run with its whole restart budget;
    a halted job keeps the restarts it has taken."""
    with platform.store.write() as session:
        job = _load_for_change(session, principal, job_id, "job.resume")
        status = JobStatus(job.status)
        if status not in RESUMABLE_JOB_STATES:
            raise ConflictError(
                f"cannot resume {job_id}: it is {status.value}; only HALTED jobs resume, "
                "and FAILED ones from their last checkpoint",
                detail={"status": status.value},
            )
        job.desired = None
        job.placement = None
        job.not_before = None  # a user's resume does not wait out a restart's back-off
        if status == JobStatus.FAILED:
            reset_for_resume(job)
            set_job_status(
                session,
                job,
                JobStatus.QUEUED,
                "resumed by user after it failed; continues from its last checkpoint",
                via=Via.RESUME,
            )
        else:
            set_job_status(session, job, JobStatus.QUEUED, "resumed by user")
    platform.wakeups.notify("scheduler")


def _int_in_range(value: Any, field: str, low: int, high: int | None = None) -> int:
    """``value`` as an int within [low, high], or a 400 naming ``field``."""
    in_range = isinstance(value, int) and value >= low and (high is None or value <= high)
    if isinstance(value, bool) or not in_range:
        bounds = f"from {low} to {high}" if high is not None else f">= {low}"
        raise BadRequest(
            f"{field} must be an integer {bounds}, got {value!r}",
            code="C104",
            detail={"field": field},
        )
    return int(value)


def set_priority(platform: Platform, principal: Principal, job_id: str, priority: Any) -> None:
    priority = _int_in_range(priority, "priority", 0, 100)
    with platform.store.write() as session:
        job = _load_for_change(session, principal, job_id, "job.priority", f"{priority}")
        if is_terminal(JobStatus(job.status)):
            raise ConflictError(f"cannot change the priority of {job_id}: it is {job.status}")
        job.priority = priority
    platform.wakeups.notify("scheduler")


# ``ffdl scale --gpu-type any`` lifts a GPU type pin.
ANY_GPU_TYPE = "any"


def scale_job(
    platform: Platform,
    principal: Principal,
    job_id: str,
    gpus: Any = None,
    gpu_type: str | None = None,
) -> None:
    """Pin an elastic job to ``gpus`` GPUs in total and/or to GPUs of ``gpu_type`` (``any``
    lifts the type pin); the autoscaler carries it out."""
    if gpus is not None:
        gpus = _int_in_range(gpus, "gpus", 1)
    present = _gpu_types_present(platform) if gpu_type is not None else {}
    with platform.store.write() as session:
        change = ", ".join(
            part
            for part in (f"gpus={gpus}" if gpus else "", f"gpu_type={gpu_type}" if gpu_type else "")
            if part
        )
        job = _load_for_change(session, principal, job_id, "job.scale", change)
        if is_terminal(JobStatus(job.status)):
            raise ConflictError(f"cannot scale {job_id}: it is {job.status}")
        elastic = (job.manifest.get("elastic") or {}).get("gpus") if job.elastic else None
        if not elastic:
            raise BadRequest(
                f"{job_id} is not elastic: give its manifest elastic.gpus {{min, max}}",
                code="C104",
                detail={"field": "gpus" if gpus is not None else "gpu_type"},
            )
        if gpus is not None:
            # The count is checked on the type it will be pinned to (none for ``any``).
            on = job.pinned_gpu_type if gpu_type is None else gpu_type
            _check_gpu_count(job, gpus, None if on == ANY_GPU_TYPE else on)
        if gpu_type is not None:
            _check_gpu_type(job, gpu_type, present, gpus)
            job.pinned_gpu_type = None if gpu_type == ANY_GPU_TYPE else gpu_type
        if gpus is not None:
            job.pinned_gpus = gpus
    platform.wakeups.notify("autoscaler")


def _check_gpu_count(job: Job, gpus: int, gpu_type: str | None) -> None:
    elastic = job.manifest["elastic"]["gpus"]
    low, high = int(elastic["min"]), int(elastic["max"])
    per = max(job.gpus, 1)
    if not low <= gpus <= high or gpus % per:
        raise BadRequest(
            f"gpus must be a multiple of {per} between {low} and {high}, got {gpus}",
            code="C104",
            detail={"field": "gpus"},
        )
    spec = Manifest.from_dict(job.manifest).elastic
    bounds = spec.gpus_for_local_batches(gpu_type) if spec is not None else None
    if bounds is not None and not bounds[0] <= gpus <= bounds[1]:
        on = f" on {gpu_type} GPUs" if gpu_type else ""
        raise BadRequest(
            f"{gpus} GPUs cannot run any batch of elastic.batch_size inside "
            f"elastic.local_batch_size per GPU{on}: choose {bounds[0]}..{bounds[1]}",
            code="C104",
            detail={"field": "gpus"},
        )


def _gpu_types_present(platform: Platform) -> dict[str, int]:
    """GPUs of each type on the cluster's schedulable nodes (CPU slots are no type)."""
    present: dict[str, int] = {}
    for node in effective_nodes(platform):
        if node.gpu_type and node.gpu_type != CPU_SLOTS and node.schedulable:
            present[node.gpu_type] = present.get(node.gpu_type, 0) + node.gpus
    return present


def _check_gpu_type(job: Job, gpu_type: str, present: dict[str, int], gpus: int | None) -> None:
    if gpu_type == ANY_GPU_TYPE:
        return
    accepted = list(job.gpu_types or sorted(present))
    if gpu_type not in accepted:
        named = ", ".join(accepted) if accepted else "none: the cluster has no GPU types"
        raise BadRequest(
            f"{job.id} does not accept GPU type {gpu_type!r}; the types it accepts: {named}",
            code="C104",
            detail={"field": "gpu_type", "accepted": accepted},
        )
    if gpu_type not in present:
        have = ", ".join(sorted(present)) or "none"
        raise BadRequest(
            f"no schedulable node has GPU type {gpu_type!r} (the cluster has: {have})",
            code="C104",
            detail={"field": "gpu_type", "accepted": accepted},
        )
    wanted = gpus if gpus is not None else job.pinned_gpus
    if wanted is not None and wanted > present[gpu_type]:
        raise BadRequest(
            f"{wanted} GPUs do not fit on the {gpu_type} nodes ({present[gpu_type]} GPUs in all)",
            code="C104",
            detail={"field": "gpus" if gpus is not None else "gpu_type"},
        )


def cancel_job(
    platform: Platform, principal: Principal, job_id: str, action: str = "job.cancel"
) -> str:
    """Stop a job for good and keep its record: at once when nothing of it runs, else through
    the lifecycle manager, waiting briefly for its processes to go. The status it is in then
    (a job that had already ended keeps its own)."""
    with platform.store.write() as session:
        job = _load_for_change(session, principal, job_id, action)
        status = JobStatus(job.status)
        if is_terminal(status):
            return status.value
        live = status in HOLDING_JOB_STATES
        if live:
            job.desired = "cancel"
        else:  # QUEUED or HALTED: nothing runs, cancel at once
            set_job_status(session, job, JobStatus.CANCELLED, "cancelled by user")
    platform.wakeups.notify("lcm", "scheduler")
    return _wait_until_terminal(platform, job_id) if live else JobStatus.CANCELLED.value


def delete_job(platform: Platform, principal: Principal, job_id: str) -> dict[str, Any]:
    """Remove a job as FfDL did, cancelling it first if it is live: its record, events, log
    lines, metrics (archived ones too) and its files on the platform go. Results already
    written to the user's data store stay there (FfDL kept trained models in the user's
    bucket).

    A live job whose processes have not stopped within the wait stays (``deleted`` false),
    still being cancelled; deleting it again once it has stopped removes it.
    """
    status = cancel_job(platform, principal, job_id, action="job.delete")
    if not is_terminal(JobStatus(status)):
        return {"model_id": job_id, "status": status, "deleted": False}
    with platform.store.write() as session:
        job = session.get(Job, job_id)
        archived = job is not None and bool(job.archived_line_number or job.archived_metric_number)
        session.execute(sql_delete(Job).where(Job.id == job_id))
    shutil.rmtree(JobDirs.of(platform.settings.jobs_dir, job_id).root, ignore_errors=True)
    if archived:
        platform.archive.forget_job(job_id)
    platform.wakeups.notify("scheduler")
    return {"model_id": job_id, "status": status, "deleted": True}


def _wait_until_terminal(platform: Platform, job_id: str) -> str:
    deadline = time.monotonic() + _CANCEL_WAIT_S
    status = ""
    while True:
        with platform.store.read() as session:
            job = session.get(Job, job_id)
            status = job.status if job is not None else JobStatus.CANCELLED.value
        if is_terminal(JobStatus(status)) or time.monotonic() > deadline:
            return status
        time.sleep(0.05)
