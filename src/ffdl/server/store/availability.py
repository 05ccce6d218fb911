"""Whether this process reaches its database now, and what a database fault means.

A fault of the database itself is not a bug of the request or the loop that met it: the
server refused or dropped the connection, is shutting down or starting up, is a read-only
standby, or the pool could not get a connection in time. :func:`fault_of` sorts errors:

- **away** (``DatabaseAway``, an :class:`~ffdl.core.errors.Unavailable`: 503 with
  ``Retry-After``): the operation did not happen and the same one may be tried again once
  the database is back (PostgreSQL restarts and failovers);
- **full** (``DatabaseFull``, an :class:`~ffdl.core.errors.InsufficientStorage`: 507): the
  disk under the database has no room; the transaction rolled back, so nothing of it was
  written (SQLite's ``SQLITE_FULL``, PostgreSQL's ``disk_full``, ``ENOSPC``).

:class:`Availability` is one process's view of its database: ``Store`` tells it of every
fault that means "away" and of every connection handed out after that. It logs one warning
when the database goes away and one line when it is back (never a traceback per request or
loop pass), keeps the ``ffdl_database_up`` gauge, and remembers when the last outage ended:
the job monitor counts no learner's silence from before that moment, since nobody could
record a heartbeat while the database was away.
"""

from __future__ import annotations

import errno
import logging
import re
import sqlite3
import threading
import time
from datetime import datetime
from typing import Literal

from sqlalchemy import exc as sa_exc

from ffdl.core.errors import InsufficientStorage, Unavailable
from ffdl.server.store.transitions import utcnow
from ffdl.server.telemetry.instruments import DATABASE_OUTAGES, DATABASE_UP

log = logging.getLogger("ffdl.store")

Fault = Literal["away", "full"]

# PostgreSQL's SQLSTATEs for a server that is away: class 08 (connection exception), 57P
# (shutting down, crashed, starting up), too many connections, a read-only transaction
# (a standby, or a primary demoted by a failover).
_AWAY_SQLSTATE_PREFIXES = ("08", "57P")
_AWAY_SQLSTATES = frozenset({"53300", "25006"})
_FULL_SQLSTATES = frozenset({"53100"})  # disk_full
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
SQLITE_FULL = 13
# A client should come back after this many seconds (``Retry-After``).
RETRY_AFTER_S = 2


class DatabaseAway(Unavailable):
    """The database cannot be reached now; nothing of the operation was done."""

    def __init__(self, address: str, detail: str) -> None:
        super().__init__(
            f"the platform's database is unreachable ({address}: {detail}); retry",
            retry_after_s=RETRY_AFTER_S,
        )


class DatabaseFull(InsufficientStorage):
    """A write refused for lack of disk space; it was rolled back whole."""

    def __init__(self, where: str, detail: str) -> None:
        super().__init__(
            f"the platform's disk is full ({where}: {detail}); nothing was stored: "
            "free some space and retry"
        )


# DB-API drivers whose own errors can reach the store unwrapped, and the PEP 249 classes
# of theirs that mean the connection, not the statement, failed.
_DRIVERS = frozenset({"psycopg", "sqlite3"})
_CONNECTION_ERRORS = frozenset({"OperationalError", "InterfaceError"})


def fault_of(exc: BaseException, dialect: str) -> Fault | None:
    """Whether ``exc`` means the database is away, its disk full, or neither."""
    if isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS:
        return "full"
    if isinstance(exc, sa_exc.DisconnectionError | sa_exc.TimeoutError):
        return "away"
    if isinstance(exc, sa_exc.PendingRollbackError):
        # Raised while SQLAlchemy handles a commit that failed (the connection dropped
        # under it): the fault is that failure's, a driver error it has not wrapped.
        cause = exc.__context__
        return None if cause is None else fault_of(cause, dialect)
    original: BaseException | None
    if isinstance(exc, sa_exc.DBAPIError):
        original, invalidated = exc.orig, exc.connection_invalidated
    elif _is_driver_error(exc):
        original, invalidated = exc, False
    else:
        return None
    if isinstance(original, sqlite3.Error):
        code = getattr(original, "sqlite_errorcode", None)
        return "full" if code == SQLITE_FULL or "disk is full" in str(original) else None
    sqlstate = str(getattr(original, "sqlstate", None) or "")
    if sqlstate in _FULL_SQLSTATES:
        return "full"
    if invalidated:
        return "away"
    if sqlstate in _AWAY_SQLSTATES or sqlstate.startswith(_AWAY_SQLSTATE_PREFIXES):
        return "away"
    # psycopg's errors without a SQLSTATE (connection refused, a dropped socket) are
    # OperationalError or InterfaceError; those with one were sorted above.
    if dialect == "postgresql" and not sqlstate:
        named = {cls.__name__ for cls in type(original).__mro__}
        return "away" if named & _CONNECTION_ERRORS else None
    return None


