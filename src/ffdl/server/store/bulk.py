"""Inserting many rows into one table in one go: report items, by the thousand a second.

On SQLite the rows go out on the driver's own multi-row ``INSERT ... VALUES (...), (...)``
statements of up to ``SQLITE_ROWS`` rows: a Core insert of many rows builds each row's
parameters through the statement compiler, which was most of a stored log line's cost on
the server, and one statement per row would let the driver give up the GIL and take it
back for every row (``benchmarks/bench_sqlite_inserts.py``). Each row becomes a tuple in
the column order of the first row, through the column type's own bind conversion where it
has one (JSON columns).

On PostgreSQL the rows go in as a Core insert, which psycopg sends as a pipeline (a long
multi-row statement would be parsed anew each time, and psycopg adapts JSON values
itself).

Either runs in the session's transaction, after the session's pending changes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter
from typing import Any

from sqlalchemy import Table, insert
from sqlalchemy.orm import Session

# 1,000 rows of up to 32 columns stay under SQLite's limit of 32,766 parameters.
SQLITE_ROWS = 1000


def insert_rows(session: Session, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert ``rows`` (each mapping every column it sets; the others take their server
    default) into ``table`` in the session's transaction."""
    if not rows:
        return
    session.flush()
    connection = session.connection()
    dialect = connection.dialect
    if dialect.name != "sqlite":
        session.execute(insert(table), list(rows))
        return
    names = list(rows[0])
    values_of = itemgetter(*names)
    tuples: list[tuple[Any, ...]] = [
        values if len(names) > 1 else (values,) for values in map(values_of, rows)
    ]
    converters: list[tuple[int, Callable[[Any], Any]]] = [
        (index, convert)
        for index, name in enumerate(names)
        if (convert := table.c[name].type.bind_processor(dialect)) is not None
    ]
    if converters:
        tuples = [_converted(row, converters) for row in tuples]
    quote = dialect.identifier_preparer.quote
    columns = ", ".join(quote(name) for name in names)
    one_row = "(" + ", ".join(["?"] * len(names)) + ")"
    head = f"INSERT INTO {dialect.identifier_preparer.format_table(table)} ({columns}) VALUES "
    for start in range(0, len(tuples), SQLITE_ROWS):
        chunk = tuples[start : start + SQLITE_ROWS]
        flat = tuple(value for row in chunk for value in row)
        connection.exec_driver_sql(head + ", ".join([one_row] * len(chunk)), flat)


def _converted(
    row: tuple[Any, ...], converters: Sequence[tuple[int, Callable[[Any], Any]]]
) -> tuple[Any, ...]:
    values = list(row)
    for index, convert in converters:
        values[index] = convert(values[index])
    return tuple(values)
