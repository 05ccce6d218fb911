"""What one learner report costs the server to store, on SQLite and on PostgreSQL.

A learner posts a small report about once a second (a couple of log lines, now and then a
metric); at fleet scale those posts are most of what the replicas do (docs/scale.md). This
stores ``--reports`` such batches of ``--jobs`` running jobs through the real service
(``ingest_reports``: group commit, the job's row lock, the numbering, the inserts) of a
real platform, from ``--threads`` threads at once, and prints per report: the statements
sent to the database (savepoints, commits and each ``COPY`` counted; PostgreSQL's
implicit ``BEGIN`` not), the process's CPU time and the wall time.

    python benchmarks/bench_reports.py [--reports 3000] [--jobs 100] [--threads 1,8]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from sqlalchemy import event

from ffdl.server.app import build_platform
from ffdl.server.platform import Platform
from ffdl.server.services.reports import ReportBatch, ingest_reports
from ffdl.server.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.postgres import PostgresServer  # noqa: E402
from tests.server.factories import make_job, start_learner  # noqa: E402


def report_items(first_seq: int, number: int) -> list[dict[str, Any]]:
    """Two log lines, and a metric every other report: what a learner sends a second."""
    items: list[dict[str, Any]] = [
        {"type": "log", "seq": first_seq + n, "time": 1e9 + number, "text": f"step {number}"}
        for n in range(2)
    ]
    if number % 2 == 0:
        values = {"loss": 1.0 / (number + 1)}
        seq = first_seq + 2
        items.append(
            {
                "type": "emetric",
                "seq": seq,
                "time": 1e9 + number,
                "iteration": number,
                "values": values,
            }
        )
    return items


class Statements:
    """Counts what the platform's engine sends: statements (savepoints included) and
    commits; a ``COPY`` goes to the driver directly, and is added below."""

    def __init__(self, platform: Platform) -> None:
        self.count = 0
        self._lock = threading.Lock()
        event.listen(platform.store.engine, "before_cursor_execute", self._statement)
        event.listen(platform.store.engine, "commit", self._statement)

    def _statement(self, *_args: Any, **_kwargs: Any) -> None:
        with self._lock:
            self.count += 1


def run(platform: Platform, job_ids: list[str], reports: int, threads: int) -> dict[str, float]:
    tokens = {job_id: platform.job_tokens.issue(job_id) for job_id in job_ids}
    next_seq = dict.fromkeys(job_ids, 1)
    counter = itertools.count()
    claim = threading.Lock()
    busy = {job_id: threading.Lock() for job_id in job_ids}

    def worker() -> None:
        while True:
            with claim:
                number = next(counter)
                if number >= reports:
                    return
                job_id = job_ids[number % len(job_ids)]
            with busy[job_id]:  # one learner posts one batch at a time, as a controller does
                items = report_items(next_seq[job_id], number)
                ack = ingest_reports(
                    platform, job_id, 1, tokens[job_id], ReportBatch(attempt=1, items=items)
                )
                assert ack.accepted == len(items), ack
                next_seq[job_id] += len(items)

    statements = Statements(platform)
    cpu, wall = time.process_time(), time.perf_counter()
    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    # A COPY per table a report fills (lines always, metrics every other), unseen above.
    copies = reports * 1.5 if platform.store.dialect == "postgresql" else 0
    return {
        "statements": (statements.count + copies) / reports,
        "cpu_us": cpu / reports * 1e6,
        "wall_us": wall / reports * 1e6,
        "per_s": reports / wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reports", type=int, default=3000)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--threads", default="1,8")
    parser.add_argument("--databases", default="sqlite,postgresql")
    args = parser.parse_args()
    thread_counts = [int(n) for n in args.threads.split(",")]
    print(f"{args.reports} reports (2 log lines, a metric every other) over {args.jobs} jobs")
    print(
        f"  {'database':<12} {'threads':>7} {'statements/report':>18} {'CPU µs/report':>14}"
        f" {'wall µs/report':>15} {'reports/s':>10}"
    )
    for database in args.databases.split(","):
        postgres = PostgresServer(fsync=True).start() if database == "postgresql" else None
        try:
            for threads in thread_counts:
                with tempfile.TemporaryDirectory() as tmp:
                    home = Path(tmp)
                    url = (
                        postgres.create_database()
                        if postgres is not None
                        else f"sqlite:///{home / 'ffdl.db'}"
                    )
                    platform = build_platform(Settings(home=home, sandbox=False, database_url=url))
                    try:
                        job_ids = [f"training-r{n:05d}" for n in range(args.jobs)]
                        for job_id in job_ids:
                            make_job(platform.store, job_id, tenant_id="default", user_id="admin")
                            start_learner(platform.store, job_id)
                        figures = run(platform, job_ids, args.reports, threads)
                    finally:
                        platform.store.dispose()
                print(
                    f"  {database:<12} {threads:>7} {figures['statements']:>18.1f}"
                    f" {figures['cpu_us']:>14.0f} {figures['wall_us']:>15.0f}"
                    f" {figures['per_s']:>10.0f}",
                    flush=True,
                )
        finally:
            if postgres is not None:
                postgres.stop()


if __name__ == "__main__":
    main()
