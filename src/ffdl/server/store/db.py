"""Engine and sessions. SQLite runs in WAL mode with ``synchronous=FULL``; writes are
serialised by one lock.

Durability: every commit fsyncs the write-ahead log before it returns, so whatever the API
has acknowledged (a submit's 201, a halt) survives a crash of the server, of the operating
system, or a power loss; ``synchronous=NORMAL`` would survive only the first.

Readers never block in WAL mode; writers in one process take ``Store.write()``'s lock so
that concurrent request threads and loops never race for SQLite's single write lock
(which would surface as "database is locked").

Schema changes: ``create_all`` creates missing tables, and ``add_missing_columns`` brings
tables of an older database up to date by adding the nullable columns and the indexes they
lack. That is the whole migration story until a real migration framework is needed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.orm import Session, sessionmaker

from ffdl.server.store.models import Base


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    # FULL fsyncs the WAL at every commit: what the API acknowledged survives a power loss,
    # not only a crash of the server (NORMAL's guarantee). It costs one fsync per write.
    cur.execute("PRAGMA synchronous=FULL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()


def add_missing_columns(engine: Engine) -> list[str]:
    """Add to existing tables the columns and indexes of the models they lack.

    Only nullable columns can be added to a table that may hold rows; a non-nullable one is
    a schema change this step cannot make, and says so. Returns ``table.column`` names added.
    """
    inspector = inspect(engine)
    preparer = engine.dialect.identifier_preparer
    added: list[str] = []
    with engine.begin() as conn:
        for table in Base.metadata.sorted_tables:
            if not inspector.has_table(table.name):
                continue
            present = {column["name"] for column in inspector.get_columns(table.name)}
            missing = [column for column in table.columns if column.name not in present]
            for column in missing:
                if not column.nullable:
                    raise RuntimeError(
                        f"database table {table.name} lacks the non-nullable column "
                        f"{column.name}; it cannot be added automatically"
                    )
                column_type = column.type.compile(dialect=engine.dialect)
                conn.execute(
                    text(
                        f"ALTER TABLE {preparer.format_table(table)} "
                        f"ADD COLUMN {preparer.format_column(column)} {column_type}"
                    )
                )
                added.append(f"{table.name}.{column.name}")
            # Every index, not only those over the columns just added: an index added to
            # the schema later (say a unique one over old columns) must reach old databases.
            for index in table.indexes:
                index.create(conn, checkfirst=True)
    return added


class Store:
    def __init__(self, url: str) -> None:
        self.url = url
        kwargs: dict[str, Any] = {}
        if url.startswith("sqlite"):
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
            kwargs["pool_size"] = 16
            kwargs["max_overflow"] = 16
        self.engine: Engine = create_engine(url, **kwargs)
        if url.startswith("sqlite"):
            event.listen(self.engine, "connect", _sqlite_pragmas)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._write_lock = threading.RLock()

    def create_all(self) -> list[str]:
        """Create missing tables, then add missing columns; the columns added."""
        Base.metadata.create_all(self.engine)
        return add_missing_columns(self.engine)

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self._sessions() as session:
            yield session

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A session whose changes commit together on exit (or roll back on error)."""
        with self._write_lock, self._sessions() as session, session.begin():
            yield session

    def dispose(self) -> None:
        self.engine.dispose()
