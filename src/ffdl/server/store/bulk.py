"""Inserting many rows into one table in one go: report items, by the thousand a second.

A Core insert of many rows builds each row's parameters through the statement compiler in
Python, which was most of a stored log line's cost on the server (about 45 µs a row on
PostgreSQL). Here each row becomes a tuple in the column order of the first row, and the
rows go to the driver itself:

- on SQLite, as multi-row ``INSERT ... VALUES (...), (...)`` statements of up to
  ``SQLITE_ROWS`` rows, each value through its column type's own bind conversion where it
  has one (JSON columns). One statement per row would let the driver give up the GIL and
  take it back for every row (``benchmarks/bench_sqlite_inserts.py``).
- on PostgreSQL, as one ``COPY ... FROM STDIN``, JSON values as their text (psycopg writes
  the rows in C: about 8 µs a row). Its errors are wrapped as SQLAlchemy wraps those of
  its own statements, and a connection the copy found broken is invalidated, so that the
  pool drops it and the store answers the outage as any other.

Either runs in the session's transaction as soon as it is called, ahead of the session's
pending changes, which are not flushed first: a report's updates of its job and learner
rows then go out in one flush at its end, not one before each insert (each flush is a
round trip and most of a small report's cost). Rows inserted here must not depend on
objects still pending in the session.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter
from typing import Any

from sqlalchemy import JSON, Connection, Table
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

# 1,000 rows of up to 32 columns stay under SQLite's limit of 32,766 parameters.
SQLITE_ROWS = 1000

Converters = Sequence[tuple[int, Callable[[Any], Any]]]


def insert_rows(session: Session, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert ``rows`` (each mapping the same columns; the others take their defaults in
    the database) into ``table`` in the session's transaction, now (see the module)."""
    if not rows:
        return
    connection = session.connection()
    names = list(rows[0])
    values_of = itemgetter(*names)
    tuples: list[tuple[Any, ...]] = [
        values if len(names) > 1 else (values,) for values in map(values_of, rows)
    ]
    if connection.dialect.name == "postgresql":
        _copy(connection, table, names, tuples)
    else:
        _multi_row_inserts(connection, table, names, tuples)


def _multi_row_inserts(
    connection: Connection, table: Table, names: list[str], rows: list[tuple[Any, ...]]
) -> None:
    dialect = connection.dialect
    converters: list[tuple[int, Callable[[Any], Any]]] = [
        (index, convert)
        for index, name in enumerate(names)
        if (convert := table.c[name].type.bind_processor(dialect)) is not None
    ]
    if converters:
        rows = [_converted(row, converters) for row in rows]
    one_row = "(" + ", ".join(["?"] * len(names)) + ")"
    head = f"INSERT INTO {_target(connection, table, names)} VALUES "
    for start in range(0, len(rows), SQLITE_ROWS):
        chunk = rows[start : start + SQLITE_ROWS]
        flat = tuple(value for row in chunk for value in row)
        connection.exec_driver_sql(head + ", ".join([one_row] * len(chunk)), flat)


def _copy(
    connection: Connection, table: Table, names: list[str], rows: list[tuple[Any, ...]]
) -> None:
    converters = [
        (index, _json_text)
        for index, name in enumerate(names)
        if isinstance(table.c[name].type, JSON)
    ]
    if converters:
        rows = [_converted(row, converters) for row in rows]
    driver = connection.connection.driver_connection
    assert driver is not None
    statement = f"COPY {_target(connection, table, names)} FROM STDIN"
    try:
        with driver.cursor() as cursor, cursor.copy(statement) as copy:
            for row in rows:
                copy.write_row(row)
    except connection.dialect.loaded_dbapi.Error as exc:
        # Answered as SQLAlchemy answers its own statements' errors: wrapped, and with a
        # connection found broken dropped from the pool.
        broken = bool(driver.broken or driver.closed)
        if broken:
            connection.invalidate(exc)
        raise DBAPIError.instance(
            statement,
            None,
            exc,
            connection.dialect.loaded_dbapi.Error,
            connection_invalidated=broken,
            dialect=connection.dialect,
        ) from exc


def _target(connection: Connection, table: Table, names: list[str]) -> str:
    preparer = connection.dialect.identifier_preparer
    columns = ", ".join(preparer.quote(name) for name in names)
    return f"{preparer.format_table(table)} ({columns})"


def _json_text(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


def _converted(row: tuple[Any, ...], converters: Converters) -> tuple[Any, ...]:
    values = list(row)
    for index, convert in converters:
        values[index] = convert(values[index])
    return tuple(values)
