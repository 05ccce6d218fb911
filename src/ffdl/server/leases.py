"""Leases: which replica runs each background loop, and the fence on that loop's writes.

Several control-plane processes (replicas, or the workers of an API pool) may share one
database. Every one serves the API, but each background loop (scheduler, LCM, monitor,
autoscaler, webhooks) must run in exactly one of them at a time, or two replicas could
deploy the same job twice. A ``leases`` row per loop says who runs it:

- **Taking and keeping.** A :class:`LeaseKeeper` in each replica renews the leases it holds
  every third of ``lease_ttl_s`` and takes any lease that is free or has expired, by a
  compare-and-set on the row's ``token``. A takeover adds one to the token.
- **Losing.** A holder that dies, freezes (SIGSTOP, a long pause) or is cut off stops
  renewing, and another replica takes the lease once it expires, within ``lease_ttl_s``
  and one renewal. A holder whose loop pass has run longer than ``loop_hang_s`` stops
  renewing that loop's lease on purpose: a hung loop is handed over like a dead one.
- **Fencing.** A loop pass runs with its :class:`Fence` (the lease's name, holder and token)
  in a context variable, and every transaction it commits first checks, with the lease row
  locked (``SELECT ... FOR UPDATE`` on PostgreSQL; SQLite's ``BEGIN IMMEDIATE`` locks the
  whole file), that the lease still has that holder and token. A deposed holder's late
  writes therefore fail with :class:`LeaseLost` and roll back; they cannot interleave with
  the new holder's, because a takeover must lock the same row to change the token.

Replicas also register themselves in the ``replicas`` table (URL, host, pid, version, when
last seen, when they last saw the database come back after an outage) so that ``ffdl
status`` shows who is up and who leads what, so that learners are told every replica's
address, and so that the job monitor, wherever it runs, counts no silence from the time
some replica could not reach the database.

- **Spreading.** A keeper told to spread (``spread=True``; replicas on PostgreSQL, whose
  wake-ups reach every replica) takes a free lease only while it holds fewer than its share,
  ``ceil(loops / live replicas)``, and hands one lease back per round while it holds more
  and another live replica holds fewer, so the loops' work is divided among the replicas
  instead of all landing on the first one up. Availability comes first: the leases of a
  replica that is gone (dead, frozen, stopped) are taken by the first replica to see them
  free, share or not; a lease handed over that no replica below its share took within
  :data:`SPREAD_GRACE_ROUNDS` rounds is taken by whoever sees it. Replicas on SQLite keep
  every loop in one process, since their wake-ups do not cross processes.

- **Serving the API only.** A replica started with ``run_loops: false`` registers (its
  address reaches the learners, ``ffdl status`` lists it) but takes no lease, and the
  others leave it out of their share. The loops then run in processes that serve little or
  no API traffic, so a scheduling pass does not wait for the interpreter behind requests
  (the pass's thread and the event loop share one interpreter lock).

A database that goes away stops every renewal: the leases lapse on each replica's clock
(its loops stop), and when the database returns the first replica to tick takes them,
with new tokens, as after any expiry.

Times are each replica's own clock (naive UTC): replicas on several machines need clocks
agreeing to well within ``lease_ttl_s`` (NTP does).
"""

from __future__ import annotations

import contextvars
import logging
import math
import os
import socket
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import event, func, select, update
from sqlalchemy.orm import Session

from ffdl.core.errors import LeaseLost
from ffdl.server.store.db import Store
from ffdl.server.store.models import Lease, Replica
from ffdl.server.store.transitions import utcnow

log = logging.getLogger("ffdl.leases")

LOOPS = ("scheduler", "lcm", "monitor", "autoscaler", "webhooks", "archiver")
# When spreading, the order in which an over-share replica hands leases over: the busiest
# loops leave first, so the first replica up keeps the scheduler and a light loop.
HANDOVER_ORDER = ("lcm", "monitor", "autoscaler", "webhooks", "archiver", "scheduler")
# Rounds a free lease is left to the replicas below their share before any replica takes it.
SPREAD_GRACE_ROUNDS = 2


@dataclass(frozen=True)
class Fence:
    """What a loop pass's writes must still match when they commit."""

    name: str
    holder: str
    token: int


_FENCE: contextvars.ContextVar[Fence | None] = contextvars.ContextVar("ffdl_fence", default=None)


@contextmanager
def fenced(fence: Fence) -> Iterator[None]:
    """Commit every write made in this context (and threads it starts) only under ``fence``."""
    token = _FENCE.set(fence)
    try:
        yield
    finally:
        _FENCE.reset(token)


def set_fence(fence: Fence | None) -> contextvars.Token[Fence | None]:
    """Put ``fence`` on the current context (an asyncio task's own); undo with the token."""
    return _FENCE.set(fence)


