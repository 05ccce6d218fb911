"""Pages of ``GET /v1/models`` at 100,000 jobs, at every depth, on SQLite and PostgreSQL.

From an offset of ``IDS_FIRST_FROM_OFFSET`` (5,000), ``job_page`` reads a page by its ids,
from an index in list order, and only then their rows ("ids first"); the baseline ("one
read") reads the page as one query over whole rows, as every page did before, so each
skipped job costs a row read instead of an index entry. Below that offset ``job_page``
reads as the baseline does, and the two columns differ only by the machine's noise. Both
are timed at the same depths on the same database, and beside them the keyset page
(``after``) that starts at the same job, and the count every answer carries (``total``,
``count_jobs``), which does not depend on the depth. Timed in-process (the queries and the
ORM, no HTTP), as a tenant's member and as a platform administrator. PostgreSQL's table is
vacuumed first, as autovacuum keeps a live one, so that its index-only scans skip the heap.

Run: ``python benchmarks/bench_model_pages.py [--jobs 100000] [--calls 30]
[--database sqlite,postgresql]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _seed import seed_finished_jobs
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from ffdl.server.auth import Principal
from ffdl.server.services.queries import count_jobs, job_page, page_cursor
from ffdl.server.store.db import Store, is_postgresql
from ffdl.server.store.models import Job

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.server.factories import DATABASES, make_store  # noqa: E402

PAGE = 50
MEMBER = Principal(user_id="u1", tenant_id="t1", role="member")
ADMIN = Principal(user_id="root", tenant_id="t1", role="platform-admin")


def seed(store: Store, count: int) -> None:
    """``count`` finished jobs of tenant t1; on PostgreSQL, vacuumed as autovacuum would."""
    seed_finished_jobs(store, count, tenant_id="t1", user_id="u1")
    if is_postgresql(store.engine.url):
        with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE jobs"))


def one_read(session: Session, principal: Principal, offset: int) -> list[Job]:
    """The baseline: the page's whole rows in one query, the offset skipping rows."""
    query = select(Job).order_by(Job.submitted_at.desc(), Job.id.desc())
    if not principal.is_platform_admin:
        query = query.where(Job.tenant_id == principal.tenant_id)
    return list(session.scalars(query.limit(PAGE).offset(offset)))


def timed_ms(store: Store, calls: int, page: Callable[[Session], Any]) -> tuple[float, float]:
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        with store.read() as session:
            page(session)
        samples.append((time.perf_counter() - start) * 1000.0)
    samples.sort()
    return statistics.median(samples), samples[min(len(samples) - 1, round(0.99 * len(samples)))]


def measure(store: Store, jobs: int, calls: int) -> list[tuple[str, int, tuple[float, ...]]]:
    rows = []
    for who, principal in (("member", MEMBER), ("admin", ADMIN)):
        count = timed_ms(store, calls, lambda s, p=principal: count_jobs(s, p, status=None))
        for depth in sorted({0, 1_000, jobs // 2, max(jobs - PAGE, 0)}):
            with store.read() as session:
                before = job_page(
                    session, principal, status=None, limit=1, offset=max(depth - 1, 0)
                )
            after = page_cursor(before[0]) if depth and before else None

            def by_ids(session: Session, at: int = depth, p: Principal = principal) -> object:
                return job_page(session, p, status=None, limit=PAGE, offset=at)

            def by_keyset(
                session: Session, cursor: str | None = after, p: Principal = principal
            ) -> object:
                return job_page(session, p, status=None, limit=PAGE, offset=0, after=cursor)

            old = timed_ms(store, calls, lambda s, at=depth, p=principal: one_read(s, p, at))
            new = timed_ms(store, calls, by_ids)
            keyset = timed_ms(store, calls, by_keyset)
            rows.append((who, depth, (*old, *new, old[0] / new[0], *keyset, count[0])))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--database", default=",".join(DATABASES))
    args = parser.parse_args()
    kinds = args.database.split(",")
    if args.jobs < PAGE or args.calls < 1 or not set(kinds) <= set(DATABASES):
        parser.error(f"--jobs >= {PAGE}, --calls >= 1, --database among {', '.join(DATABASES)}")
    print(f"pages of {PAGE} jobs among {args.jobs:,} (ms, {args.calls} calls each, in-process)")
    header = (
        f"  {'database':11s}{'caller':8s}{'offset':>8s}"
        f"{'one read p50':>14s}{'p99':>8s}{'ids first p50':>15s}{'p99':>8s}{'ratio':>8s}"
        f"{'keyset p50':>12s}{'p99':>8s}{'count p50':>11s}"
    )
    print(header)
    for kind in kinds:
        with tempfile.TemporaryDirectory() as tmp:
            store = make_store(Path(tmp), kind)
            try:
                seed(store, args.jobs)
                for who, depth, (o50, o99, n50, n99, ratio, k50, k99, c50) in measure(
                    store, args.jobs, args.calls
                ):
                    print(
                        f"  {kind:11s}{who:8s}{depth:8d}{o50:14.2f}{o99:8.2f}{n50:15.2f}"
                        f"{n99:8.2f}{ratio:7.2f}×{k50:12.2f}{k99:8.2f}{c50:11.2f}",
                        flush=True,
                    )
            finally:
                store.dispose()


if __name__ == "__main__":
    main()
