"""FfDL's paging of log lines and metrics (``pagesize``, ``pos``, ``since_time``) and its
record shapes, on a real store (SQLite and PostgreSQL), with none, some or all of the lines
moved to the archive (retention): every page must read the same either way."""

from __future__ import annotations

import pytest

from ffdl.core.errors import BadRequest
from ffdl.server.archive import RecordArchive
from ffdl.server.services import logs
from ffdl.server.services.record_archive import move_chunk
from ffdl.server.store.db import Store
from ffdl.server.store.models import Job, LogLine, Metric
from ffdl.storage.blobs import MemoryBlobStore
from tests.server.factories import DATABASES, make_job, make_store

LINES = 25
# Lines moved to the archive before the tests read: (chunk size, chunks).
ARCHIVED = {"none": (1, 0), "12 in 3 chunks": (4, 3), "all in 3 chunks": (10, 3)}
ARCHIVE = RecordArchive(MemoryBlobStore)


@pytest.fixture(
    scope="module",
    params=[(db, archived) for db in DATABASES for archived in ARCHIVED],
    ids=lambda param: "-".join(param),
)
def store(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Store:
    database, archived = request.param
    store = make_store(tmp_path_factory.mktemp("paging"), database)
    make_job(store, "training-paged", last_line_number=LINES, last_metric_number=1)
    with store.write() as session:
        for i in range(LINES):
            session.add(
                LogLine(
                    job_id="training-paged",
                    learner=1,
                    attempt=1,
                    seq=i + 1,
                    number=i + 1,
                    stream="stdout",
                    text=f"line {i}",
                    time=1_700_000_000.0 + i,
                )
            )
        session.add(
            Metric(
                job_id="training-paged",
                learner=1,
                attempt=1,
                seq=1,
                number=1,
                group="test",
                iteration=7,
                values={"acc": 0.5, "note": "best", "typed": {"type": "INT", "value": "3"}},
                time=1_700_000_000.25,
            )
        )
    chunk, chunks = ARCHIVED[archived]
    for _ in range(chunks):
        assert move_chunk(store, ARCHIVE, "training-paged", LogLine, chunk) > 0
    # The newest metrics record stays in the database.
    assert move_chunk(store, ARCHIVE, "training-paged", Metric, chunk) == 0
    with store.read() as session:
        stored = session.query(LogLine).count()
    assert stored == LINES - min(chunk * chunks, LINES)
    return store


def page(store: Store, **query: object) -> list[str]:
    arguments: dict[str, object] = {"since_time": None, "pagesize": None, "pos": None, **query}
    with store.read() as session:
        job = session.get(Job, "training-paged")
        assert job is not None
    items = logs.loglines(store, ARCHIVE, job, **arguments)  # type: ignore[arg-type]
    return [item["line"] for item in items]


def lines(first: int, end: int) -> list[str]:
    return [f"line {i}" for i in range(first, end)]


def test_default_page_is_ffdls_ten(store: Store) -> None:
    assert page(store) == lines(0, 10)


def test_positive_pos_skips_from_the_start(store: Store) -> None:
    assert page(store, pos=5, pagesize=3) == lines(5, 8)
    assert page(store, pos=LINES + 5) == []


def test_negative_pos_ends_the_page_that_far_from_the_end(store: Store) -> None:
    assert page(store, pos=-1, pagesize=4) == lines(LINES - 4, LINES)
    assert page(store, pos=-3, pagesize=4) == lines(LINES - 6, LINES - 2)
    assert page(store, pos=-20, pagesize=10) == lines(0, 6)
    assert page(store, pos=-(LINES + 1)) == []
    assert page(store, pos=-(2**63 - 1)) == []


def test_negative_since_time_counts_records_back(store: Store) -> None:
    assert page(store, since_time="-5") == lines(LINES - 5, LINES)
    assert page(store, since_time="-5", pagesize=2) == lines(LINES - 5, LINES - 3)
    assert page(store, since_time=f"-{LINES * 4}", pagesize=3) == lines(0, 3)


def test_since_time_in_milliseconds_or_iso(store: Store) -> None:
    assert page(store, since_time=str(1_700_000_000_000 + 20_000)) == lines(20, LINES)
    assert page(store, since_time="2023-11-14T22:13:40Z") == lines(20, LINES)
    assert page(store, since_time="") == lines(0, 10)
    since = str(1_700_000_000_000 + 20_000)
    assert page(store, since_time=since, pos=2, pagesize=2) == lines(22, 24)
    assert page(store, since_time=since, pos=-2, pagesize=2) == lines(22, 24)


@pytest.mark.parametrize("value", ["-1.5", "-1e3", "-" + "9" * 20, "soon", "nan", "9" * 70])
def test_unusable_since_time_is_a_400_naming_it(store: Store, value: str) -> None:
    with pytest.raises(BadRequest) as refused:
        page(store, since_time=value)
    assert refused.value.detail == {"field": "since_time"}
    assert "since_time" in refused.value.message


def test_metric_record_has_ffdls_typed_values_and_metric_data(store: Store) -> None:
    with store.read() as session:
        job = session.get(Job, "training-paged")
        assert job is not None
        row = session.query(Metric).one()
        data = logs.metric_data(row)
    (record,) = logs.emetrics(store, ARCHIVE, job, since_time=None, pagesize=None, pos=None)
    assert record["meta"] == {
        "training_id": "training-paged",
        "user_id": "u1",
        "time": 1_700_000_000_250,
        "rindex": 1,
        "learner": 1,
    }
    assert record["values"] == {
        "acc": {"type": "FLOAT", "value": "0.5"},
        "note": {"type": "STRING", "value": "best"},
        "typed": {"type": "INT", "value": "3"},
    }
    assert record["etimes"]["iteration"] == {"type": "INT", "value": "7"}
    assert data == {
        "type": "test",
        "timestamp": "2023-11-14T22:13:20.250Z",
        "iteration": 7,
        "Values": {"acc": 0.5, "note": "best", "typed": 3},
    }


def test_first_row_of_a_follow(store: Store) -> None:
    def first_row(since: logs.Since) -> int:
        return logs.first_row_at(store, ARCHIVE, LogLine, "training-paged", since)

    assert first_row(logs.Since(back=3)) == LINES - 3
    assert first_row(logs.Since()) == 0
    assert first_row(logs.Since(time=1_700_000_000.0 + 10)) == 10
    assert first_row(logs.Since(time=1_700_000_000.0 + 3)) == 3
    assert first_row(logs.Since(time=1_800_000_000.0)) == LINES
