"""Pages of ``GET /v1/models`` on a real store (SQLite and PostgreSQL): ``next``/``after``
walks every job once, newest first, even while jobs arrive between pages; offset pages do
too, their ids read from an index alone; a cursor that is not one the server gave is a
400 naming ``after``."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.engine import Connection

from ffdl.core.errors import BadRequest
from ffdl.server.auth import Principal
from ffdl.server.services.queries import IDS_FIRST_FROM_OFFSET, list_jobs, page_cursor
from ffdl.server.store.db import Store, is_postgresql
from ffdl.server.store.models import Tenant, User
from ffdl.server.store.transitions import utcnow
from tests.server.factories import job_row, make_job, make_store, on_both_databases

MEMBER = Principal(user_id="u1", tenant_id="t1", role="member")
ADMIN = Principal(user_id="root", tenant_id="t1", role="platform-admin")


@on_both_databases
def test_after_pages_walk_every_job_once_while_new_ones_arrive(
    tmp_path: Path, database: str
) -> None:
    store = make_store(tmp_path, database)
    try:
        start = utcnow() - timedelta(hours=1)
        # Pairs submitted at the same instant: the id breaks the tie.
        for n in range(11):
            make_job(store, f"training-{n:02d}", submitted_at=start + timedelta(seconds=n // 2))
        seen: list[str] = []
        after: str | None = None
        arrivals = 0
        while True:
            with store.read() as session:
                jobs, total = list_jobs(
                    session, MEMBER, status=None, limit=3, offset=0, after=after
                )
            seen += [job.id for job in jobs]
            if len(jobs) < 3:
                break
            after = page_cursor(jobs[-1])
            # A newer job arriving between pages would shift every offset by one.
            make_job(store, f"training-new-{arrivals}")
            arrivals += 1
        assert seen == [f"training-{n:02d}" for n in reversed(range(11))]
        assert total == 11 + arrivals
    finally:
        store.dispose()


@pytest.mark.parametrize("after", ["nonsense", "x" * 300, "MjAyNA"])
def test_a_cursor_the_server_did_not_give_is_a_400_naming_after(tmp_path: Path, after: str) -> None:
    store = make_store(tmp_path)
    try:
        with store.read() as session, pytest.raises(BadRequest) as refused:
            list_jobs(session, MEMBER, status=None, limit=3, offset=0, after=after)
        assert refused.value.detail == {"field": "after"}
        with store.read() as session, pytest.raises(BadRequest, match="not both"):
            list_jobs(session, MEMBER, status=None, limit=3, offset=2, after="x")
    finally:
        store.dispose()


def _other_tenant(store: Store) -> None:
    with store.write() as session:
        session.add(Tenant(id="t2", name="Team two", created_at=utcnow()))
        session.flush()
        session.add(User(id="u2", tenant_id="t2", name="bob", role="member", created_at=utcnow()))


@on_both_databases
def test_offset_pages_walk_every_job_once_newest_first(tmp_path: Path, database: str) -> None:
    store = make_store(tmp_path, database)
    try:
        _other_tenant(store)
        start = utcnow() - timedelta(hours=1)
        mine = []
        for n in range(13):
            at = start + timedelta(seconds=n // 3)  # threes at one instant: the id decides
            mine.append(make_job(store, f"training-a{n:02d}", submitted_at=at))
            make_job(store, f"training-b{n:02d}", submitted_at=at, tenant_id="t2", user_id="u2")
        everyone = sorted(
            [
                (start + timedelta(seconds=n // 3), f"training-{t}{n:02d}")
                for n in range(13)
                for t in "ab"
            ],
            reverse=True,
        )
        for principal, expected in (
            (MEMBER, sorted(mine, reverse=True)),
            (ADMIN, [i for _, i in everyone]),
        ):
            seen: list[str] = []
            for offset in range(0, 30, 4):
                with store.read() as session:
                    jobs, total = list_jobs(session, principal, status=None, limit=4, offset=offset)
                seen += [job.id for job in jobs]
                assert total == len(expected)
            assert seen == expected, principal.role
    finally:
        store.dispose()


def _statements(store: Store) -> list[tuple[str, Any]]:
    sent: list[tuple[str, Any]] = []

    def record(
        conn: Connection, cursor: object, statement: str, parameters: Any, *_: object
    ) -> None:
        sent.append((statement, parameters))

    event.listen(store.engine, "before_cursor_execute", record)
    return sent


def _many_jobs(store: Store, count: int) -> list[str]:
    """``count`` jobs of tenant t1 one second apart, in one transaction; their ids newest
    first."""
    start = utcnow() - timedelta(days=1)
    ids = [f"training-{n:05d}" for n in range(count)]
    with store.write() as session:
        session.add_all(
            job_row(job_id, submitted_at=start + timedelta(seconds=n))
            for n, job_id in enumerate(ids)
        )
    return ids[::-1]


@on_both_databases
@pytest.mark.parametrize("principal", [MEMBER, ADMIN], ids=["member", "platform-admin"])
def test_a_deep_offset_page_counts_its_offset_in_an_index_alone(
    tmp_path: Path, database: str, principal: Principal
) -> None:
    """Skipping rows costs as much as reading them: a deep page must skip index entries,
    and come out as the same page as a shallow one would."""
    store = make_store(tmp_path, database)
    try:
        newest_first = _many_jobs(store, IDS_FIRST_FROM_OFFSET + 10)
        sent = _statements(store)
        deep, shallow = IDS_FIRST_FROM_OFFSET, IDS_FIRST_FROM_OFFSET - 5
        with store.read() as session:
            jobs, total = list_jobs(session, principal, status=None, limit=8, offset=deep)
            before = list_jobs(session, principal, status=None, limit=8, offset=shallow)[0]
        assert total == len(newest_first)
        assert [job.id for job in jobs] == newest_first[deep : deep + 8]
        assert [job.id for job in before] == newest_first[shallow : shallow + 8]
        page = next(s for s in sent if "OFFSET" in s[0].upper())
        with store.read() as session:
            if is_postgresql(store.engine.url):
                # The planner's choice hangs on statistics and on the visibility map, both
                # kept by autovacuum in a live database; what matters here is that it can
                # answer the offset from an index alone, so every other way is ruled out.
                for way in ("seqscan", "bitmapscan", "indexscan"):
                    session.execute(text(f"SET LOCAL enable_{way} = off"))
                plan = session.connection().exec_driver_sql("EXPLAIN " + page[0], page[1])
                covered = "Index Only Scan"
            else:
                plan = session.connection().exec_driver_sql(
                    "EXPLAIN QUERY PLAN " + page[0], page[1]
                )
                covered = "COVERING INDEX"
            lines = [" ".join(str(v) for v in row) for row in plan]
        assert any(covered in line for line in lines), "\n".join(lines)
    finally:
        store.dispose()
