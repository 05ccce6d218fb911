"""One lock order on a real PostgreSQL server: every transaction that writes a learner's row
takes its job's row first (``ffdl.server.store.transitions.lock_job``).

A report locks its job, then its learner. A writer that took the learner first and then
waited for the job (as the deploy's record of a launch once did, through the foreign key of
its deploy step) deadlocked with a report of the learner it had just launched; PostgreSQL
then failed one of the two. Here a report is held mid-transaction with its job's row
locked: each writer must wait for that row without holding the learner's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from ffdl.core.resources import LearnerPlacement
from ffdl.core.status import LearnerStatus
from ffdl.server.loops.lcm import record_launch
from ffdl.server.store.db import Store
from ffdl.server.store.models import Job, Learner
from ffdl.server.store.transitions import set_learner_status
from tests.integration.live import wait_for
from tests.server.factories import make_job, make_store, start_learner

JOB = "training-locks"


def _launch_recorded(session: Session) -> None:
    record_launch(session, JOB, 1, LearnerPlacement(1, "node-a", (0,)), {"pid": 4242})


def _learner_failed(session: Session) -> None:
    learner = session.scalars(select(Learner).where(Learner.job_id == JOB)).one()
    set_learner_status(session, learner, LearnerStatus.FAILED, "lost")


def _waiting_on_a_lock(store: Store) -> int:
    with store.engine.connect() as probe:
        return int(
            probe.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE wait_event_type = 'Lock' AND datname = current_database()"
                )
            ).scalar_one()
        )


@pytest.mark.parametrize("write", [_launch_recorded, _learner_failed], ids=["launch", "status"])
def test_a_learner_is_written_only_after_its_job_row_is_locked(
    tmp_path: Path, write: Callable[[Session], None]
) -> None:
    store = make_store(tmp_path, "postgresql")
    make_job(store, JOB)
    start_learner(store, JOB, gpu_ids=[0])
    with store.read() as session:
        learner_id = session.scalars(select(Learner.id).where(Learner.job_id == JOB)).one()
    report = store.engine.connect()
    done = threading.Event()
    failures: list[BaseException] = []

    def writer() -> None:
        try:
            with store.write() as session:
                write(session)
        except BaseException as exc:  # handed to the test's thread
            failures.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=writer)
    try:
        holding = report.begin()
        report.execute(select(Job.id).where(Job.id == JOB).with_for_update())
        thread.start()
        wait_for(
            lambda: done.is_set() or _waiting_on_a_lock(store) > 0,
            timeout=20,
            what="the writer waiting for a lock",
        )
        assert not done.is_set(), f"the writer did not wait for the job's row: {failures}"
        # The report goes on to its learner: free, because the writer waits for the job first.
        report.execute(
            text("SELECT id FROM learners WHERE id = :id FOR UPDATE NOWAIT"), {"id": learner_id}
        )
        holding.commit()
        assert done.wait(20)
        assert not failures
    finally:
        report.close()
        thread.join(20)
        store.dispose()
