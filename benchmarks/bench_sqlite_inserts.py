"""Why the store sends many-row inserts to SQLite as multi-row statements.

A report's log lines are inserted together. Sent as one ``executemany``, SQLite runs one
statement per row, and Python's sqlite3 module gives up the GIL around each one and takes
it back afterwards; while another thread of the process computes (a replica's loops and
other requests do), every take-back waits for a switch interval. Sent as statements of
many rows (``INSERT ... VALUES (...), (...), ...``), the GIL changes hands once per
statement. This prints the rows per second of both, alone and beside ``--busy`` threads
that only compute, into a table shaped like ``log_lines`` (two unique indexes) in a WAL
file with ``synchronous=FULL``, as the store opens it.

    python benchmarks/bench_sqlite_inserts.py [--rows 1000] [--batches 30] [--busy 1]
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import threading
import time
from pathlib import Path

COLUMNS = "job, learner, attempt, seq, number, stream, text, time"
ROW_MARKS = "(?, ?, ?, ?, ?, ?, ?, ?)"
MULTI_ROW_CHUNK = 1000


def _open(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute(
        "CREATE TABLE lines (id INTEGER PRIMARY KEY, job TEXT, learner INT, attempt INT, "
        "seq INT, number INT, stream TEXT, text TEXT, time REAL)"
    )
    db.execute("CREATE UNIQUE INDEX lines_number ON lines (job, number)")
    db.execute("CREATE UNIQUE INDEX lines_seq ON lines (job, learner, attempt, seq)")
    return db


def _insert(db: sqlite3.Connection, rows: list[tuple[object, ...]], multi_row: bool) -> None:
    db.execute("BEGIN IMMEDIATE")
    if multi_row:
        for start in range(0, len(rows), MULTI_ROW_CHUNK):
            chunk = rows[start : start + MULTI_ROW_CHUNK]
            marks = ", ".join([ROW_MARKS] * len(chunk))
            db.execute(
                f"INSERT INTO lines ({COLUMNS}) VALUES {marks}",
                [value for row in chunk for value in row],
            )
    else:
        db.executemany(f"INSERT INTO lines ({COLUMNS}) VALUES {ROW_MARKS}", rows)
    db.execute("COMMIT")


def rows_per_second(rows: int, batches: int, busy: int, multi_row: bool) -> float:
    stop = threading.Event()

    def compute() -> None:
        count = 0
        while not stop.is_set():
            count += 1

    threads = [threading.Thread(target=compute) for _ in range(busy)]
    with tempfile.TemporaryDirectory() as tmp:
        db = _open(Path(tmp) / "lines.db")
        for thread in threads:
            thread.start()
        try:
            started = time.perf_counter()
            for batch in range(batches):
                first = batch * rows
                _insert(
                    db,
                    [
                        (f"job-{batch % 7}", 1, 1, n, n, "stdout", f"line {n}", time.time())
                        for n in range(first, first + rows)
                    ],
                    multi_row,
                )
            elapsed = time.perf_counter() - started
        finally:
            stop.set()
            for thread in threads:
                thread.join()
            db.close()
    return rows * batches / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1000, help="rows per insert")
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--busy", type=int, default=1, help="threads that only compute")
    args = parser.parse_args()
    print(f"{args.batches} inserts of {args.rows} rows each, rows/s")
    print(f"{'':24}{'alone':>14}{f'beside {args.busy} busy':>18}")
    alone: dict[bool, float] = {}
    for multi_row, label in ((False, "executemany"), (True, "multi-row statements")):
        alone[multi_row] = rows_per_second(args.rows, args.batches, 0, multi_row)
        beside = rows_per_second(args.rows, args.batches, args.busy, multi_row)
        print(f"{label:24}{alone[multi_row]:>14,.0f}{beside:>18,.0f}")


if __name__ == "__main__":
    main()
