"""Wake-ups across replicas, through PostgreSQL's ``LISTEN``/``NOTIFY``.

Each loop runs on the replica that holds its lease. Work that arrives at another replica
(a submission, a report that ends a job, a halt) wakes that replica's loops at once
(``Wakeups``), but the loop that must act may lead elsewhere, where it would wait for its
next interval: a second per submission with the defaults, and the intervals are what an
operator lengthens to spare a large database. So every replica on PostgreSQL relays its
wake-ups: it sends the loop names on the ``ffdl_wakeups`` channel, and every replica
listens there and wakes those loops in its own process. Waking a loop that another
replica leads costs nothing: its pass returns at once without the lease.

Sending happens on a thread of its own, never inside a request's database session:
requests only add names to a set, and a burst of them costs one ``NOTIFY``. A lost
notification (the database away, the listener reconnecting) only delays the work to the
loop's next interval, as without the relay.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import text

from ffdl.server.store.db import Store

log = logging.getLogger("ffdl.server.wakeups")

CHANNEL = "ffdl_wakeups"
# How long the listener waits for a notification before checking whether it should stop,
# and how long it waits before listening again after losing its connection.
LISTEN_POLL_S = 0.5
RECONNECT_S = 1.0
WARN_AFTER_FAILURES = 3


class WakeupRelay:
    """Sends this replica's wake-ups to the others and delivers theirs here.

    ``deliver`` wakes loops in this process only (it must not send them on again).
    """

    def __init__(self, store: Store, replica_id: str, deliver: Callable[[Iterable[str]], None]):
        self._store = store
        self._replica_id = replica_id
        self._deliver = deliver
        self._pending: set[str] = set()
        self._lock = threading.Lock()
        self._wanted = threading.Event()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._failures = 0  # in a row, since the listener last listened
        self._warned = False
        self.sent = 0
        self.received = 0

    def start(self) -> None:
        for target, name in ((self._send_forever, "send"), (self._listen_forever, "listen")):
            thread = threading.Thread(target=target, name=f"wakeup-relay-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stopping.set()
        self._wanted.set()
        for thread in self._threads:
            thread.join(timeout=LISTEN_POLL_S + RECONNECT_S + 5)

    def publish(self, names: Iterable[str]) -> None:
        """Have the other replicas wake ``names`` (soon, on the relay's own thread)."""
        with self._lock:
            self._pending.update(names)
        self._wanted.set()

    def _send_forever(self) -> None:
        while not self._stopping.is_set():
            self._wanted.wait()
            self._wanted.clear()
            with self._lock:
                names, self._pending = self._pending, set()
            if not names or self._stopping.is_set():
                continue
            payload = f"{self._replica_id} {','.join(sorted(names))}"
            try:
                with self._store.engine.connect() as conn:
                    conn.execute(
                        text("SELECT pg_notify(:channel, :payload)"),
                        {
                            "channel": CHANNEL,
                            "payload": payload,
                        },
                    )
                    conn.commit()
                self.sent += 1
            except Exception as exc:
                # The store's availability logs an outage once; the loops' own intervals
                # cover a wake-up lost to it.
                log.debug("wake-up not relayed (%s)", exc)

    def _listen_forever(self) -> None:
        while not self._stopping.is_set():
            try:
                self._listen()
            except Exception as exc:
                self._failures += 1
                # An outage of the database is the store's to log, once: the listener only
                # speaks up when it keeps failing while the store reaches the database.
                if (
                    not self._warned
                    and self._failures >= WARN_AFTER_FAILURES
                    and self._store.availability.down_since is None
                    and not self._stopping.is_set()
                ):
                    log.warning(
                        "not hearing other replicas' wake-ups (%s); their work waits for "
                        "the loops' intervals until this reconnects",
                        self._store.unreachable_message(exc),
                    )
                    self._warned = True
                self._stopping.wait(RECONNECT_S)

    def _listen(self) -> None:
        # A connection of its own, taken out of the pool for good: LISTEN belongs to the
        # session, and the pool must never hand this one to a request.
        pooled = self._store.engine.raw_connection()
        conn: Any = pooled.driver_connection
        pooled.detach()
        try:
            conn.autocommit = True
            conn.execute(f"LISTEN {CHANNEL}")
            if self._warned:
                log.info("relaying wake-ups between replicas again")
            self._warned = False
            self._failures = 0
            while not self._stopping.is_set():
                for note in conn.notifies(timeout=LISTEN_POLL_S):
                    self._received(str(note.payload))
        finally:
            conn.close()

    def _received(self, payload: str) -> None:
        sender, _, names = payload.partition(" ")
        if sender == self._replica_id or not names:
            return
        self.received += 1
        self._deliver(name for name in names.split(",") if name)
