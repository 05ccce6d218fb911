"""Retention: what moving ended jobs' log lines to the archive store costs and saves.

A database is filled with ``--lines`` log lines (and one metrics record per 10 lines) of
``--jobs`` jobs that ended two days ago; then every chunk is moved to a local archive
directory the way the ``archiver`` loop moves it (``move_chunk``: one read, the object
written outside any session, one write). Printed: the move rate, the database's size in use
before and after (SQLite: pages in use; PostgreSQL: the two tables with their indexes), the
archive's size, and the latency of a 100-line page at random places, read from the
database before the move and from the archive after it (cold: the chunk fetched and
decoded; warm: from the chunks kept in memory). On PostgreSQL the size after is measured
once ``VACUUM`` (what autovacuum runs) has made the deleted rows' space free.

    python benchmarks/bench_archive.py [--lines 1000000] [--jobs 20] [--database-url URL]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from _server import median, percentile
from sqlalchemy import insert, text

from ffdl.core.status import JobStatus
from ffdl.server.archive import RecordArchive
from ffdl.server.services import logs
from ffdl.server.services.record_archive import move_chunk
from ffdl.server.store.db import Store
from ffdl.server.store.models import Job, LogLine, Metric, Tenant, User
from ffdl.server.store.schema import upgrade
from ffdl.server.store.transitions import utcnow
from ffdl.storage.blobs import DirectoryBlobStore

CHUNK = 10_000
PAGES = 200
PAGE = 100
INSERT_BATCH = 20_000


def _fill(store: Store, jobs: int, lines: int) -> list[str]:
    now = utcnow()
    ended = now - timedelta(days=2)
    per_job = lines // jobs
    ids = [f"training-bench-{n:03d}" for n in range(jobs)]
    with store.write() as session:
        session.add(Tenant(id="t1", name="Team one", created_at=now))
        session.flush()
        session.add(User(id="u1", tenant_id="t1", name="ada", role="member", created_at=now))
    for job_id in ids:
        with store.write() as session:
            session.add(
                Job(
                    id=job_id,
                    tenant_id="t1",
                    user_id="u1",
                    name="bench",
                    manifest={"name": "bench", "framework": {"name": "custom", "command": "x"}},
                    status=JobStatus.COMPLETED.value,
                    learners=1,
                    gpus=1,
                    cpus=1.0,
                    memory_mb=256,
                    submitted_at=ended,
                    status_changed_at=ended,
                    finished_at=ended,
                    last_line_number=per_job,
                    last_metric_number=per_job // 10,
                )
            )
        for start in range(0, per_job, INSERT_BATCH):
            numbers = range(start + 1, min(start + INSERT_BATCH, per_job) + 1)
            with store.write() as session:
                session.execute(insert(LogLine), [_line(job_id, n) for n in numbers])
                metrics = [_metric(job_id, n // 10) for n in numbers if n % 10 == 0]
                if metrics:
                    session.execute(insert(Metric), metrics)
    return ids


def _line(job_id: str, n: int) -> dict[str, Any]:
    text = f"epoch {n // 1000} step {n} loss={1.0 / n:.6f} lr=0.001 throughput={n % 977} img/s"
    return {
        "job_id": job_id,
        "learner": 1,
        "attempt": 1,
        "seq": n,
        "number": n,
        "stream": "stdout",
        "text": text,
        "time": 1.7e9 + n * 0.05,
    }


def _metric(job_id: str, n: int) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "learner": 1,
        "attempt": 1,
        "seq": 10_000_000 + n,
        "number": n,
        "group": "train",
        "iteration": n,
        "values": {"loss": 1.0 / n, "accuracy": 1 - 1.0 / n},
        "time": 1.7e9 + n * 0.5,
    }


def _size_in_use(store: Store) -> int:
    with store.read() as session:
        if store.dialect == "sqlite":
            pages = session.execute(text("PRAGMA page_count")).scalar_one()
            free = session.execute(text("PRAGMA freelist_count")).scalar_one()
            size = session.execute(text("PRAGMA page_size")).scalar_one()
            return int((pages - free) * size)
        return int(
            session.execute(
                text(
                    "SELECT pg_total_relation_size('log_lines') + pg_total_relation_size('metrics')"
                )
            ).scalar_one()
        )


def _page_latencies(read: Callable[[int], object], last: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    latencies = []
    for _ in range(PAGES):
        position = rng.randrange(0, max(last - PAGE, 1))
        started = time.perf_counter()
        read(position)
        latencies.append(time.perf_counter() - started)
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--database-url", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = args.database_url or f"sqlite:///{Path(tmp) / 'ffdl.db'}"
        store = Store(url)
        upgrade(store)
        started = time.perf_counter()
        ids = _fill(store, args.jobs, args.lines)
        print(
            f"filled {args.lines:,} lines of {args.jobs} jobs "
            f"in {time.perf_counter() - started:.1f} s"
        )
        per_job = args.lines // args.jobs
        blobs = DirectoryBlobStore(Path(tmp) / "archive")
        archive = RecordArchive(lambda: blobs)

        with store.read() as session:
            job = session.get(Job, ids[0])
            assert job is not None

        def read_page(position: int) -> object:
            return logs.loglines(store, archive, job, since_time=None, pagesize=PAGE, pos=position)

        before_size = _size_in_use(store)
        from_db = _page_latencies(read_page, per_job, seed=1)

        started = time.perf_counter()
        moved = 0
        for job_id in ids:
            for model in (LogLine, Metric):
                while (count := move_chunk(store, archive, job_id, model, CHUNK)) > 0:
                    moved += count
        move_s = time.perf_counter() - started
        if store.dialect == "postgresql":
            # What autovacuum does next: deleted rows' space is reused, emptied pages cut off.
            with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text("VACUUM log_lines, metrics"))
        after_size = _size_in_use(store)
        archive_bytes = sum(
            p.stat().st_size for p in (Path(tmp) / "archive").rglob("*") if p.is_file()
        )

        cold: list[float] = []
        for position in range(0, per_job - PAGE, CHUNK)[:8]:
            archive = RecordArchive(lambda: blobs)  # nothing kept in memory
            started = time.perf_counter()
            logs.loglines(store, archive, job, since_time=None, pagesize=PAGE, pos=position)
            cold.append(time.perf_counter() - started)
        archive = RecordArchive(lambda: blobs)
        warm = _page_latencies(
            lambda position: logs.loglines(
                store, archive, job, since_time=None, pagesize=PAGE, pos=position % CHUNK
            ),
            CHUNK,
            seed=3,
        )
        store.dispose()

    per_million = 1_000_000 / args.lines
    print(
        f"database: {store.dialect}, {args.jobs} jobs, {args.lines:,} log lines, "
        f"{args.lines // 10:,} metrics records, chunks of {CHUNK:,}"
    )
    print(f"moved {moved:,} records in {move_s:.1f} s: {moved / move_s:,.0f} records/s")
    print(f"{'':32}{'MiB':>10}{'MiB per M lines':>18}")
    for label, size in (
        ("database in use, before", before_size),
        ("database in use, after", after_size),
        ("archive (gzip'd JSON lines)", archive_bytes),
    ):
        print(f"{label:32}{size / 2**20:>10.1f}{size * per_million / 2**20:>18.1f}")
    print(f"archive / database before: {archive_bytes / before_size:.3f}")
    print(f"{'100-line page':32}{'p50 ms':>10}{'p99 ms':>10}")
    for label, latencies in (
        ("from the database", from_db),
        ("from the archive, cold", cold),
        ("from the archive, warm", warm),
    ):
        print(
            f"{label:32}{median(latencies) * 1000:>10.2f}{percentile(latencies, 99) * 1000:>10.2f}"
        )


if __name__ == "__main__":
    main()
