"""Turning stored jobs (ORM objects or plain rows with the same columns) into the
scheduler's snapshot types, and remembering running jobs from one pass to the next."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Text, cast

from ffdl.core.manifest import Manifest
from ffdl.core.resources import Placement, Resources
from ffdl.scheduler.snapshot import QueuedJob, RunningJob
from ffdl.server.store.models import Job


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
    return _running(
        row.id,
        row.tenant_id,
        row.priority,
        epoch(row.started_at or row.status_changed_at),
        row.learners,
        Resources(row.gpus, row.cpus, row.memory_mb),
        row.placement or [],
        row.expected_duration_s,
        row.estimated_end_at,
        row.elastic,
    )


def _running(
    job_id: str,
    tenant: str,
    priority: int,
    started_at: float,
    learners: int,
    per_learner: Resources,
    placement: list[dict[str, object]],
    expected_duration_s: float | None,
    estimated_end_at: float | None,
    elastic: bool,
) -> RunningJob:
    return RunningJob(
        id=job_id,
        tenant=tenant,
        priority=priority,
        started_at=started_at,
        learners=learners,
        per_learner=per_learner,
        placement=Placement.from_json(placement),
        expected_duration_s=expected_duration_s,
        estimated_end_at=estimated_end_at,
        # Elastic jobs are shrunk by the autoscaler to make room, never preempted.
        preemptible=not elastic,
    )


# A running job as the scheduler loop reads it every pass: plain values only, its times and
# placement as the database's text, so that a row unchanged since the last pass is known by
# equality and its ``RunningJob`` kept without parsing anything again.
RUNNING_COLUMNS = (
    Job.id,
    Job.tenant_id,
    Job.priority,
    cast(Job.started_at, Text),
    cast(Job.status_changed_at, Text),
    Job.learners,
    Job.gpus,
    Job.cpus,
    Job.memory_mb,
    cast(Job.placement, Text),
    Job.expected_duration_s,
    Job.estimated_end_at,
    Job.elastic,
)


class RunningJobs:
    """The running jobs of the last pass, by id, with the row each was made from.

    With thousands of jobs running, parsing every row's times and placement each pass cost
    more than the scheduling itself; most rows do not change between two passes.
    """

    def __init__(self) -> None:
        self._known: dict[str, tuple[Sequence[Any], RunningJob]] = {}

    def update(self, rows: Iterable[Sequence[Any]]) -> tuple[RunningJob, ...]:
        """The running jobs of ``rows`` (``RUNNING_COLUMNS``); forgets the others."""
        known: dict[str, tuple[Sequence[Any], RunningJob]] = {}
        for row in rows:
            # Plain tuples compare in C; a database row compares several times slower.
            values = tuple(row)
            entry = self._known.get(values[0])
            if entry is None or entry[0] != values:
                entry = (values, _running_from_text(values))
            known[values[0]] = entry
        self._known = known
        return tuple(job for _row, job in known.values())


def _running_from_text(row: Sequence[Any]) -> RunningJob:
    (
        job_id, tenant, priority, started_at, changed_at, learners, gpus, cpus, memory_mb,
        placement, expected_duration_s, estimated_end_at, elastic,
    ) = row  # fmt: skip
    return _running(
        job_id,
        tenant,
        priority,
        epoch(datetime.fromisoformat(started_at or changed_at)),
        learners,
        Resources(gpus, cpus, memory_mb),
        json.loads(placement) if placement else [],
        expected_duration_s,
        estimated_end_at,
        elastic,
    )
