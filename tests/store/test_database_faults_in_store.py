"""How the store answers a database that is away or full: real servers and files.

A server that refuses connections is away (503, logged once, without its password); an
error of the statement itself is not a fault; a SQLite write that finds no room is a 507
and leaves nothing of its transaction; URLs naming several servers are shown whole.
"""

from __future__ import annotations

import logging
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import PendingRollbackError, ProgrammingError

from ffdl.core.errors import InsufficientStorage, Unavailable
from ffdl.server.store.availability import fault_of
from ffdl.server.store.db import Store, server_address
from tests.postgres import PostgresServer, free_port


def test_a_server_that_refuses_is_away_once_named_and_never_with_its_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = free_port()
    store = Store(f"postgresql+psycopg://ffdl:s3cret-pass@127.0.0.1:{port}/ffdl")
    caplog.set_level(logging.WARNING, logger="ffdl.store")
    try:
        for _ in range(3):
            with pytest.raises(Unavailable) as away, store.read() as session:
                session.execute(text("SELECT 1"))
        with pytest.raises(Unavailable), store.write() as session:
            session.execute(text("SELECT 1"))
    finally:
        store.dispose()
    error = away.value
    assert (error.http_status, error.code, error.headers) == (503, "S503", {"Retry-After": "2"})
    assert error.message.startswith(
        f"the platform's database is unreachable (127.0.0.1:{port}: connection failed"
    )
    assert "s3cret-pass" not in error.message
    outage = store.availability.outage()
    assert outage is not None and "Connection refused" in outage[0]
    warnings = [r.getMessage() for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(warnings) == 1, "one line per outage, not one per failed session"
    assert store.availability.returned_at is None


def test_a_url_naming_several_servers_says_why_each_failed() -> None:
    first, second = free_port(), free_port()
    store = Store(
        f"postgresql+psycopg://ffdl:pw@/ffdl?host=127.0.0.1:{first}&host=127.0.0.1:{second}"
        "&target_session_attrs=read-write"
    )
    try:
        with pytest.raises(Unavailable) as away, store.read() as session:
            session.execute(text("SELECT 1"))
    finally:
        store.dispose()
    assert away.value.message == (
        f"the platform's database is unreachable (127.0.0.1:{first},127.0.0.1:{second}: "
        f"127.0.0.1:{first}: Connection refused; 127.0.0.1:{second}: Connection refused); retry"
    )


def test_a_statement_error_is_not_a_database_fault(postgres: PostgresServer) -> None:
    store = Store(postgres.create_database())
    try:
        with pytest.raises(ProgrammingError), store.read() as session:
            session.execute(text("SELECT * FROM no_such_table"))
        assert store.availability.outage() is None
    finally:
        store.dispose()


def test_a_sqlite_write_without_room_is_507_and_leaves_nothing(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'ffdl.db'}")
    try:
        with store.write() as session:
            session.execute(text("CREATE TABLE blobs (body BLOB)"))
            session.execute(text("INSERT INTO blobs VALUES (x'00')"))
        with pytest.raises(InsufficientStorage) as full, store.write() as session:
            # The file may grow by a few pages only: SQLite's own "disk is full".
            pages = session.execute(text("PRAGMA page_count")).scalar_one()
            session.execute(text(f"PRAGMA max_page_count = {pages + 4}"))
            session.execute(text("INSERT INTO blobs VALUES (x'01')"))
            session.execute(text("INSERT INTO blobs VALUES (zeroblob(1048576))"))
        assert (full.value.http_status, full.value.code) == (507, "S507")
        assert "the platform's disk is full" in full.value.message
        assert "nothing was stored" in full.value.message
        with store.read() as session:
            assert session.execute(text("SELECT count(*) FROM blobs")).scalar_one() == 1
    finally:
        store.dispose()


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql+psycopg://u:p@db:6543/ffdl", "db:6543"),
        ("postgresql+psycopg://u:p@db/ffdl", "db:5432"),
        (
            "postgresql+psycopg://u:p@/ffdl?host=a:5432&host=b:5433&target_session_attrs=read-write",
            "a:5432,b:5433",
        ),
        ("postgresql+psycopg://u:p@/ffdl?host=a,b&port=5432,5433", "a:5432,b:5433"),
        ("postgresql+psycopg://u:p@/ffdl?host=a,b", "a:5432,b:5432"),
    ],
)
def test_a_url_naming_several_servers_is_shown_with_each(url: str, shown: str) -> None:
    assert server_address(url) == shown


def _raised_while_handling(cause: BaseException, error: BaseException) -> BaseException:
    """``error`` raised while ``cause`` was being handled, as SQLAlchemy does when a commit
    fails under it: Python records ``cause`` as its context."""
    try:
        try:
            raise cause
        except type(cause):
            raise error from None
    except BaseException as raised:  # the test inspects it
        raised.__context__ = cause
        return raised


def test_a_commit_cut_off_by_the_server_going_away_is_a_fault_not_a_500() -> None:
    """The server killed during a commit: SQLAlchemy, handling the driver's error, raises
    PendingRollbackError with that error (unwrapped) as its context."""
    dropped = psycopg.OperationalError("consuming input failed: server closed the connection")
    pending = _raised_while_handling(dropped, PendingRollbackError("Can't reconnect until..."))
    assert fault_of(pending, "postgresql") == "away"
    assert fault_of(dropped, "postgresql") == "away"
    # A pending rollback after the statement's own error stays the caller's error.
    wrong = psycopg.errors.UndefinedTable("relation x does not exist")
    assert (
        fault_of(_raised_while_handling(wrong, PendingRollbackError("...")), "postgresql") is None
    )
    assert fault_of(PendingRollbackError("no context"), "postgresql") is None


def test_a_connection_checked_before_an_outage_does_not_end_it(postgres: PostgresServer) -> None:
    """A read that began before another thread met the database away, and only then got
    its (pre-pinged) connection, is no evidence that the database is back: one outage is
    not counted as two."""
    store = Store(postgres.create_database())
    try:
        with store.read() as early:
            store.availability.went_away("terminating connection due to administrator command")
            early.execute(text("SELECT 1"))  # its connection is checked out only now
            assert store.availability.outage() is not None, "ended by stale evidence"
        with store.read() as later:
            later.execute(text("SELECT 1"))
        assert store.availability.outage() is None
        assert store.availability.returned_at is not None
    finally:
        store.dispose()
