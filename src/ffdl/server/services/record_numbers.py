"""Each job numbers its own log lines and metrics 1, 2, 3, ... (FfDL's ``rindex``).

The numbers come from counters on the job's row (``Job.last_line_number``,
``Job.last_metric_number``), taken by whoever stores a job's records while holding that
row's lock (``SELECT ... FOR UPDATE`` on PostgreSQL; SQLite has one writer). So a job's
numbers have no gaps and no repeats whichever replica stores them, and they are committed
in increasing order: a follower that has read up to number N never later finds a smaller
one committed behind it.
"""

from __future__ import annotations

from typing import Any

from ffdl.server.store.models import Job


def number_lines(job: Job, rows: list[dict[str, Any]]) -> None:
    """Give ``rows`` (log lines about to be inserted, in order) the job's next numbers."""
    job.last_line_number = numbered(rows, job.last_line_number)


def number_metrics(job: Job, rows: list[dict[str, Any]]) -> None:
    """Give ``rows`` (metrics about to be inserted, in order) the job's next numbers."""
    job.last_metric_number = numbered(rows, job.last_metric_number)


def numbered(rows: list[dict[str, Any]], last: int) -> int:
    """Number ``rows`` on from ``last`` (the job's counter, read under its row lock); the
    new last number, for the caller to store on the job's row."""
    for row in rows:
        last += 1
        row["number"] = last
    return last
