"""Loop leases on SQLite and PostgreSQL: one holder at a time, takeover, fencing, hand-over;
and the status gate's compare-and-set between two transactions."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, select
from sqlalchemy.orm import Session

from ffdl.core.errors import LeaseLost, StatusChanged
from ffdl.core.status import JobStatus
from ffdl.server.leases import LOOPS, LeaseKeeper, fenced
from ffdl.server.store.db import Store
from ffdl.server.store.models import Event, Job, Lease, Replica, Tenant
from ffdl.server.store.transitions import lock_jobs, set_job_status, utcnow
from tests.integration.live import wait_for
from tests.server.factories import DATABASES, make_job, make_store


def keeper(
    store: Store,
    name: str,
    *,
    ttl_s: float = 30.0,
    hang_s: float = 60.0,
    spread: bool = False,
    runs_loops: bool = True,
) -> LeaseKeeper:
    return LeaseKeeper(
        store,
        replica_id=name,
        url=f"http://127.0.0.1/{name}",
        version="test",
        ttl_s=ttl_s,
        hang_s=hang_s,
        spread=spread,
        runs_loops=runs_loops,
    )


def one_holder_each(keepers: list[LeaseKeeper]) -> None:
    """No loop is run by two keepers at once, by their own clocks."""
    for name in LOOPS:
        running = [k.replica_id for k in keepers if k.fence(name) is not None]
        assert len(running) <= 1, (name, running)


def tick_until_spread(keepers: list[LeaseKeeper], each: int, *, rounds: int) -> None:
    for _ in range(rounds):
        for k in keepers:
            k.tick()
            one_holder_each(keepers)
        if all(len(k.held()) == each for k in keepers):
            return
    raise AssertionError({k.replica_id: k.held() for k in keepers})


@pytest.fixture(params=DATABASES)
def store(tmp_path: Path, request: pytest.FixtureRequest) -> Store:
    return make_store(tmp_path, request.param)


def test_one_replica_runs_every_loop_and_the_others_wait(store: Store) -> None:
    a, b = keeper(store, "a"), keeper(store, "b")
    assert sorted(a.tick()) == sorted(LOOPS)
    assert b.tick() == []
    for name in LOOPS:
        assert a.fence(name) is not None
        assert b.fence(name) is None
    assert a.tick() == [], "renewing takes nothing new"
    with store.read() as session:
        assert {lease.holder for lease in session.query(Lease)} == {"a"}
        assert {replica.id for replica in session.query(Replica)} == {"a", "b"}


def test_a_lease_left_to_expire_moves_with_a_new_token(store: Store) -> None:
    # Long enough that a busy machine cannot expire a's leases between two of its lines.
    a, b = keeper(store, "a", ttl_s=1.0), keeper(store, "b", ttl_s=1.0)
    a.tick()
    old = a.fence("lcm")
    assert old is not None and old.token == 1
    # a stops renewing (dead or frozen): b takes over once the lease runs out.
    taken = wait_for(b.tick, timeout=10, interval=0.05, what="b takes the expired leases")
    assert sorted(taken) == sorted(LOOPS)
    new = b.fence("lcm")
    assert new is not None and new.token == 2
    assert a.fence("lcm") is None, "a's own clock says its lease ran out"
    assert a.tick() == [] and b.tick() == []


def test_a_deposed_holders_writes_are_refused_and_roll_back(store: Store) -> None:
    a, b = keeper(store, "a", ttl_s=1.0), keeper(store, "b", ttl_s=1.0)
    a.tick()
    stale = a.fence("scheduler")
    assert stale is not None
    wait_for(b.tick, timeout=10, interval=0.05, what="b takes over")
    with pytest.raises(LeaseLost, match="moved to b"), fenced(stale), store.write() as session:
        session.add(Tenant(id="late", name="written by a", created_at=utcnow()))
    current = b.fence("scheduler")
    assert current is not None
    with fenced(current), store.write() as session:
        session.add(Tenant(id="fresh", name="written by b", created_at=utcnow()))
    with store.read() as session:
        assert session.get(Tenant, "late") is None
        assert session.get(Tenant, "fresh") is not None


def test_a_hung_loop_gives_its_lease_up_and_keeps_the_others(store: Store) -> None:
    a = keeper(store, "a", ttl_s=1.0, hang_s=0.2)
    b = keeper(store, "b", ttl_s=1.0, hang_s=0.2)
    a.tick()
    a.pass_started("lcm")  # and never ends

    def let_go() -> bool:
        a.tick()
        return "lcm" not in a.held()

    wait_for(let_go, timeout=10, interval=0.05, what="a lets the lcm lease go")
    assert "scheduler" in a.held()

    def b_takes() -> list[str]:
        # a goes on renewing what it keeps, as its replica does, however slow the machine.
        a.tick()
        return b.tick()

    taken = wait_for(b_takes, timeout=10, interval=0.05, what="b takes the lcm lease")
    assert taken == ["lcm"]


def test_a_clean_stop_hands_every_lease_over_at_once(store: Store) -> None:
    a, b = keeper(store, "a"), keeper(store, "b")
    a.tick()
    a.release()
    assert sorted(b.tick()) == sorted(LOOPS), "no wait for the 30 s leases to run out"
    with store.read() as session:
        replica = session.get(Replica, "a")
        assert replica is not None and replica.stopped_at is not None


def test_a_replica_whose_process_died_on_this_host_is_taken_over_at_once(store: Store) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = keeper(store, "dead")
    dead.tick()
    with store.write() as session:
        replica = session.get(Replica, "dead")
        assert replica is not None
        replica.pid = gone.pid
    b = keeper(store, "b")
    assert sorted(b.tick()) == sorted(LOOPS), "the dead process's 30 s leases are not waited out"


def test_spreading_replicas_divide_the_loops_with_one_holder_at_every_step(store: Store) -> None:
    a = keeper(store, "a", spread=True)
    assert sorted(a.tick()) == sorted(LOOPS), "alone, a replica runs every loop"
    b, c = keeper(store, "b", spread=True), keeper(store, "c", spread=True)
    # Each round the first replica hands one lease over and the others take what is free,
    # up to their share of ceil(6 / 3) = 2.
    tick_until_spread([a, b, c], 2, rounds=8)
    assert "scheduler" in a.held(), "the busiest loops leave the first replica first"
    with store.read() as session:
        tokens = {lease.name: lease.token for lease in session.query(Lease)}
    for _ in range(3):
        assert a.tick() == [] and b.tick() == [] and c.tick() == [], "settled"
    with store.read() as session:
        assert {lease.name: lease.token for lease in session.query(Lease)} == tokens
        holders = [lease.holder for lease in session.query(Lease)]
    assert sorted(holders) == ["a", "a", "b", "b", "c", "c"]


def test_a_spread_replica_that_stops_is_taken_over_and_gets_a_share_back_later(
    store: Store,
) -> None:
    a, b, c = (keeper(store, name, ttl_s=1.0, spread=True) for name in "abc")
    tick_until_spread([a, b, c], 2, rounds=8)
    before = {name: fence.token for name in c.held() if (fence := c.fence(name)) is not None}

    def survivors_take_over() -> bool:
        a.tick()
        b.tick()
        one_holder_each([a, b])
        return len(a.held()) == len(b.held()) == 3

    # c stops renewing (dead or frozen): a and b take its two loops once they run out.
    wait_for(survivors_take_over, timeout=10, interval=0.05, what="a and b take c's loops")
    assert all(c.fence(name) is None for name in LOOPS), "c's own clock says they ran out"
    # c comes back: it gets a share again, each lease with a new token.
    tick_until_spread([a, b, c], 2, rounds=8)
    for name in c.held():
        fence = c.fence(name)
        assert fence is not None and fence.token > before.get(name, 0)


def test_the_first_survivor_takes_every_lease_of_a_gone_replica_then_shares_them(
    store: Store,
) -> None:
    # Leases of 3 s: a handed-over lease would wait 2 s for b, far longer than a round here.
    a, b, c = (keeper(store, name, ttl_s=3.0, spread=True) for name in "abc")
    tick_until_spread([a, b, c], 2, rounds=8)
    gone = c.held()

    def first_taken() -> list[str]:
        # a and b renew theirs as their replicas do; c has stopped.
        return a.tick() or b.tick()

    # The first survivor to see c's loops free takes both, though that puts it over its
    # share while the other is under it: a gone replica's loops do not wait for the
    # replicas below their share.
    taken = wait_for(first_taken, timeout=10, interval=0.05, what="a survivor takes c's loops")
    assert sorted(taken) == gone
    assert sorted([len(a.held()), len(b.held())]) == [2, 4]
    # Then the one over its share hands one over, and they settle at three each.
    tick_until_spread([a, b], 3, rounds=8)


def test_a_replica_serving_the_api_only_takes_no_lease_and_no_share(store: Store) -> None:
    api = keeper(store, "api", spread=True, runs_loops=False)
    assert api.tick() == [], "every lease is free, and still it takes none"
    a, b = keeper(store, "a", spread=True), keeper(store, "b", spread=True)
    # Counted among the live replicas, it would make the share ceil(6 / 3) = 2 and leave
    # two leases handed back and forth between a and b.
    tick_until_spread([a, b], 3, rounds=8)
    with store.read() as session:
        tokens = {lease.name: lease.token for lease in session.query(Lease)}
    for _ in range(3):
        assert api.tick() == [] and a.tick() == [] and b.tick() == [], "settled"
    assert api.held() == [] and all(api.fence(name) is None for name in LOOPS)
    with store.read() as session:
        assert {lease.name: lease.token for lease in session.query(Lease)} == tokens
        roles = {r.id: r.runs_loops for r in session.query(Replica)}
    assert roles == {"api": False, "a": True, "b": True}
    # Even with every replica that runs the loops gone, it takes none.
    a.release()
    b.release()
    assert api.tick() == [] and api.held() == []


def test_spreading_does_not_leave_a_lease_free_when_every_replica_has_its_share(
    store: Store,
) -> None:
    a, b = keeper(store, "a", spread=True), keeper(store, "b", spread=True)
    tick_until_spread([a, b], 3, rounds=8)
    taken = a.held()
    a.release()
    # b holds its share already, and no live replica is below it: it takes a's at once.
    assert sorted(b.tick()) == taken


def test_two_transactions_cannot_both_move_a_job_from_the_same_status(tmp_path: Path) -> None:
    """Two replicas read a QUEUED job and both try to place it: the second one's
    transaction is refused, whichever commits first (PostgreSQL, where they really overlap)."""
    store = make_store(tmp_path, "postgresql")
    job_id = make_job(store)
    first, second = Session(store.engine), Session(store.engine)
    try:
        job_one, job_two = first.get(Job, job_id), second.get(Job, job_id)
        assert job_one is not None and job_two is not None
        assert job_one.status == job_two.status == "QUEUED"
        set_job_status(first, job_one, JobStatus.PENDING, "placed by one")
        first.commit()
        with pytest.raises(StatusChanged, match="from QUEUED to PENDING"):
            set_job_status(second, job_two, JobStatus.PENDING, "placed by two")
        second.rollback()
    finally:
        first.close()
        second.close()
    with store.read() as session:
        events = session.scalars(select(Event.reason).where(Event.job_id == job_id)).all()
    assert list(events) == ["placed by one"]


def test_jobs_locked_together_are_read_fresh_once_and_not_again_by_the_gate(
    tmp_path: Path,
) -> None:
    """``lock_jobs`` reads the stored statuses under the lock, even of a job the session
    had read before another transaction moved it; the gate then asks nothing more."""
    store = make_store(tmp_path, "postgresql")
    ids = [make_job(store, f"training-lock{n}") for n in range(5)]
    first, second = Session(store.engine), Session(store.engine)
    try:
        stale = second.get(Job, ids[0])
        assert stale is not None and stale.status == "QUEUED"
        moved = first.get(Job, ids[0])
        assert moved is not None
        set_job_status(first, moved, JobStatus.PENDING, "placed by one")
        first.commit()

        statements: list[str] = []

        def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            statements.append(statement)

        event.listen(store.engine, "before_cursor_execute", count)
        try:
            jobs = lock_jobs(second, ids)
            assert jobs[ids[0]].status == "PENDING", "read again under the lock"
            for job_id in ids[1:]:
                set_job_status(second, jobs[job_id], JobStatus.PENDING, "placed by two")
            second.flush()
        finally:
            event.remove(store.engine, "before_cursor_execute", count)
        second.commit()
    finally:
        first.close()
        second.close()
    reads = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
    assert len(reads) == 1, reads
    with store.read() as session:
        reasons = dict(session.execute(select(Event.job_id, Event.reason)).all())
    assert reasons == {ids[0]: "placed by one", **{j: "placed by two" for j in ids[1:]}}


def test_a_round_locks_every_lease_in_one_statement_and_renews_them_in_one_batch(
    tmp_path: Path,
) -> None:
    # Each loop pass's commit locks its lease to check its fence: it waits for as long as a
    # round holds that row, which was a round trip per lease with a renewal between each.
    store = make_store(tmp_path, "postgresql")
    a = keeper(store, "a")
    assert sorted(a.tick()) == sorted(LOOPS)
    statements: list[tuple[str, bool]] = []

    def record(
        _conn: object, _cursor: object, sql: str, _params: object, _ctx: object, many: bool
    ) -> None:
        statements.append((" ".join(sql.split()), many))

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        assert a.tick() == []
    finally:
        event.remove(store.engine, "before_cursor_execute", record)
    locks = [sql for sql, _ in statements if "FROM leases" in sql and "FOR UPDATE" in sql]
    assert len(locks) == 1, locks
    renewals = [(sql, many) for sql, many in statements if sql.startswith("UPDATE leases")]
    assert len(renewals) == 1 and renewals[0][1], renewals
    assert sorted(a.held()) == sorted(LOOPS)
    with store.read() as session:
        assert {lease.holder for lease in session.query(Lease)} == {"a"}