def reset_fence(token: contextvars.Token[Fence | None]) -> None:
    _FENCE.reset(token)


def current_fence() -> Fence | None:
    """The fence the writes made in this context commit under, if any."""
    return _FENCE.get()


def check_fence(session: Session) -> None:
    """Refuse the commit of ``session`` unless its context's fence still holds.

    A session-wide ``before_commit`` hook: transactions outside a loop pass have no fence
    and are not checked.
    """
    fence = _FENCE.get()
    if fence is None:
        return
    row = session.execute(
        select(Lease.holder, Lease.token).where(Lease.name == fence.name).with_for_update()
    ).first()
    if row is None or row.holder != fence.holder or row.token != fence.token:
        holder = "nobody" if row is None else f"{row.holder} (token {row.token})"
        raise LeaseLost(
            f"the {fence.name} lease moved to {holder}; this replica's write "
            f"with token {fence.token} is refused"
        )


_hook_lock = threading.Lock()
_hooked = False


def install_fence_check() -> None:
    """Check fences on every commit of every session in this process (once)."""
    global _hooked
    with _hook_lock:
        if not _hooked:
            event.listen(Session, "before_commit", check_fence)
            _hooked = True


def new_replica_id() -> str:
    """A name for this process among the replicas: host, pid, and a random part."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass
class Held:
    token: int
    expires_at: datetime


@dataclass
class Share:
    """One round's view, when spreading, of how many leases this replica should hold."""

    fair: int  # ceil(loops / live replicas)
    mine: int  # what this replica holds, counting what it takes this round
    others_below: bool  # whether another live replica holds fewer than ``fair``
    grace: timedelta  # how long a free lease is left to the replicas below their share
    live: frozenset[str]  # the replicas seen within one lease_ttl_s
    took: bool = False  # whether this round took a lease (it then hands none over)

    def may_take(self, lease: Lease, free_since: datetime, now: datetime) -> bool:
        # A lease whose holder is gone (dead, frozen, stopped) is taken by the first replica
        # to see it, share or not: its loop must run again at once. One handed over by a
        # live replica waits for a replica below its share, for a while.
        if self.mine < self.fair or not self.others_below or lease.holder not in self.live:
            return True
        return now - free_since >= self.grace


