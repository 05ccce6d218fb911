"""Writers sharing one SQLite file: a write session holds the file's write lock from its
first statement, so processes that read then write never find their snapshot stale
(``SQLITE_BUSY_SNAPSHOT``); they queue on the lock instead."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest
from sqlalchemy import event, insert, select

from ffdl.server.store.db import Store
from ffdl.server.store.models import LogLine, NodeState
from ffdl.server.store.schema import upgrade
from ffdl.server.store.transitions import utcnow
from tests.server.factories import make_job, make_store

# Each process adds one to a counter, read then written in one write session, many times.
INCREMENTS = """
import sys
from sqlalchemy import select
from ffdl.server.store.db import Store
from ffdl.server.store.models import NodeState

store = Store(sys.argv[1])
for _ in range(int(sys.argv[2])):
    with store.write() as session:
        row = session.scalars(select(NodeState).where(NodeState.name == "counter")).one()
        row.reason = str(int(row.reason) + 1)
store.dispose()
"""


def _store(tmp_path: Path) -> Store:
    store = Store(f"sqlite:///{tmp_path / 'ffdl.db'}")
    upgrade(store)
    with store.write() as session:
        session.add(NodeState(name="counter", reason="0", changed_at=utcnow()))
    return store


def test_a_write_session_holds_the_write_lock_from_its_first_read(tmp_path: Path) -> None:
    store = _store(tmp_path)
    try:
        with closing(sqlite3.connect(tmp_path / "ffdl.db", timeout=0)) as other:
            other.isolation_level = None
            with store.write() as session:
                session.scalars(select(NodeState)).all()  # only read so far
                with pytest.raises(sqlite3.OperationalError, match="locked"):
                    other.execute("BEGIN IMMEDIATE")
            other.execute("BEGIN IMMEDIATE")  # free again once the session committed
            other.execute("ROLLBACK")
            # Read sessions take no lock: writers elsewhere go on.
            with store.read() as session:
                session.scalars(select(NodeState)).all()
                other.execute("BEGIN IMMEDIATE")
                other.execute("ROLLBACK")
    finally:
        store.dispose()


def test_processes_sharing_the_file_lose_no_read_then_write(tmp_path: Path) -> None:
    store = _store(tmp_path)
    processes, rounds = 3, 40
    try:
        workers = [
            subprocess.Popen(
                [sys.executable, "-c", INCREMENTS, store.url, str(rounds)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(processes)
        ]
        outcomes = [worker.communicate(timeout=120) for worker in workers]
        for worker, (_out, err) in zip(workers, outcomes, strict=True):
            assert worker.returncode == 0, err
        with store.read() as session:
            counter = session.get(NodeState, "counter")
            assert counter is not None and counter.reason == str(processes * rounds)
    finally:
        store.dispose()


def test_many_rows_go_to_sqlite_as_multi_row_statements(tmp_path: Path) -> None:
    """One statement per row would make the driver give up and retake the GIL for every
    row, which a busy server's other threads turn into a wait per row."""
    store = make_store(tmp_path)
    job_id = make_job(store)
    statements: list[str] = []

    def record(
        _conn: object, _cursor: object, sql: str, _params: object, _ctx: object, executemany: bool
    ) -> None:
        if sql.startswith("INSERT INTO log_lines"):
            statements.append(sql)

    event.listen(store.engine, "before_cursor_execute", record)
    rows = [
        {
            "job_id": job_id,
            "learner": 1,
            "attempt": 1,
            "seq": n,
            "number": n,
            "stream": "stdout",
            "text": f"line {n}",
            "time": 1.7e9 + n,
        }
        for n in range(1, 2501)
    ]
    with store.write() as session:
        session.execute(insert(LogLine.__table__), rows)
    with store.read() as session:
        stored = session.scalars(select(LogLine.text).order_by(LogLine.number)).all()
    assert stored == [f"line {n}" for n in range(1, 2501)]
    assert [sql.count("(?, ?, ?, ?, ?, ?, ?, ?)") for sql in statements] == [1000, 1000, 500]
