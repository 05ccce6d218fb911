"""The status gate on a real SQLite database: status and event commit together."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from ffdl.core.errors import IllegalTransition
from ffdl.core.status import JobStatus
from ffdl.server.store.models import Event, Job
from ffdl.server.store.transitions import set_job_status
from tests.server.factories import make_job, make_store, on_both_databases


@on_both_databases
def test_each_change_writes_one_event_with_reason(tmp_path: Path, database: str) -> None:
    store = make_store(tmp_path, database)
    job_id = make_job(store)
    with store.write() as session:
        job = session.get(Job, job_id)
        assert job is not None
        set_job_status(session, job, JobStatus.PENDING, "placed on node-a")
        set_job_status(session, job, JobStatus.PENDING, "again")  # no-op
        set_job_status(session, job, JobStatus.PROCESSING, "training")
    with store.read() as session:
        events = session.scalars(select(Event).order_by(Event.id)).all()
        job = session.get(Job, job_id)
        assert job is not None and job.status == "PROCESSING" and job.started_at is not None
    assert [(e.from_status, e.to_status, e.reason) for e in events] == [
        ("QUEUED", "PENDING", "placed on node-a"),
        ("PENDING", "PROCESSING", "training"),
    ]


@on_both_databases
def test_illegal_change_rolls_back_the_whole_transaction(tmp_path: Path, database: str) -> None:
    store = make_store(tmp_path, database)
    job_id = make_job(store)
    with pytest.raises(IllegalTransition), store.write() as session:
        job = session.get(Job, job_id)
        assert job is not None
        set_job_status(session, job, JobStatus.PENDING, "placed")
        set_job_status(session, job, JobStatus.COMPLETED, "skipping ahead")
    with store.read() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.status == "QUEUED"
        assert session.scalars(select(Event)).all() == []