class LeaseKeeper:
    """Takes, renews and gives back this replica's loop leases; registers the replica.

    ``tick()`` does one round (called every ``ttl_s / 3`` by the app); ``fence(name)`` says
    whether this replica may run loop ``name`` now, and under which fence.
    """

    def __init__(
        self,
        store: Store,
        *,
        replica_id: str,
        url: str,
        version: str,
        ttl_s: float,
        hang_s: float,
        names: tuple[str, ...] = LOOPS,
        spread: bool = False,
        runs_loops: bool = True,
    ) -> None:
        self.store = store
        self.replica_id = replica_id
        self.url = url
        self.version = version
        self.ttl = timedelta(seconds=ttl_s)
        self.hang = timedelta(seconds=hang_s)
        # A replica that serves the API only registers and takes no lease, ever.
        self.runs_loops = runs_loops
        self.names = names if runs_loops else ()
        self.spread = spread
        self.started_at = utcnow()
        self._held: dict[str, Held] = {}
        # When this replica took each lease it holds (a new token), on its own clock.
        self._led_since: dict[str, datetime] = {}
        self._busy_since: dict[str, datetime] = {}
        self._lock = threading.Lock()
        install_fence_check()

    # -- what the loops ask -----------------------------------------------------------------

    def fence(self, name: str) -> Fence | None:
        """The fence to run loop ``name`` under, or None when another replica runs it."""
        with self._lock:
            held = self._held.get(name)
            if held is None or held.expires_at <= utcnow():
                return None
            return Fence(name, self.replica_id, held.token)

    def pass_started(self, name: str) -> None:
        with self._lock:
            self._busy_since[name] = utcnow()

    def pass_ended(self, name: str) -> None:
        with self._lock:
            self._busy_since.pop(name, None)

    def held(self) -> list[str]:
        with self._lock:
            return sorted(self._held)

    def led_since(self, name: str) -> datetime | None:
        """Since when this replica has led loop ``name`` without a break; None if it does not."""
        with self._lock:
            return self._led_since.get(name) if name in self._held else None

    # -- one round ----------------------------------------------------------------------------

    def tick(self) -> list[str]:
        """Register this replica, renew held leases, take free ones; the names newly taken.

        One transaction for the whole round: a replica costs the database one commit per
        third of ``lease_ttl_s``, whatever the number of loops.
        """
        now = utcnow()
        outcome: dict[str, Held | None] = {}
        handed: str | None = None
        with self.store.write() as session:
            self._register(session, now)
            share = self._share(session, now) if self.spread and self.names else None
            leases = self._lock_leases(session)
            for name in self.names:
                if self._hung(name, now):
                    self._let_go(name, f"its {name} pass has run since {self._busy_since[name]}")
                    continue
                outcome[name] = self._renew_or_take(session, name, leases.get(name), now, share)
            if share is not None:
                handed = self._hand_one_over(session, outcome, share, now)
        taken: list[str] = []
        for name, held in outcome.items():
            with self._lock:
                before = self._held.get(name)
                if held is None:
                    self._held.pop(name, None)
                else:
                    self._held[name] = held
                    if before is None or before.token != held.token:
                        self._led_since[name] = now
            if held is not None and (before is None or before.token != held.token):
                log.info("replica %s leads %s (token %d)", self.replica_id, name, held.token)
                taken.append(name)
            elif name == handed:
                log.info("replica %s hands %s over to spread the loops", self.replica_id, name)
            elif held is None and before is not None:
                log.warning("replica %s lost the %s lease", self.replica_id, name)
        return taken

    def release(self) -> None:
        """Give back every lease now (a clean stop) so another replica takes over at once."""
        now = utcnow()
        with self._lock:
            held = dict(self._held)
            self._held.clear()
        with self.store.write() as session:
            for name, lease in held.items():
                self._give_back(session, name, lease, now)
            replica = session.get(Replica, self.replica_id)
            if replica is not None:
                replica.stopped_at = now
                replica.seen_at = now

    # -- internals ----------------------------------------------------------------------------

    def _hung(self, name: str, now: datetime) -> bool:
        with self._lock:
            since = self._busy_since.get(name)
        return since is not None and now - since > self.hang

    def _let_go(self, name: str, why: str) -> None:
        with self._lock:
            held = self._held.pop(name, None)
        if held is not None:
            log.warning("replica %s gives up the %s lease: %s", self.replica_id, name, why)

    def _share(self, session: Session, now: datetime) -> Share:
        """How the leases stand among the live replicas, for this round's choices.

        A replica is live here while it was seen within one ``lease_ttl_s``: one that
        stopped ticking drops out when its leases run out, so the survivors' share grows
        as those leases come free. Replicas that serve the API only do not count.
        """
        live = set(
            session.scalars(
                select(Replica.id).where(
                    Replica.stopped_at.is_(None),
                    Replica.seen_at >= now - self.ttl,
                    Replica.runs_loops.is_(True),
                )
            )
        )
        live.add(self.replica_id)
        counts = dict.fromkeys(live, 0)
        for holder, held in session.execute(
            select(Lease.holder, func.count())
            .where(Lease.name.in_(self.names), Lease.expires_at > now)
            .group_by(Lease.holder)
        ):
            if holder in counts:
                counts[holder] = held
        fair = math.ceil(len(self.names) / len(live))
        return Share(
            fair=fair,
            # What this replica holds when the round starts; each lease it takes adds one.
            mine=counts[self.replica_id],
            others_below=any(n < fair for r, n in counts.items() if r != self.replica_id),
            grace=self.ttl / 3 * SPREAD_GRACE_ROUNDS,
            live=frozenset(live),
        )

    def _hand_one_over(
        self, session: Session, outcome: dict[str, Held | None], share: Share, now: datetime
    ) -> str | None:
        """Give back one lease when over the share and another replica is below it."""
        if share.took or share.mine <= share.fair or not share.others_below:
            return None
        with self._lock:
            busy = set(self._busy_since)
        for name in HANDOVER_ORDER:
            held = outcome.get(name)
            # A loop in the middle of a pass keeps its lease: its writes would be refused.
            if held is None or name in busy:
                continue
            self._give_back(session, name, held, now)
            outcome[name] = None
            return name
        return None

    def _give_back(self, session: Session, name: str, held: Held, now: datetime) -> None:
        """Let lease ``name`` expire now, if this replica still holds it with that token."""
        session.execute(
            update(Lease)
            .where(
                Lease.name == name,
                Lease.holder == self.replica_id,
                Lease.token == held.token,
            )
            .values(expires_at=now)
        )

    def _lock_leases(self, session: Session) -> dict[str, Lease]:
        """This round's leases, read and locked in one statement, in name order.

        Every loop pass's commit locks its own lease to check its fence (``check_fence``),
        so it waits for as long as a round holds that row: one round trip here, not one per
        lease with each renewal flushed in between. Locking in name order, as every replica
        does, keeps two rounds from deadlocking.
        """
        if not self.names:
            return {}
        rows = session.scalars(
            select(Lease).where(Lease.name.in_(self.names)).order_by(Lease.name).with_for_update()
        )
        return {lease.name: lease for lease in rows}

    def _renew_or_take(
        self,
        session: Session,
        name: str,
        lease: Lease | None,
        now: datetime,
        share: Share | None = None,
    ) -> Held | None:
        expires = now + self.ttl
        if lease is None:
            if share is not None:
                share.mine += 1
                share.took = True
            session.add(
                Lease(
                    name=name,
                    holder=self.replica_id,
                    token=1,
                    acquired_at=now,
                    expires_at=expires,
                )
            )
            return Held(1, expires)
        mine = lease.holder == self.replica_id
        with self._lock:
            known = self._held.get(name)
        if mine and known is not None and known.token == lease.token:
            lease.expires_at = expires
            return Held(lease.token, expires)
        free_since = self._free_since(session, lease, now)
        if free_since is None:
            return None
        if share is not None:
            if not share.may_take(lease, free_since, now):
                return None
            share.mine += 1
            share.took = True
        # Taking over, from another replica or from an earlier life of this one (whose
        # passes, if any are still running, must be fenced off): a new token either way.
        lease.holder = self.replica_id
        lease.token += 1
        lease.acquired_at = now
        lease.expires_at = expires
        return Held(lease.token, expires)

    def _free_since(self, session: Session, lease: Lease, now: datetime) -> datetime | None:
        """Since when ``lease`` has been free to take, or None while its holder keeps it."""
        if lease.holder is None or lease.expires_at is None:
            return datetime.min
        if lease.expires_at <= now:
            return lease.expires_at
        if self._died_here(session, lease.holder):
            return datetime.min
        return None

    def _died_here(self, session: Session, holder: str) -> bool:
        """Whether ``holder`` was a replica on this host whose process is gone.

        Its lease need not run out: a restarted ``ffdl up`` takes its loops back at once.
        (Should the pid be another process's by now, the lease just runs out first.)
        """
        replica = session.get(Replica, holder)
        if replica is None or replica.host != socket.gethostname():
            return False
        if replica.pid == os.getpid():
            return False
        try:
            os.kill(replica.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def _register(self, session: Session, now: datetime) -> None:
        replica = session.get(Replica, self.replica_id)
        if replica is None:
            replica = Replica(
                id=self.replica_id,
                url=self.url,
                host=socket.gethostname(),
                pid=os.getpid(),
                version=self.version,
                started_at=self.started_at,
                seen_at=now,
                runs_loops=self.runs_loops,
            )
            session.add(replica)
        else:
            replica.seen_at = now
        replica.database_returned_at = self.store.availability.returned_at


def describe(session: Session, *, now: datetime, alive_within: timedelta) -> dict[str, Any]:
    """Replicas (recently seen ones first) and who holds each lease, for ``ffdl status``."""
    replicas = session.scalars(select(Replica).order_by(Replica.started_at)).all()
    leases = session.scalars(select(Lease).order_by(Lease.name)).all()
    return {
        "replicas": [
            {
                "id": r.id,
                "url": r.url,
                "host": r.host,
                "pid": r.pid,
                "version": r.version,
                "started_at": r.started_at.isoformat() + "Z",
                "seen_at": r.seen_at.isoformat() + "Z",
                "alive": r.stopped_at is None and now - r.seen_at <= alive_within,
                "runs_loops": r.runs_loops,
                "leads": sorted(
                    lease.name
                    for lease in leases
                    if lease.holder == r.id and lease.expires_at and lease.expires_at > now
                ),
            }
            for r in replicas
        ],
        "leases": [
            {
                "name": lease.name,
                "holder": lease.holder
                if lease.expires_at is not None and lease.expires_at > now
                else None,
                "token": lease.token,
                "expires_at": lease.expires_at.isoformat() + "Z" if lease.expires_at else None,
            }
            for lease in leases
        ],
    }


def live_replica_urls(
    session: Session, *, now: datetime, alive_within: timedelta
) -> tuple[list[str], list[str]]:
    """The addresses of the replicas seen lately, oldest first (learners fail over to them),
    and those of them that serve the API only; one query."""
    rows = session.execute(
        select(Replica.url, Replica.runs_loops)
        .where(Replica.stopped_at.is_(None), Replica.seen_at >= now - alive_within)
        .order_by(Replica.started_at)
    ).all()
    every = list(dict.fromkeys(url for url, _ in rows))
    api_only = list(dict.fromkeys(url for url, runs_loops in rows if not runs_loops))
    return every, api_only


def ensure_fence_held(store: Store) -> None:
    """Raise ``LeaseLost`` now if the current pass's fence no longer holds.

    For side effects outside the database (starting a learner): a commit is checked anyway,
    but a process started by a deposed holder could not be taken back.
    """
    if _FENCE.get() is None:
        return
    with store.read() as session:
        check_fence(session)
