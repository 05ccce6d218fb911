"""Finished jobs written straight into a store, for benchmarks that need a full one."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import insert

from ffdl.server.store.db import Store
from ffdl.server.store.models import Job
from ffdl.server.store.transitions import utcnow

CHUNK = 5000


def seed_finished_jobs(
    store: Store, count: int, *, tenant_id: str = "default", user_id: str = "admin"
) -> None:
    """``count`` COMPLETED jobs of ``user_id``, one submitted every 30 s from 60 days ago, in
    inserts of ``CHUNK`` rows."""
    base = utcnow() - timedelta(days=60)
    for first in range(0, count, CHUNK):
        rows = []
        for i in range(first, min(count, first + CHUNK)):
            at = base + timedelta(seconds=i * 30)
            rows.append(
                {
                    "id": f"training-seed{i:07d}",
                    "tenant_id": tenant_id,
                    "user_id": user_id,
                    "name": f"seed-{i}",
                    "manifest": {"name": f"seed-{i}", "framework": {"name": "custom"}},
                    "status": "COMPLETED",
                    "reason": "completed",
                    "learners": 1,
                    "gpus": 1,
                    "cpus": 1.0,
                    "memory_mb": 1024,
                    "submitted_at": at,
                    "started_at": at,
                    "finished_at": at,
                    "status_changed_at": at,
                    "attempt": 1,
                    "exit_code": 0,
                }
            )
        with store.write() as session:
            session.execute(insert(Job), rows)
