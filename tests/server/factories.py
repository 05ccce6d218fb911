"""Factory helpers for store tests on a real SQLite file."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from ffdl.core.status import JobStatus, LearnerStatus
from ffdl.server.store.db import Store
from ffdl.server.store.models import Job, Learner, Tenant, User
from ffdl.server.store.transitions import set_job_status, utcnow


def make_store(tmp_path: Path) -> Store:
    store = Store(f"sqlite:///{tmp_path / 'ffdl.db'}")
    store.create_all()
    with store.write() as session:
        now = utcnow()
        session.add(Tenant(id="t1", name="Team one", created_at=now))
        session.flush()
        session.add(User(id="u1", tenant_id="t1", name="ada", role="member", created_at=now))
    return store


def make_job(store: Store, job_id: str = "training-test", **fields: object) -> str:
    now = utcnow()
    values: dict[str, object] = {
        "id": job_id,
        "tenant_id": "t1",
        "user_id": "u1",
        "name": "job",
        "manifest": {"name": "job", "framework": {"name": "custom", "command": "true"}},
        "status": JobStatus.QUEUED.value,
        "learners": 1,
        "gpus": 1,
        "cpus": 1.0,
        "memory_mb": 256,
        "submitted_at": now,
        "status_changed_at": now,
    }
    values.update(fields)
    with store.write() as session:
        session.add(Job(**values))
    return job_id


def start_learner(
    store: Store,
    job_id: str,
    *,
    node: str = "node-a",
    gpu_ids: list[int] | None = None,
    handle: dict[str, Any] | None = None,
    last_heartbeat: datetime | None = None,
) -> None:
    """Move a QUEUED job to PROCESSING on attempt 1 with one PROCESSING learner on ``node``."""
    with store.write() as session:
        job = session.get(Job, job_id)
        assert job is not None
        job.attempt = 1
        set_job_status(session, job, JobStatus.PENDING, f"placed on {node}")
        set_job_status(session, job, JobStatus.PROCESSING, "training")
        session.add(
            Learner(
                job_id=job_id,
                index=1,
                attempt=1,
                status=LearnerStatus.PROCESSING.value,
                node=node,
                gpu_ids=list(gpu_ids or []),
                handle=handle,
                updated_at=utcnow(),
                last_heartbeat=last_heartbeat,
            )
        )