def _is_driver_error(exc: BaseException) -> bool:
    """A DB-API driver's own error (PEP 249: its classes derive from one ``Error``)."""
    return any(
        cls.__name__ == "Error" and cls.__module__.split(".")[0] in _DRIVERS
        for cls in type(exc).__mro__
    )


# One server's failure in psycopg's list of them, for a URL naming several servers.
_ATTEMPT = re.compile(
    r"^- host: '([^']*)', port: '([^']*)'.*?: connection failed: .*? failed: (.*)$"
)


def first_line(exc: BaseException) -> str:
    """The cause in one line, for a message (SQLAlchemy adds the statement after it); for a
    URL naming several servers, each server's failure, so that the one that matters shows
    (a primary down, not only its standby being read-only)."""
    original = getattr(exc, "orig", None) or exc
    lines = str(original).strip().splitlines()
    attempts = [m for line in lines if (m := _ATTEMPT.match(line.strip()))]
    if len(attempts) > 1:
        return "; ".join(
            f"{host}:{port}: {reason}" for host, port, reason in (m.groups() for m in attempts)
        )
    return lines[0] if lines else type(original).__name__


class Availability:
    """One process's view of its database: up or away, since when, and the last return."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._lock = threading.Lock()
        self._down_since: datetime | None = None
        self._down_since_monotonic = 0.0
        self._reason = ""
        self._returned_at: datetime | None = None
        DATABASE_UP.set(1)

    def went_away(self, detail: str) -> None:
        """A fault meaning "away" was met; the first of an outage is logged."""
        with self._lock:
            if self._down_since is not None:
                self._reason = detail
                return
            self._down_since = utcnow()
            self._down_since_monotonic = time.monotonic()
            self._reason = detail
        DATABASE_UP.set(0)
        DATABASE_OUTAGES.inc()
        log.warning(
            "database unreachable at %s: %s; requests get 503 and the loops wait until it is back",
            self.address,
            detail,
        )

    def reached(self, asked_at: float | None = None) -> None:
        """A connection worked: an outage, if there was one, is over. ``asked_at`` (monotonic)
        is when the work that got it began: a connection checked just before the database
        went away, whose work only got here after another thread had met the fault, says
        nothing of the database now and does not end the outage."""
        if self._down_since is None:  # the common case, without the lock
            return
        with self._lock:
            if self._down_since is None:
                return
            if asked_at is not None and asked_at < self._down_since_monotonic:
                return
            lasted = time.monotonic() - self._down_since_monotonic
            self._down_since = None
            self._reason = ""
            self._returned_at = utcnow()
        DATABASE_UP.set(1)
        log.warning("database at %s reachable again after %.1f s", self.address, lasted)

    @property
    def down_since(self) -> datetime | None:
        """When the current outage began (naive UTC); None while the database is up."""
        with self._lock:
            return self._down_since

    @property
    def returned_at(self) -> datetime | None:
        """When the last outage this process saw ended (naive UTC); None if none ended."""
        with self._lock:
            return self._returned_at

    def outage(self) -> tuple[str, float] | None:
        """The current outage's reason and how long it has lasted; None while up."""
        with self._lock:
            if self._down_since is None:
                return None
            return self._reason, time.monotonic() - self._down_since_monotonic
