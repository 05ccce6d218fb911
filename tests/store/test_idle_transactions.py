"""A process frozen inside a transaction (``ffdl.server.store.db.PG_IDLE_IN_TRANSACTION_S``),
on a real PostgreSQL server: the server ends the transaction, so its row locks do not stop
everyone else for as long as it stays frozen."""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import select

from ffdl.server.store.db import PG_IDLE_IN_TRANSACTION_S
from ffdl.server.store.models import Job
from tests.server.factories import make_job, make_store


def test_a_transaction_left_open_with_a_row_locked_is_ended_by_the_server(
    tmp_path: Path,
) -> None:
    store = make_store(tmp_path, "postgresql")
    make_job(store, "training-held")
    frozen = store.engine.connect()
    try:
        transaction = frozen.begin()
        frozen.execute(select(Job.id).where(Job.id == "training-held").with_for_update())
        # Nothing more from the holder, as from a SIGSTOPped replica: another writer waits
        # for the row until the server ends the idle transaction.
        started = time.monotonic()
        with store.write() as session:
            locked = session.execute(
                select(Job.id).where(Job.id == "training-held").with_for_update()
            ).scalar_one()
        waited = time.monotonic() - started
        assert locked == "training-held"
        assert PG_IDLE_IN_TRANSACTION_S - 1 <= waited <= PG_IDLE_IN_TRANSACTION_S + 10
        del transaction
    finally:
        frozen.invalidate()
        frozen.close()
        store.dispose()
