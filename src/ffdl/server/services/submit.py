"""Submitting a training job: validate everything first, then store it as QUEUED.

Nothing is written for a rejected job: the manifest, the resource request, the data stores'
host paths and the archive are all checked before the archive touches the disk or a row is
added. Data-store credentials are sealed before the manifest is stored.

Idempotency: a submit may carry a key (the ``Idempotency-Key`` header, 1 to 200 printable
ASCII characters). It is stored with the job, unique per user, together with a digest of the
manifest and archive. A later submit by the same user with the same key creates nothing: with
the same manifest and archive it gets the job the key already made (``replayed``), so a
client that lost the answer (the server crashed after committing) retries safely; with
another manifest or archive it is refused with 409. The check comes before validation, so a
replay is answered even if the cluster or the quotas have changed since. A key is free again
once its job has been deleted.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import secrets
import shutil
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError

from ffdl.core.archive import validate_archive
from ffdl.core.errors import (
    BadRequest,
    ConflictError,
    ManifestError,
    PayloadTooLarge,
    UnschedulableError,
)
from ffdl.core.jobdirs import JobDirs
from ffdl.core.manifest import Manifest, parse_manifest
from ffdl.core.manifest_fields import RESOURCE_SPEC_CODE
from ffdl.core.resources import Node
from ffdl.core.status import JobStatus
from ffdl.scheduler.policy import never_fits
from ffdl.server.auth import Principal
from ffdl.server.platform import Platform
from ffdl.server.services.nodes import backend_nodes
from ffdl.server.services.runtimes import Resolution, effective_runtimes, resolve
from ffdl.server.services.snapshots import queued_job_from_manifest
from ffdl.server.services.stores import check_object_stores, check_store_paths
from ffdl.server.store.models import Event, Job
from ffdl.server.store.transitions import utcnow

MAX_IDEMPOTENCY_KEY = 200
_KEY_PATTERN = re.compile(r"[\x20-\x7e]+")


def new_job_id() -> str:
    # 50 random bits in 10 base-32 characters (lower case letters and digits).
    return "training-" + base64.b32encode(secrets.token_bytes(10)).decode()[:10].lower()


@dataclass(frozen=True, slots=True)
class Submitted:
    job_id: str
    warnings: list[str]
    # The job's status now: QUEUED when just created, anything for a replay.
    status: str = JobStatus.QUEUED.value
    # True when an earlier submit with the same idempotency key made the job.
    replayed: bool = False


def check_idempotency_key(key: str | None) -> str | None:
    """The key as given, or None when there is none; BadRequest for an unusable one."""
    if key is None:
        return None
    if len(key) > MAX_IDEMPOTENCY_KEY:
        raise BadRequest(
            f"Idempotency-Key is {len(key)} characters long; the limit is {MAX_IDEMPOTENCY_KEY}",
            detail={"field": "Idempotency-Key"},
        )
    if not _KEY_PATTERN.fullmatch(key) or not key.strip():
        raise BadRequest(
            "Idempotency-Key must be printable ASCII and not blank",
            detail={"field": "Idempotency-Key"},
        )
    return key


def request_digest(manifest_bytes: bytes, archive: bytes) -> str:
    digest = hashlib.sha256()
    for part in (manifest_bytes, archive):
        # Length-prefixed, so that bytes moved from one part to the other change the digest.
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


def submit_job(
    platform: Platform,
    principal: Principal,
    manifest_bytes: bytes,
    archive: bytes,
    idempotency_key: str | None = None,
) -> Submitted:
    settings = platform.settings
    key = check_idempotency_key(idempotency_key)
    digest = request_digest(manifest_bytes, archive) if key is not None else None
    if key is not None and digest is not None:
        earlier = _earlier_submit(platform, principal, key, digest, manifest_bytes)
        if earlier is not None:
            return earlier
    if len(manifest_bytes) > settings.max_manifest_bytes:
        raise PayloadTooLarge(
            f"manifest is {len(manifest_bytes)} bytes; the limit is {settings.max_manifest_bytes}"
        )
    if len(archive) > settings.max_archive_bytes:
        raise PayloadTooLarge(
            f"model_definition is {len(archive)} bytes; the limit is {settings.max_archive_bytes}"
        )
    manifest = parse_manifest(manifest_bytes)
    check_store_paths(settings, manifest)
    runtime = _runtime(platform, manifest)
    job_id = new_job_id()
    # While the backend cannot say what nodes it has (a Ray cluster that is down), the job
    # is accepted and waits in the queue with the backend's reason.
    reason = None
    if platform.backend.problem() is None:
        nodes = backend_nodes(platform)
        check_gpu_types(manifest, nodes)
        check_local_batch_types(manifest, nodes)
        reason = never_fits(
            queued_job_from_manifest(job_id, principal.tenant_id, manifest, 0.0), nodes
        )
    if reason is not None:
        raise UnschedulableError(f"job can never be scheduled on this cluster: {reason}")
    validate_archive(
        archive,
        max_files=settings.max_archive_files,
        max_unpacked_bytes=settings.max_unpacked_bytes,
    )
    # Last of the checks, as the slowest: it asks the user's object store (seconds at most).
    check_object_stores(settings, manifest)
    dirs = JobDirs.of(settings.jobs_dir, job_id)
    dirs.root.mkdir(parents=True)
    try:
        tmp = dirs.archive.with_suffix(".tmp")
        tmp.write_bytes(archive)
        os.replace(tmp, dirs.archive)
        _insert_job(platform, principal, job_id, manifest, key, digest, runtime.runtime.label)
    except IntegrityError:
        shutil.rmtree(dirs.root, ignore_errors=True)
        if key is None or digest is None:
            raise
        # A concurrent submit with the same key committed first: answer as its retry.
        earlier = _earlier_submit(platform, principal, key, digest, manifest_bytes)
        if earlier is None:
            raise
        return earlier
    except BaseException:
        shutil.rmtree(dirs.root, ignore_errors=True)
        raise
    platform.wakeups.notify("scheduler", "autoscaler")
    warnings = _warnings(manifest) + ([runtime.warning] if runtime.warning else [])
    return Submitted(job_id=job_id, warnings=warnings)


def check_gpu_types(manifest: Manifest, nodes: Sequence[Node]) -> None:
    """Refuse a list of ``gpu_types`` naming a type no node has, though others are there,
    naming the types the cluster has (a single unknown type never fits: ``never_fits``)."""
    present = sorted({node.gpu_type for node in nodes if node.gpu_type})
    unknown = [kind for kind in manifest.gpu_types if kind not in present]
    if not unknown or len(manifest.gpu_types) < 2 or not nodes:
        return
    has = f"the cluster's: {', '.join(present)}" if present else "no node names a GPU type"
    raise ManifestError(
        "gpu_types", f"no node has GPU type {', '.join(unknown)} ({has})", code=RESOURCE_SPEC_CODE
    )


def check_local_batch_types(manifest: Manifest, nodes: Sequence[Node]) -> None:
    """Refuse per-GPU batch limits for a GPU type no node has (a typo would silently leave
    the type it meant without limits), or for one the job does not accept, naming those
    there are."""
    elastic = manifest.elastic
    if elastic is None or not elastic.local_batch_size_by_type or not nodes:
        return
    present = sorted({node.gpu_type for node in nodes if node.gpu_type})
    usable = [kind for kind in present if not manifest.gpu_types or kind in manifest.gpu_types]
    for kind in elastic.local_batch_size_by_type:
        if kind not in usable:
            what = "no node has" if kind not in present else "the job does not accept"
            has = ", ".join(usable) or "none"
            raise ManifestError(
                f"elastic.local_batch_size.{kind}",
                f"{what} GPU type {kind} (the types it can run on: {has})",
                code=RESOURCE_SPEC_CODE,
            )


def _warnings(manifest: Manifest) -> list[str]:
    return [f"unknown manifest field ignored: {name}" for name in manifest.unknown_fields]


def _runtime(platform: Platform, manifest: Manifest) -> Resolution:
    """The framework runtime the job runs on (ManifestError when its framework has none)."""
    framework = manifest.framework
    runtimes = effective_runtimes(platform.settings.runtimes)
    return resolve(runtimes, framework.name, framework.version)


def _runtime_warnings(platform: Platform, manifest: Manifest) -> list[str]:
    warning = _runtime(platform, manifest).warning
    return [warning] if warning else []


def _earlier_submit(
    platform: Platform, principal: Principal, key: str, digest: str, manifest_bytes: bytes
) -> Submitted | None:
    """The job an earlier submit with ``key`` made, or None; ConflictError when that submit
    sent another manifest or archive."""
    with platform.store.read() as session:
        row = session.execute(
            select(Job.id, Job.status, Job.idempotency_digest).where(
                Job.user_id == principal.user_id, Job.idempotency_key == key
            )
        ).first()
    if row is None:
        return None
    job_id, status, stored_digest = row
    if stored_digest != digest:
        raise ConflictError(
            f"Idempotency-Key {key!r} was used for {job_id} with another manifest or "
            "model_definition; send a new key for a new job",
            detail={"field": "Idempotency-Key", "model_id": job_id},
        )
    try:
        # The same bytes parsed the first time, so they warn alike now.
        replayed = parse_manifest(manifest_bytes)
        warnings = _warnings(replayed) + _runtime_warnings(platform, replayed)
    except BadRequest:
        warnings = []
    return Submitted(job_id=job_id, warnings=warnings, status=status, replayed=True)


def _initial_batch(manifest: Manifest) -> int | None:
    if manifest.elastic is None or manifest.elastic.batch_size is None:
        return None
    return manifest.elastic.batch_size.min


def _insert_job(
    platform: Platform,
    principal: Principal,
    job_id: str,
    manifest: Manifest,
    key: str | None,
    digest: str | None,
    runtime: str | None = None,
) -> None:
    now = utcnow()
    job = {
        "id": job_id,
        "tenant_id": principal.tenant_id,
        "user_id": principal.user_id,
        "idempotency_key": key,
        "idempotency_digest": digest,
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
        "gpu_types": manifest.gpu_types or None,
        "mix_gpu_types": manifest.mix_gpu_types,
        "placement_policy": manifest.placement.policy,
        "same_label": manifest.placement.same,
        "expected_duration_s": manifest.expected_duration_s,
        "elastic": manifest.elastic is not None,
        "batch_size": _initial_batch(manifest),
        "runtime": runtime,
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
