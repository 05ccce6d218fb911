"""Pages of ``GET /v1/models`` on a real store (SQLite and PostgreSQL): ``next``/``after``
walks every job once, newest first, even while jobs arrive between pages, and a cursor
that is not one the server gave is a 400 naming ``after``."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from ffdl.core.errors import BadRequest
from ffdl.server.auth import Principal
from ffdl.server.services.queries import list_jobs, page_cursor
from ffdl.server.store.transitions import utcnow
from tests.server.factories import make_job, make_store, on_both_databases

MEMBER = Principal(user_id="u1", tenant_id="t1", role="member")


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
