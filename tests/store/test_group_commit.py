"""Group commit on a real SQLite file: many threads' writes share transactions, each
caller gets its own result or exception, and a failing write takes no other down."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import event, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from ffdl.server.store.availability import DatabaseFull
from ffdl.server.store.db import Store
from ffdl.server.store.group_commit import GroupCommit
from tests.integration.live import wait_for

WRITERS = 40
WRITES_EACH = 25


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store(f"sqlite:///{tmp_path / 'group.db'}")
    with store.write() as session:
        session.execute(text("CREATE TABLE rows (writer INTEGER, n INTEGER)"))
    return store


def test_concurrent_writes_commit_together_in_order_and_a_failure_stays_its_own(
    store: Store,
) -> None:
    group = GroupCommit(store)
    results: dict[int, list[int]] = {}
    refused: dict[int, list[str]] = {}

    def writer(number: int) -> None:
        for n in range(WRITES_EACH):

            def work(session: Session, n: int = n) -> int:
                session.execute(text("INSERT INTO rows VALUES (:w, :n)"), {"w": number, "n": n})
                if number == 7 and n % 5 == 0:
                    raise ValueError(f"write {n} of writer 7 refused")
                return n

            try:
                results.setdefault(number, []).append(group.run(f"writer-{number:02d}", work))
            except ValueError as exc:
                refused.setdefault(number, []).append(str(exc))

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    try:
        with store.read() as session:
            rows = session.execute(text("SELECT writer, n FROM rows ORDER BY rowid")).all()
    finally:
        store.dispose()

    failing = [n for n in range(WRITES_EACH) if n % 5 == 0]
    assert refused == {7: [f"write {n} of writer 7 refused" for n in failing]}
    for number in range(WRITERS):
        expected = [n for n in range(WRITES_EACH) if number != 7 or n not in failing]
        assert results[number] == expected, "each caller gets its own results, in its order"
        stored = [n for w, n in rows if w == number]
        assert stored == expected, "committed, in order, and nothing of a refused write"
    assert group.writes == WRITERS * WRITES_EACH
    assert group.commits < group.writes / 2, (group.commits, "writes shared transactions")


def test_a_group_whose_transaction_fails_runs_each_write_alone(store: Store) -> None:
    group = GroupCommit(store)
    outcomes: dict[str, object] = {}

    def gate(session: Session) -> str:
        # Holds the first group open until the next two writes are queued behind it, so
        # that those two form the next group together.
        wait_for(lambda: group.waiting() == 2, timeout=30, what="two writes queued")
        return "gate"

    def good(session: Session) -> str:
        session.execute(text("INSERT INTO rows VALUES (1, 1)"))
        return "stored"

    def poisons_the_commit(session: Session) -> str:
        session.execute(text("INSERT INTO rows VALUES (2, 2)"))
        session.info["poison"] = True
        return "never committed"

    def fail_commit(session: Session) -> None:
        # The whole transaction's commit, not a savepoint's release.
        if not session.in_nested_transaction() and session.info.pop("poison", False):
            raise RuntimeError("commit refused")

    def run(name: str, work: Callable[[Session], str]) -> None:
        try:
            outcomes[name] = group.run(name, work)
        except RuntimeError as exc:
            outcomes[name] = exc

    event.listen(Session, "before_commit", fail_commit)
    try:
        first = threading.Thread(target=run, args=("0-gate", gate))
        first.start()
        wait_for(lambda: group.waiting() == 0 and first.is_alive(), timeout=30, what="gate led")
        others = [
            threading.Thread(target=run, args=("a-good", good)),
            threading.Thread(target=run, args=("b-poison", poisons_the_commit)),
        ]
        for thread in others:
            thread.start()
        for thread in [first, *others]:
            thread.join(timeout=60)
    finally:
        event.remove(Session, "before_commit", fail_commit)
    with store.read() as session:
        rows = session.execute(text("SELECT writer FROM rows")).scalars().all()
    store.dispose()
    assert outcomes["0-gate"] == "gate"
    assert outcomes["a-good"] == "stored", "the other write of the failed group commits alone"
    assert isinstance(outcomes["b-poison"], RuntimeError)
    assert rows == [1]
    # The gate's group, then the good write alone: the failed group and the poisoned
    # write alone never committed.
    assert (group.commits, group.writes) == (2, 2)


def test_the_database_failing_under_one_write_fails_its_transaction_not_just_the_write(
    store: Store,
) -> None:
    """A database fault inside one write's savepoint (here a full disk; on PostgreSQL a
    lost connection, after which nothing in the transaction can commit) is not that
    write's own failure to swallow: the transaction fails, and the caller gets the
    platform's answer for the fault (507 here, 503 for a database away)."""
    group = GroupCommit(store)

    def hits_a_full_disk(session: Session) -> None:
        session.execute(text("INSERT INTO rows VALUES (3, 3)"))
        raise OperationalError("INSERT", {}, sqlite3.OperationalError("database or disk is full"))

    with pytest.raises(DatabaseFull):
        group.run("full", hits_a_full_disk)
    with store.read() as session:
        assert session.execute(text("SELECT count(*) FROM rows")).scalar() == 0
