"""Turning stored jobs (ORM objects or plain rows with the same columns) into the
scheduler's snapshot types."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ffdl.core.manifest import Manifest
from ffdl.core.resources import Placement, Resources
from ffdl.scheduler.snapshot import QueuedJob, RunningJob


def epoch(value: datetime | None) -> float:
    return 0.0 if value is None else value.replace(tzinfo=UTC).timestamp()


def queued_job_from_manifest(
    job_id: str, tenant: str, manifest: Manifest, submitted_at: float
) -> QueuedJob:
    return QueuedJob(
        id=job_id,
        tenant=tenant,
        priority=manifest.priority,
        submitted_at=submitted_at,
        learners=manifest.learners,
        per_learner=manifest.resources,
        gpu_type=manifest.gpu_type,
        gpu_types=tuple(manifest.gpu_types),
        mix_gpu_types=manifest.mix_gpu_types,
        placement_policy=manifest.placement.policy,
        same_label=manifest.placement.same,
        expected_duration_s=manifest.expected_duration_s,
    )


def queued_job(row: Any, *, learners: int | None = None, gpu_type: str | None = None) -> QueuedJob:
    """``row`` as the scheduler queues it: on GPUs of ``gpu_type`` when given (where the
    autoscaler moves it), else of the type ``ffdl scale`` pinned it to, else of the types
    its manifest accepts."""
    only = gpu_type or row.pinned_gpu_type
    return QueuedJob(
        id=row.id,
        tenant=row.tenant_id,
        priority=row.priority,
        submitted_at=epoch(row.submitted_at),
        learners=row.learners if learners is None else learners,
        per_learner=Resources(row.gpus, row.cpus, row.memory_mb),
        gpu_type=row.gpu_type,
        gpu_types=(only,) if only else tuple(row.gpu_types or ()),
        mix_gpu_types=bool(row.mix_gpu_types) and not only,
        preferred_type=(row.rescale_target or {}).get("gpu_type") if row.elastic else None,
        placement_policy=row.placement_policy,
        same_label=row.same_label,
        expected_duration_s=row.expected_duration_s,
    )


def running_job(row: Any) -> RunningJob:
    return RunningJob(
        id=row.id,
        tenant=row.tenant_id,
        priority=row.priority,
        started_at=epoch(row.started_at or row.status_changed_at),
        learners=row.learners,
        per_learner=Resources(row.gpus, row.cpus, row.memory_mb),
        placement=Placement.from_json(row.placement or []),
        expected_duration_s=row.expected_duration_s,
        estimated_end_at=row.estimated_end_at,
        # Elastic jobs are shrunk by the autoscaler to make room, never preempted.
        preemptible=not row.elastic,
    )
