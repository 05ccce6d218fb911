"""Group commit: many threads' small writes in one transaction, one commit for them all.

Every learner's report batch is a small write, and a database commits only so many times a
second (each commit waits for its log to reach the disk: SQLite's ``synchronous=FULL``,
PostgreSQL's WAL flush). With one transaction per batch, a few hundred learners fill that
rate and everything else waits behind them (docs/scale.md). So writes that arrive together
are committed together, as PostgreSQL groups its own WAL flushes:

- a thread hands its write (a function of a session) to :meth:`GroupCommit.run` and waits;
- if no write is being committed, it leads: it takes every write queued now (in arrival
  order, sorted by ``key`` so that groups in several replicas lock rows in one order) and
  runs each in its own savepoint of one transaction, then commits once;
- a write that raises rolls back its savepoint only: its caller gets that exception, the
  others' writes commit (unless what it raised is the database going away or its disk
  filling up: that fails the transaction, as below). Observations waiting for the commit
  (``telemetry.instruments``) of the writes that stay are kept;
- if the transaction fails as a whole (the database away, a deadlock between replicas),
  each write of the group runs again alone, so that one write never fails another's;
- writes queued meanwhile form the next group, led by one of their own threads.

A caller gets its write's result, or its exception, only after its commit: what it answers
is durable. Writes of one key (one job) stay in their arrival order.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from sqlalchemy.orm import Session

from ffdl.core.errors import Unavailable
from ffdl.server.store.availability import fault_of
from ffdl.server.store.db import Store
from ffdl.server.telemetry.instruments import PENDING_OBSERVATIONS

T = TypeVar("T")
# At most this many writes in one transaction: a group's locks and its savepoints stay small.
MAX_GROUP = 256


class _Write(Generic[T]):
    __slots__ = ("done", "error", "key", "result", "work")

    def __init__(self, key: str, work: Callable[[Session], T]) -> None:
        self.key = key
        self.work = work
        self.done = False
        self.result: T | None = None
        self.error: BaseException | None = None


class GroupCommit:
    """Commits the writes of many threads together (see the module)."""

    def __init__(self, store: Store, max_group: int = MAX_GROUP) -> None:
        self._store = store
        self._max_group = max_group
        self._changed = threading.Condition()
        self._queue: list[_Write[Any]] = []
        self._leading = False
        # How many transactions and writes went through: for tests and benchmarks.
        self.commits = 0
        self.writes = 0

    def waiting(self) -> int:
        """How many writes are queued for the next group."""
        with self._changed:
            return len(self._queue)

    def run(self, key: str, work: Callable[[Session], T]) -> T:
        """``work(session)`` committed (with others'); its result, or its exception."""
        write: _Write[T] = _Write(key, work)
        with self._changed:
            self._queue.append(write)
            while not write.done:
                if self._leading:
                    self._changed.wait()
                    continue
                self._leading = True
                group = self._queue[: self._max_group]
                del self._queue[: self._max_group]
                self._changed.release()
                try:
                    self._commit_group(group)
                finally:
                    for unfinished in group:  # only if the leader itself was interrupted
                        if not unfinished.done:
                            _fail(unfinished, RuntimeError("the group's commit was interrupted"))
                    self._changed.acquire()
                    self._leading = False
                    self._changed.notify_all()
        if write.error is not None:
            raise write.error
        return write.result  # type: ignore[return-value]

    def _commit_group(self, group: list[_Write[Any]]) -> None:
        ordered = sorted(group, key=lambda write: write.key)  # stable: arrival order per key
        try:
            self._transaction(ordered)
        except BaseException as exc:
            if len(ordered) == 1 or isinstance(exc, Unavailable):
                for write in ordered:  # the database is away: no write alone does better
                    _fail(write, exc)
                return
            for write in ordered:  # each alone: one write's trouble is not the others'
                try:
                    self._transaction([write])
                except BaseException as alone:
                    _fail(write, alone)
            return

    def _transaction(self, writes: list[_Write[Any]]) -> None:
        for write in writes:
            write.error = None
        with self._store.write() as session:
            for write in writes:
                kept = list(session.info.get(PENDING_OBSERVATIONS, ()))
                try:
                    with session.begin_nested():
                        write.result = write.work(session)
                except Exception as exc:  # the caller's to handle; the others commit
                    if fault_of(exc, self._store.dialect) is not None:
                        # The database went away (or its disk filled) under this write: the
                        # transaction's trouble, answered as such (``Store.write``), not
                        # this write's to swallow while the others try to commit.
                        raise
                    write.error = exc
                    session.info[PENDING_OBSERVATIONS] = kept
        self.commits += 1
        self.writes += len(writes)
        for write in writes:
            write.done = True


def _fail(write: _Write[Any], error: BaseException) -> None:
    write.error = error
    write.done = True
