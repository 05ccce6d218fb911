"""The running platform's parts, built once by the app and shared by routers and loops."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime

from ffdl.backends.base import Backend
from ffdl.server.archive import RecordArchive
from ffdl.server.auth import JobTokens
from ffdl.server.credentials import CredentialVault
from ffdl.server.leases import LeaseKeeper
from ffdl.server.passwords import SignIns
from ffdl.server.report_lanes import ReportLanes
from ffdl.server.report_pace import ReportPace
from ffdl.server.settings import Settings
from ffdl.server.store.db import Store
from ffdl.server.store.group_commit import GroupCommit
from ffdl.server.store.transitions import utcnow

log = logging.getLogger("ffdl.server")


class Wakeups:
    """Named wake-up signals for the loops, safe to fire from request threads."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._events: dict[str, asyncio.Event] = {}
        self._lock = threading.Lock()
        self._publish: Callable[[Iterable[str]], None] | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def event(self, name: str) -> asyncio.Event:
        with self._lock:
            return self._events.setdefault(name, asyncio.Event())

    def relay_to(self, publish: Callable[[Iterable[str]], None] | None) -> None:
        """Also send every wake-up to the other replicas through ``publish``
        (``ffdl.server.wakeup_relay``); None stops that."""
        self._publish = publish

    def notify(self, *names: str) -> None:
        """Wake loops ``names`` here and, with a relay, on every other replica."""
        publish = self._publish
        if publish is not None and names:
            publish(names)
        self.notify_here(*names)

    def notify_here(self, *names: str) -> None:
        """Wake loops ``names`` in this process only."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        for name in names:
            ev = self.event(name)
            try:
                loop.call_soon_threadsafe(ev.set)
            except RuntimeError:  # loop shut down between the check and the call
                return


@dataclass
class Platform:
    settings: Settings
    store: Store
    backend: Backend
    job_tokens: JobTokens
    # Seals data-store credentials in stored manifests; see ``ffdl.server.credentials``.
    credentials: CredentialVault
    wakeups: Wakeups = field(default_factory=Wakeups)
    # This replica's loop leases and its entry among the replicas (``ffdl.server.leases``);
    # None for a platform whose loop passes are driven by hand, without leases.
    keeper: LeaseKeeper | None = None
    # HTTP Basic sign-ins: recent successes, failure back-off (``ffdl.server.passwords``).
    sign_ins: SignIns = field(default_factory=SignIns)
    # When this control plane started (naive UTC, like the store's times): silence is
    # measured from here at the earliest, since no controller could be heard before.
    started_at: datetime = field(default_factory=utcnow)
    # Learners' report batches, committed together (``ffdl.server.store.group_commit``).
    report_writes: GroupCommit = field(init=False)
    # Status reports ahead of records-only ones (``ffdl.server.report_lanes``).
    report_lanes: ReportLanes = field(init=False)
    # The gap asked of learners between their posts (``ffdl.server.report_pace``).
    report_pace: ReportPace = field(init=False)
    # Where old log lines and metrics are kept (``ffdl.server.archive``).
    archive: RecordArchive = field(init=False)

    def __post_init__(self) -> None:
        self.report_writes = GroupCommit(self.store)
        self.report_lanes = ReportLanes(self.settings.report_records_at_once)
        settings = self.settings
        longest = settings.heartbeat_timeout_s / 3
        self.report_pace = ReportPace(
            settings.report_posts_per_s,
            longest_s=longest,
            window_s=2 * max(longest, settings.heartbeat_s),
        )
        self.archive = RecordArchive.for_settings(self.settings)

    def close(self) -> None:
        """Release the backend and the database once the loops have stopped."""
        try:
            self.backend.close()
        except Exception:
            # Shutting down goes on: the store must still be released.
            log.exception("closing the %s backend failed", self.backend.name)
        self.store.dispose()
