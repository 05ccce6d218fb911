"""Turning stored jobs (and manifests) into the scheduler's snapshot types."""

from __future__ import annotations

from datetime import UTC, datetime

from ffdl.core.manifest import Manifest
from ffdl.scheduler.snapshot import QueuedJob


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
        placement_policy=manifest.placement.policy,
        same_label=manifest.placement.same,
        expected_duration_s=manifest.expected_duration_s,
    )


def epoch(value: datetime | None) -> float:
    return 0.0 if value is None else value.replace(tzinfo=UTC).timestamp()
