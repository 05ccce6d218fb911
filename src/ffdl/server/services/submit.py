"""Submitting a training job: validate everything first, then store it as QUEUED.

Nothing is written for a rejected job: the manifest, the resource request, the data stores'
host paths and the archive are all checked before the archive touches the disk or a row is
added. Data-store credentials are sealed before the manifest is stored.
"""

from __future__ import annotations

import base64
import os
import secrets
import shutil
from dataclasses import dataclass

from sqlalchemy import insert

from ffdl.core.errors import ManifestError, PayloadTooLarge, UnschedulableError
from ffdl.core.manifest import Manifest, parse_manifest
from ffdl.core.status import JobStatus
from ffdl.scheduler.policy import never_fits
from ffdl.server.auth import Principal
from ffdl.server.platform import Platform
from ffdl.server.services.archive import validate_archive
from ffdl.server.services.jobdirs import JobDirs
from ffdl.server.services.snapshots import queued_job_from_manifest
from ffdl.server.services.stores import check_store_paths
from ffdl.server.store.models import Event, Job
from ffdl.server.store.transitions import utcnow

# Data store types the learners' controllers can stage today.
STAGEABLE_STORES = ("local", "mount_volume")


def new_job_id() -> str:
    # 50 random bits in 10 base-32 characters (lower case letters and digits).
    return "training-" + base64.b32encode(secrets.token_bytes(10)).decode()[:10].lower()


@dataclass(frozen=True, slots=True)
class Submitted:
    job_id: str
    warnings: list[str]


def submit_job(
    platform: Platform, principal: Principal, manifest_bytes: bytes, archive: bytes
) -> Submitted:
    settings = platform.settings
    if len(manifest_bytes) > settings.max_manifest_bytes:
        raise PayloadTooLarge(
            f"manifest is {len(manifest_bytes)} bytes; the limit is {settings.max_manifest_bytes}"
        )
    if len(archive) > settings.max_archive_bytes:
        raise PayloadTooLarge(
            f"model_definition is {len(archive)} bytes; the limit is {settings.max_archive_bytes}"
        )
    manifest = parse_manifest(manifest_bytes)
    for index, store in enumerate(manifest.data_stores):
        if store.type not in STAGEABLE_STORES:
            raise ManifestError(
                f"data_stores[{index}].type",
                f"{store.type!r} stores are not available on this platform yet; "
                f"use one of {', '.join(STAGEABLE_STORES)}",
            )
    check_store_paths(settings, manifest)
    job_id = new_job_id()
    reason = never_fits(
        queued_job_from_manifest(job_id, principal.tenant_id, manifest, 0.0),
        platform.backend.nodes(),
    )
    if reason is not None:
        raise UnschedulableError(f"job can never be scheduled on this cluster: {reason}")
    validate_archive(
        archive,
        max_files=settings.max_archive_files,
        max_unpacked_bytes=settings.max_unpacked_bytes,
    )
    dirs = JobDirs.of(settings.jobs_dir, job_id)
    dirs.root.mkdir(parents=True)
    try:
        tmp = dirs.archive.with_suffix(".tmp")
        tmp.write_bytes(archive)
        os.replace(tmp, dirs.archive)
        _insert_job(platform, principal, job_id, manifest)
    except BaseException:
        shutil.rmtree(dirs.root, ignore_errors=True)
        raise
    platform.wakeups.notify("scheduler", "autoscaler")
    warnings = [f"unknown manifest field ignored: {name}" for name in manifest.unknown_fields]
    return Submitted(job_id=job_id, warnings=warnings)


def _initial_batch(manifest: Manifest) -> int | None:
    if manifest.elastic is None or manifest.elastic.batch_size is None:
        return None
    return manifest.elastic.batch_size.min


def _insert_job(platform: Platform, principal: Principal, job_id: str, manifest: Manifest) -> None:
    now = utcnow()
    job = {
        "id": job_id,
        "tenant_id": principal.tenant_id,
        "user_id": principal.user_id,
        "name": manifest.name,
        "description": manifest.description,
        "manifest": platform.credentials.seal_manifest(manifest.to_dict()),
        "status": JobStatus.QUEUED.value,
        "reason": "waiting for the scheduler",
        "priority": manifest.priority,
        "learners": manifest.learners,
        "gpus": manifest.gpus,
        "cpus": manifest.cpus,
        "memory_mb": manifest.memory_mb,
        "gpu_type": manifest.gpu_type,
        "placement_policy": manifest.placement.policy,
        "same_label": manifest.placement.same,
        "expected_duration_s": manifest.expected_duration_s,
        "elastic": manifest.elastic is not None,
        "batch_size": _initial_batch(manifest),
        "attempt": 0,
        "submitted_at": now,
        "status_changed_at": now,
    }
    event = {
        "job_id": job_id,
        "learner": None,
        "from_status": None,
        "to_status": JobStatus.QUEUED.value,
        "reason": "submitted",
        "created_at": now,
    }
    # Plain inserts: submission is the API's hottest write, and the ORM's unit of work
    # would cost more than the statements themselves.
    with platform.store.write() as session:
        session.execute(insert(Job), [job])
        session.execute(insert(Event), [event])
