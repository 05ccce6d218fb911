"""Factory helpers for store tests on a real database: a SQLite file, or a fresh database
on the test session's PostgreSQL server (``tests.postgres``).

A test runs on both with ``@on_both_databases`` and a ``database`` argument passed on to
``make_store``. Stores are created by ``schema.upgrade``, as ffdl creates them.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from ffdl.core.status import JobStatus, LearnerStatus
from ffdl.server.store.db import Store
from ffdl.server.store.models import Job, Learner, Tenant, User
from ffdl.server.store.schema import upgrade
from ffdl.server.store.transitions import set_job_status, utcnow
from tests import postgres

DATABASES = ("sqlite", "postgresql")
on_both_databases = pytest.mark.parametrize("database", DATABASES)


def database_url(tmp_path: Path, database: str = "sqlite") -> str:
    """A new, empty database of kind ``database`` ("sqlite" or "postgresql")."""
    if database == "sqlite":
        return f"sqlite:///{tmp_path / 'ffdl.db'}"
    if database == "postgresql":
        return postgres.shared().create_database()
    raise ValueError(f"unknown database kind {database!r}: one of {', '.join(DATABASES)}")


def make_store(tmp_path: Path, database: str = "sqlite") -> Store:
    store = Store(database_url(tmp_path, database))
    upgrade(store)
    with store.write() as session:
        now = utcnow()
        session.add(Tenant(id="t1", name="Team one", created_at=now))
        session.flush()
        session.add(User(id="u1", tenant_id="t1", name="ada", role="member", created_at=now))
    return store


def make_job(store: Store, job_id: str = "training-test", **fields: object) -> str:
    with store.write() as session:
        session.add(job_row(job_id, **fields))
    return job_id


def job_row(job_id: str = "training-test", **fields: object) -> Job:
    """A QUEUED job of tenant t1's user u1, not yet added to any session."""
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
    return Job(**values)


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
