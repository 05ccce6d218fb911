"""The scheduler loop's snapshot of running jobs (``RunningJobs``), on a real SQLite file and
a real PostgreSQL database: the same jobs as read through the ORM, kept between passes only
while their rows do not change."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from sqlalchemy import event, select

from ffdl.backends.fake import FakeBackend
from ffdl.core.resources import LearnerPlacement, Node, Placement
from ffdl.core.status import JobStatus
from ffdl.scheduler.snapshot import RunningJob
from ffdl.server.auth import JobTokens
from ffdl.server.credentials import CredentialVault
from ffdl.server.loops.scheduler import SchedulerLoop
from ffdl.server.platform import Platform
from ffdl.server.services.snapshots import running_job
from ffdl.server.settings import Settings
from ffdl.server.store.db import Store
from ffdl.server.store.models import Job
from ffdl.server.store.transitions import utcnow
from tests.server.factories import make_job, make_store, on_both_databases

SECRET = b"s" * 32
NODES = [Node(name=f"node-{n}", gpus=8, cpus=64, memory_mb=65536) for n in "abc"]


def _loop(tmp_path: Path, store: Store) -> SchedulerLoop:
    platform = Platform(
        settings=Settings(home=tmp_path / "home"),
        store=store,
        backend=FakeBackend(NODES),
        job_tokens=JobTokens(SECRET),
        credentials=CredentialVault(SECRET),
    )
    return SchedulerLoop(platform)


def _running(
    store: Store, job_id: str, node: str, gpu_ids: tuple[int, ...], **fields: object
) -> None:
    placement = Placement((LearnerPlacement(1, node, gpu_ids, "a100"),))
    make_job(
        store,
        job_id,
        status=JobStatus.PROCESSING.value,
        gpus=len(gpu_ids),
        placement=placement.to_json(),
        **fields,
    )


def _through_the_orm(store: Store) -> dict[str, RunningJob]:
    with store.read() as session:
        rows = session.scalars(select(Job).where(Job.status == JobStatus.PROCESSING.value))
        return {row.id: running_job(row) for row in rows}


@on_both_databases
def test_running_jobs_are_read_as_the_orm_reads_them_and_kept_only_while_unchanged(
    tmp_path: Path, database: str
) -> None:
    store = make_store(tmp_path, database)
    # PostgreSQL writes 0.12 s as ".12" in text: the times must still read back exactly.
    started = utcnow().replace(microsecond=120_000) - timedelta(hours=2)
    _running(store, "training-a", "node-a", (0, 1), started_at=started, estimated_end_at=9e9)
    _running(store, "training-b", "node-b", (3,), elastic=True, expected_duration_s=600.0)
    make_job(store, "training-q")  # queued: the loop reads the running ones only then
    loop = _loop(tmp_path, store)

    first, _ = loop.snapshot()
    assert {job.id: job for job in first.running} == _through_the_orm(store)
    second, _ = loop.snapshot()
    assert all(a is b for a, b in zip(first.running, second.running, strict=True))

    # The backend bound other devices (no status change): the next pass sees them.
    with store.write() as session:
        job = session.get(Job, "training-a")
        assert job is not None and job.placement is not None
        job.placement = [{**job.placement[0], "gpu_ids": [4, 5]}]
    with store.write() as session:
        finished = session.get(Job, "training-b")
        assert finished is not None
        finished.status = JobStatus.COMPLETED.value
    third, _ = loop.snapshot()
    assert [job.id for job in third.running] == ["training-a"]
    assert third.running[0].placement.learners[0].gpu_ids == (4, 5)
    assert third.running[0] == _through_the_orm(store)["training-a"]


@on_both_databases
def test_a_pass_writes_its_starts_as_one_batch_whatever_columns_each_changes(
    tmp_path: Path, database: str
) -> None:
    # Two-learner jobs get a master port and single ones none; restarted jobs had a
    # not_before to clear. Interleaved by id, each change of column set used to cost the
    # flush another statement (a round trip to the database each).
    store = make_store(tmp_path, database)
    later = utcnow() - timedelta(seconds=1)
    for n in range(8):
        fields: dict[str, object] = {"learners": 2} if n % 2 else {}
        if n % 3 == 0:
            fields["not_before"] = later
        make_job(store, f"training-{n}", **fields)
    updates: list[tuple[str, bool]] = []

    def record(
        _conn: object, _cursor: object, sql: str, _params: object, _ctx: object, many: bool
    ) -> None:
        if sql.startswith("UPDATE jobs SET status"):
            updates.append((sql, many))

    loop = _loop(tmp_path, store)
    event.listen(store.engine, "before_cursor_execute", record)
    try:
        loop()
    finally:
        event.remove(store.engine, "before_cursor_execute", record)
    with store.read() as session:
        jobs = session.scalars(select(Job).order_by(Job.id)).all()
    assert [job.status for job in jobs] == [JobStatus.PENDING.value] * 8
    assert [job.master_port is not None for job in jobs] == [n % 2 == 1 for n in range(8)]
    assert all(job.not_before is None and job.placement for job in jobs)
    assert len(updates) == 1 and updates[0][1], [sql for sql, _ in updates]
