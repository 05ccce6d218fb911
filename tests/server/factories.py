"""Factory helpers for store tests on a real SQLite file."""

from __future__ import annotations

from pathlib import Path

from ffdl.core.status import JobStatus
from ffdl.server.store.db import Store
from ffdl.server.store.models import Job, Tenant, User
from ffdl.server.store.transitions import utcnow


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
