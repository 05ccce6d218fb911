"""Many rows in one go on the driver's own statements (``store/bulk.py``), on a real SQLite
file and a real PostgreSQL database: every row reads back through the ORM as it was given
(JSON values, reserved column names, NULLs), more rows than one SQLite statement holds, and
in the session's transaction: rolled back with it, and ahead of its pending changes, which
stay pending. A
PostgreSQL connection lost under a ``COPY`` is the database away, and leaves the pool."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
from sqlalchemy import Table, select, text

from ffdl.core.errors import Unavailable
from ffdl.server.store.bulk import SQLITE_ROWS, insert_rows
from ffdl.server.store.models import Job, LogLine, Metric
from tests.server.factories import make_job, make_store, on_both_databases

LOG_LINES = cast(Table, LogLine.__table__)
METRICS = cast(Table, Metric.__table__)


def _line(number: int) -> dict[str, Any]:
    return {
        "job_id": "training-test",
        "learner": 1,
        "attempt": 1,
        "seq": number,
        "number": number,
        "stream": "stdout",
        "text": f"line {number} with 'quotes', %s and ? in it",
        "time": 1e9 + number / 8,
    }


@on_both_databases
def test_more_rows_than_one_statement_holds_read_back_as_given(
    tmp_path: Path, database: str
) -> None:
    store = make_store(tmp_path, database)
    make_job(store)
    rows = [_line(n) for n in range(1, 2 * SQLITE_ROWS + 8)]
    with store.write() as session:
        insert_rows(session, LOG_LINES, rows)
    with store.read() as session:
        stored = session.scalars(select(LogLine).order_by(LogLine.number)).all()
    assert [(r.seq, r.number, r.stream, r.text, r.time) for r in stored] == [
        (r["seq"], r["number"], r["stream"], r["text"], r["time"]) for r in rows
    ]


@on_both_databases
def test_json_values_reserved_names_and_nulls_read_back_as_given(
    tmp_path: Path, database: str
) -> None:
    store = make_store(tmp_path, database)
    make_job(store)
    rows = [
        {
            "job_id": "training-test",
            "learner": 1,
            "attempt": 1,
            "seq": n,
            "number": n,
            "group": "train" if n % 2 else "test",
            "iteration": None if n == 2 else n * 10,
            "values": {"loss": 1 / n, "accuracy": 0.5 + n / 100},
            "time": 1e9 + n,
        }
        for n in (1, 2, 3)
    ]
    with store.write() as session:
        insert_rows(session, METRICS, rows)
    with store.read() as session:
        stored = session.scalars(select(Metric).order_by(Metric.number)).all()
    assert [(m.group, m.iteration, m.values) for m in stored] == [
        (r["group"], r["iteration"], r["values"]) for r in rows
    ]


@on_both_databases
def test_rows_go_in_at_once_ahead_of_pending_changes_and_roll_back_with_the_transaction(
    tmp_path: Path, database: str
) -> None:
    store = make_store(tmp_path, database)
    make_job(store)
    with pytest.raises(RuntimeError), store.write() as session:
        job = session.get(Job, "training-test")
        assert job is not None
        job.last_line_number = 1
        insert_rows(session, LOG_LINES, [_line(1)])
        # The job's change is still pending (one flush at the end, not one per insert) ...
        assert job in session.dirty
        # ... and the line is in the transaction already.
        assert session.scalars(select(LogLine.text)).all() == [_line(1)["text"]]
        raise RuntimeError("abandoned")
    with store.read() as session:
        assert session.scalars(select(LogLine)).all() == []
        job = session.get(Job, "training-test")
        assert job is not None and job.last_line_number == 0


def test_no_rows_is_nothing(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    with store.write() as session:
        insert_rows(session, LOG_LINES, [])
    with store.read() as session:
        assert session.scalars(select(LogLine)).all() == []


def test_a_connection_lost_under_the_copy_is_an_outage_and_the_next_write_works(
    tmp_path: Path,
) -> None:
    store = make_store(tmp_path, "postgresql")
    make_job(store)
    with pytest.raises(Unavailable), store.write() as session:
        backend = session.execute(text("SELECT pg_backend_pid()")).scalar_one()
        with store.engine.connect() as other:
            other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": backend})
            other.commit()
        insert_rows(session, LOG_LINES, [_line(1)])
    # The broken connection went from the pool: the next write gets a live one.
    with store.write() as session:
        insert_rows(session, LOG_LINES, [_line(2)])
    with store.read() as session:
        assert session.scalars(select(LogLine.seq)).all() == [2]
