"""Moving an ended job's records to the archive (``ffdl.server.services.record_archive``), on
a real SQLite file and a real PostgreSQL database: which jobs are due, a chunk moved once
when two replicas move it at the same time, and nothing lost when the store refuses."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from ffdl.core.errors import Unavailable
from ffdl.core.status import JobStatus
from ffdl.server.archive import ChunkRef, RecordArchive, encode_chunk
from ffdl.server.services.record_archive import due_jobs, move_chunk
from ffdl.server.settings import Settings
from ffdl.server.store.db import Store
from ffdl.server.store.models import Job, LogLine, Metric, RecordChunk
from ffdl.server.store.transitions import utcnow
from ffdl.storage.base import StoreUnreachable
from ffdl.storage.blobs import MemoryBlobStore
from tests.server.factories import make_job, make_store, on_both_databases

LINES = 30


def _ended_job(store: Store, job_id: str, *, hours_ago: float, lines: int = LINES) -> None:
    ended = utcnow() - timedelta(hours=hours_ago)
    make_job(
        store,
        job_id,
        status=JobStatus.COMPLETED.value,
        finished_at=ended,
        last_line_number=lines,
        last_metric_number=3,
    )
    with store.write() as session:
        for n in range(1, lines + 1):
            session.add(
                LogLine(
                    job_id=job_id,
                    learner=1,
                    attempt=1,
                    seq=n,
                    number=n,
                    stream="stdout",
                    text=f"line {n}",
                    time=1e9 + n,
                )
            )
        for n in range(1, 4):
            session.add(
                Metric(
                    job_id=job_id,
                    learner=1,
                    attempt=1,
                    seq=100 + n,
                    number=n,
                    group="train",
                    iteration=n,
                    values={"loss": 1.0 / n},
                    time=1e9 + n,
                )
            )


@on_both_databases
def test_only_jobs_that_ended_long_enough_ago_with_records_left_are_due(
    tmp_path: Path, database: str
) -> None:
    store = make_store(tmp_path, database)
    make_job(store, "running", status=JobStatus.PROCESSING.value, last_line_number=50)
    _ended_job(store, "ended-now", hours_ago=0.1)
    _ended_job(store, "ended-long-ago", hours_ago=30)
    _ended_job(store, "already-moved", hours_ago=40)
    with store.write() as session:
        moved = session.get(Job, "already-moved")
        assert moved is not None
        moved.archived_line_number, moved.archived_metric_number = LINES, 2  # newest stays
    settings = Settings(home=tmp_path, archive_records_after_h=24)
    with store.read() as session:
        assert due_jobs(session, settings, 10) == ["ended-long-ago"]
        assert due_jobs(session, Settings(home=tmp_path), 10) == []  # retention off


@on_both_databases
def test_a_jobs_records_move_in_chunks_and_the_newest_metric_stays(
    tmp_path: Path, database: str
) -> None:
    store = make_store(tmp_path, database)
    _ended_job(store, "done", hours_ago=30)
    blobs = MemoryBlobStore()
    archive = RecordArchive(lambda: blobs)
    assert [move_chunk(store, archive, "done", LogLine, 12) for _ in range(4)] == [12, 12, 6, 0]
    assert move_chunk(store, archive, "done", Metric, 12) == 2
    assert move_chunk(store, archive, "done", Metric, 12) == 0
    with store.read() as session:
        assert session.query(LogLine).filter_by(job_id="done").count() == 0
        assert [m.number for m in session.query(Metric).filter_by(job_id="done")] == [3]
        chunks = session.query(RecordChunk).order_by(RecordChunk.kind, RecordChunk.first_number)
        spans = [(c.kind, c.first_number, c.last_number, c.min_time, c.max_time) for c in chunks]
    assert spans == [
        ("log", 1, 12, 1e9 + 1, 1e9 + 12),
        ("log", 13, 24, 1e9 + 13, 1e9 + 24),
        ("log", 25, 30, 1e9 + 25, 1e9 + 30),
        ("metric", 1, 2, 1e9 + 1, 1e9 + 2),
    ]
    with store.read() as session:
        ref = ChunkRef.of(session.query(RecordChunk).filter_by(kind="metric").one())
    assert [k for k in blobs.objects if "/metric-" in k] == [ref.key]
    records = RecordArchive(lambda: blobs).records(ref, after=0, limit=10)
    assert [(r.number, r.iteration, r.values, r.group) for r in records] == [
        (1, 1, {"loss": 1.0}, "train"),
        (2, 2, {"loss": 0.5}, "train"),
    ]


class _RacingStore(MemoryBlobStore):
    """A store during whose first write another replica moves the same chunk first."""

    def __init__(self, race: object) -> None:
        super().__init__()
        self.race = race

    def put(self, key: str, data: bytes) -> None:
        race, self.race = self.race, None
        if callable(race):
            race()
        super().put(key, data)


@on_both_databases
def test_two_replicas_moving_one_chunk_move_it_once(tmp_path: Path, database: str) -> None:
    store = make_store(tmp_path, database)
    _ended_job(store, "done", hours_ago=30)
    other_blobs = MemoryBlobStore()
    other = RecordArchive(lambda: other_blobs)
    moved_by_other: list[int] = []
    racing = _RacingStore(
        lambda: moved_by_other.append(move_chunk(store, other, "done", LogLine, 10))
    )
    ours = RecordArchive(lambda: racing)
    # Our read saw the mark at 0; the other replica moved 1..10 before our write committed.
    assert move_chunk(store, ours, "done", LogLine, 10) == 0
    assert moved_by_other == [10]
    with store.read() as session:
        chunks = session.query(RecordChunk).all()
        assert [(c.first_number, c.last_number) for c in chunks] == [(1, 10)]
        assert session.query(LogLine).filter_by(job_id="done").count() == LINES - 10
        job = session.get(Job, "done")
        assert job is not None and job.archived_line_number == 10
    # Both wrote the same object, byte for byte: nothing points at a different one.
    (key,) = other_blobs.objects
    assert racing.objects[key] == other_blobs.objects[key]


class _UnreachableStore(MemoryBlobStore):
    def put(self, key: str, data: bytes) -> None:
        raise StoreUnreachable("writing to memory://: the endpoint did not answer")


@on_both_databases
def test_a_store_that_refuses_the_write_loses_nothing(tmp_path: Path, database: str) -> None:
    store = make_store(tmp_path, database)
    _ended_job(store, "done", hours_ago=30)
    archive = RecordArchive(_UnreachableStore)
    assert move_chunk(store, archive, "done", LogLine, 10) == 0
    with store.read() as session:
        assert session.query(LogLine).filter_by(job_id="done").count() == LINES
        assert session.query(RecordChunk).count() == 0
        job = session.get(Job, "done")
        assert job is not None and job.archived_line_number == 0


def test_a_chunk_that_does_not_hold_its_numbers_is_refused() -> None:
    rows = [
        LogLine(number=n, time=1.0, learner=1, attempt=1, seq=n, stream="o", text="x")
        for n in (1, 2, 4)
    ]
    ref = ChunkRef(job_id="j", kind="log", first=1, last=3, min_time=1, max_time=1, key="k")
    blobs = MemoryBlobStore()
    blobs.put("k", encode_chunk("log", rows))
    with pytest.raises(Unavailable, match="does not hold the records it should"):
        RecordArchive(lambda: blobs).records(ref, after=0, limit=3)


def test_a_chunk_is_the_same_bytes_whenever_it_is_compressed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = [
        LogLine(number=n, time=1.0, learner=1, attempt=1, seq=n, stream="o", text="x")
        for n in (1, 2, 3)
    ]
    monkeypatch.setattr("time.time", lambda: 1_000_000.0)
    earlier = encode_chunk("log", rows)
    monkeypatch.setattr("time.time", lambda: 2_000_000.0)
    assert encode_chunk("log", rows) == earlier
