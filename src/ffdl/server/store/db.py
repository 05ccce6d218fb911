"""Engine and sessions over SQLite (the embedded default) or PostgreSQL (psycopg 3).

Durability: on SQLite every commit fsyncs the write-ahead log before it returns
(WAL mode, ``synchronous=FULL``), so whatever the API has acknowledged (a submit's 201, a
halt) survives a crash of the server, of the operating system, or a power loss;
``synchronous=NORMAL`` would survive only the first. On PostgreSQL a commit is as durable as
the server's own settings make it (``fsync`` and ``synchronous_commit`` on, its defaults).

Concurrency on SQLite: readers never block in WAL mode. A write session (``Store.write()``)
starts with ``BEGIN IMMEDIATE``, taking the file's write lock before its first read, so a
transaction that reads then writes can never find, at its first write, that another process
committed since its read (``SQLITE_BUSY_SNAPSHOT``, which no retry of the statement cures):
several processes may share one file (an API worker pool, replicas on one host), each
waiting up to ``busy_timeout`` for the lock. Within one process, writers also queue on a
lock of their own so that request threads and loops wait in order instead of polling
SQLite's lock. SQLAlchemy emits every ``BEGIN`` itself (pysqlite's own transaction
handling is off), so read sessions are real transactions too (a consistent snapshot).

Concurrency on PostgreSQL: sessions are ``READ COMMITTED`` transactions; writers never wait
on a process-wide lock, and the rows whose change must be exclusive (a job's status, a
lease) are locked with ``SELECT ... FOR UPDATE`` where they change (``transitions.py``,
``leases.py``). The pool checks a connection before handing it out (``pool_pre_ping``), so
a restarted server costs no failed request once it is back. A URL may name several servers
(``?host=HOST1:PORT1&host=HOST2:PORT2&target_session_attrs=read-write``, libpq's multi-host
form): each connection goes to the first that accepts writes, so after a failover the pool
reconnects to the promoted standby.

Faults: a session that meets the database away (or its disk full) raises ``DatabaseAway``
(503) or ``DatabaseFull`` (507) instead of the driver's error, and the store's
:class:`~ffdl.server.store.availability.Availability` records the outage and its end
(``availability.py``).

The schema is created and upgraded by ``schema.upgrade`` (Alembic migrations), never here.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from ffdl.server.store.availability import (
    Availability,
    DatabaseAway,
    DatabaseFull,
    fault_of,
    first_line,
)

# The execution option that makes a SQLite transaction begin with ``BEGIN IMMEDIATE``.
SQLITE_BEGIN = "ffdl_sqlite_begin"
IMMEDIATE = {SQLITE_BEGIN: "IMMEDIATE"}

# Per process: 5 connections kept, 20 more under load. Keep replicas x API workers x 25
# under PostgreSQL's max_connections (100 by default) or put a pooler (PgBouncer) between.
PG_POOL_SIZE = 5
PG_MAX_OVERFLOW = 20
PG_CONNECT_TIMEOUT_S = 10
# A transaction left open this long by its process is ended by the server. A replica frozen
# (SIGSTOP, a long pause) inside a transaction otherwise keeps its row locks for as long as
# it is frozen, a loop's lease row among them, and no other replica can take that loop.
# Work inside a transaction never waits on anything but the database, so nothing else
# comes near this.
PG_IDLE_IN_TRANSACTION_S = 10
# As long as SQLite's own busy timeout (``PRAGMA busy_timeout``).
WAL_SWITCH_TIMEOUT_S = 30.0


class StoreUnavailable(RuntimeError):
    """The store cannot be used: its driver is missing, its server unreachable, or its
    schema newer than this ffdl. Raised at start; the message says what to do."""


class DatabaseDriverMissing(StoreUnavailable):
    """A PostgreSQL URL, and psycopg (``pip install 'ffdl[postgres]'``) is not installed."""


class DatabaseUnreachable(StoreUnavailable):
    """The database server refused the connection, or could not be reached."""


def is_postgresql(url: str | URL) -> bool:
    return make_url(url).get_backend_name() == "postgresql"


def is_sqlite(url: str | URL) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def safe_url(url: str | URL) -> str:
    """``url`` without its password, for messages and logs."""
    return make_url(url).render_as_string(hide_password=True)


def server_address(url: str | URL) -> str:
    """``HOST:PORT`` of a server URL (PostgreSQL's defaults filled in); for a URL naming
    several servers, each of them, comma-separated."""
    parsed = make_url(url)
    default_port = 5432 if parsed.get_backend_name() == "postgresql" else None
    if parsed.host:
        single = parsed.port or default_port
        return f"{parsed.host}:{single}" if single else parsed.host
    hosts = _listed(parsed.query.get("host")) or ["localhost"]
    ports = _listed(parsed.query.get("port"))
    addresses = []
    for n, listed in enumerate(hosts):
        host, _, inline_port = listed.partition(":")
        port = inline_port or (ports[n] if n < len(ports) else "") or default_port
        addresses.append(f"{host}:{port}" if port else host)
    return ",".join(addresses)


def _listed(value: str | tuple[str, ...] | None) -> list[str]:
    """A query parameter given once with commas (``host=a,b``) or repeated (``host=a&host=b``)."""
    if value is None:
        return []
    parts = [value] if isinstance(value, str) else list(value)
    return [item for part in parts for item in part.split(",") if item]


def _switch_to_wal(cur: Any) -> None:
    """Put the file in WAL mode. On a new file that several processes open at once, one
    may be mid-transaction in the old journal mode: the switch then fails at once with
    "database is locked" (SQLite's busy handler is not called, to avoid a deadlock), so it
    is tried again while that transaction lasts."""
    deadline = time.monotonic() + WAL_SWITCH_TIMEOUT_S
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _sqlite_connect(dbapi_conn: Any, _record: Any) -> None:
    # SQLAlchemy emits BEGIN itself (``_sqlite_begin``); pysqlite's own handling would
    # begin only at the first write, too late to take the write lock before reading.
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA busy_timeout=30000")
    _switch_to_wal(cur)
    # FULL fsyncs the WAL at every commit: what the API acknowledged survives a power loss,
    # not only a crash of the server (NORMAL's guarantee). It costs one fsync per write.
    cur.execute("PRAGMA synchronous=FULL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def _sqlite_begin(conn: Connection) -> None:
    mode = conn.get_execution_options().get(SQLITE_BEGIN, "DEFERRED")
    conn.exec_driver_sql(f"BEGIN {mode}")


def _postgres_engine(url: URL) -> Engine:
    connect_args: dict[str, Any] = {}
    if "connect_timeout" not in url.query:
        connect_args["connect_timeout"] = PG_CONNECT_TIMEOUT_S
    if "application_name" not in url.query:
        connect_args["application_name"] = "ffdl"
    if "options" not in url.query:
        idle_ms = PG_IDLE_IN_TRANSACTION_S * 1000
        connect_args["options"] = f"-c idle_in_transaction_session_timeout={idle_ms}"
    try:
        return create_engine(
            url,
            pool_size=PG_POOL_SIZE,
            max_overflow=PG_MAX_OVERFLOW,
            pool_pre_ping=True,
            # Connections older than this are replaced, before a firewall or a proxy
            # drops them silently.
            pool_recycle=1800,
            connect_args=connect_args,
        )
    except ImportError as exc:
        raise DatabaseDriverMissing(
            f"the database URL {safe_url(url)} needs the PostgreSQL driver psycopg 3, which "
            f"is not installed ({exc}): pip install 'ffdl[postgres]'"
        ) from None


class Store:
    def __init__(self, url: str) -> None:
        self.url = url
        parsed = make_url(url)
        self.dialect = parsed.get_backend_name()
        self.engine: Engine
        write_bind: Engine
        if self.dialect == "sqlite":
            self.engine = create_engine(
                parsed,
                connect_args={"check_same_thread": False, "timeout": 30},
                pool_size=16,
                max_overflow=16,
            )
            event.listen(self.engine, "connect", _sqlite_connect)
            event.listen(self.engine, "begin", _sqlite_begin)
            write_bind = self.engine.execution_options(**IMMEDIATE)
        elif self.dialect == "postgresql":
            self.engine = _postgres_engine(parsed)
            write_bind = self.engine
        else:
            raise ValueError(
                f"unsupported database URL {safe_url(url)}: use sqlite:///PATH or "
                "postgresql+psycopg://USER:PASSWORD@HOST:PORT/DATABASE"
            )
        # On SQLite an INSERT of many rows goes out as multi-row statements (of up to
        # 1,000 rows) rather than one statement per row. With one per row the driver lets
        # go of the GIL and takes it back for every row, and while any other thread of the
        # process computes, each take waits for a switch interval (benchmarks/
        # bench_sqlite_inserts.py). psycopg already sends a pipeline of rows, and parses a
        # long multi-row statement anew each time (half the rate there), so it keeps its own.
        if self.dialect == "sqlite":
            self.engine.dialect.use_insertmanyvalues_wo_returning = True
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._write_sessions = sessionmaker(write_bind, expire_on_commit=False)
        self._write_lock = threading.RLock()
        self.availability = Availability(self.address)
        # When this thread's current read or write began (monotonic), for the check below.
        self._work = threading.local()
        # A connection handed out has just been checked (``pool_pre_ping``): the database
        # is there, unless that check came before an outage another thread has since met.
        event.listen(
            self.engine,
            "checkout",
            lambda *_: self.availability.reached(getattr(self._work, "began", None)),
        )

    @property
    def path(self) -> Path | None:
        """A SQLite database's file (None on a server, or in memory)."""
        database = make_url(self.url).database
        if self.dialect != "sqlite" or not database or database == ":memory:":
            return None
        return Path(database)

    @property
    def address(self) -> str:
        """Where the database is, without a password: a file path or ``HOST:PORT``."""
        if self.dialect == "sqlite":
            return make_url(self.url).database or ":memory:"
        return server_address(self.url)

    def check_reachable(self) -> None:
        """Connect once; raise ``DatabaseUnreachable`` naming the server if that fails."""
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except OperationalError as exc:
            raise DatabaseUnreachable(self.unreachable_message(exc)) from None

    def unreachable_message(self, exc: BaseException) -> str:
        detail = self._without_password(first_line(exc))
        if self.dialect == "sqlite":
            return f"cannot open the database at {self.address}: {detail}"
        return f"database unreachable at {self.address}: {detail}"

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self._faults(), self._sessions() as session:
            yield session

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A session whose changes commit together on exit (or roll back on error).

        On SQLite its transaction holds the file's write lock from its start.
        """
        queue: AbstractContextManager[Any] = (
            self._write_lock if self.dialect == "sqlite" else nullcontext()
        )
        with self._faults(), queue, self._write_sessions() as session, session.begin():
            yield session

    @contextmanager
    def _faults(self) -> Iterator[None]:
        """Turn a database that is away, or a full disk, into the API's answers for them."""
        outer = getattr(self._work, "began", None)
        self._work.began = time.monotonic() if outer is None else outer
        try:
            yield
        except (SQLAlchemyError, OSError) as exc:
            fault = fault_of(exc, self.dialect)
            if fault is None:
                raise
            detail = self._without_password(first_line(exc))
            if fault == "away":
                self.availability.went_away(detail)
                raise DatabaseAway(self.address, detail) from exc
            where = getattr(exc, "filename", None) or self.address
            raise DatabaseFull(str(where), detail) from exc
        finally:
            self._work.began = outer

    def _without_password(self, text: str) -> str:
        password = make_url(self.url).password
        return text.replace(str(password), "***") if password else text

    def dispose(self) -> None:
        self.engine.dispose()
