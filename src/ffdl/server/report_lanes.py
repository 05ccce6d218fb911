"""Two lanes for learners' reports, so that a batch that changes a learner's state is not
queued behind log lines.

Nearly every report batch carries only log lines and metrics. On a busy replica those
batches fill its worker threads, and every thread then shares the interpreter with the
rest: a learner's first report, the one that moves its job to PROCESSING, or its final
status, would wait behind them all. Records-only batches therefore take a thread only
``report_records_at_once`` at a time (they wait their turn on a semaphore, on the event
loop, holding no thread), while every other batch (a status, GPU samples, an empty
heartbeat) goes to a thread at once. ``ffdl_report_batches{lane, state}`` counts both.
Learners spool what is not yet acknowledged, so a records batch that waits longer is late,
never lost; one whose sender gave up waiting is dropped at its turn, not stored for nobody.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from ffdl.core.errors import Unavailable
from ffdl.server.telemetry.instruments import REPORT_BATCHES

T = TypeVar("T")

# The kinds of report item a batch may carry and still wait in the records lane (and be
# stored without ORM objects: ``services/reports.py``).
RECORD_KINDS = frozenset({"log", "emetric"})


def records_only(items: Iterable[dict[str, Any]]) -> bool:
    """Whether a batch's items are all log lines and metrics (and there is at least one)."""
    seen = False
    for item in items:
        if item.get("type") not in RECORD_KINDS:
            return False
        seen = True
    return seen


class ReportLanes:
    """Lets records-only batches through ``records_at_once`` at a time; others at once."""

    def __init__(self, records_at_once: int) -> None:
        if records_at_once < 1:
            raise ValueError(f"records_at_once must be at least 1, not {records_at_once}")
        self.records_at_once = records_at_once
        # Bound to the event loop that first uses it: a test may serve one app from
        # several loops in turn, so one semaphore is kept per loop.
        self._semaphores: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}

    async def run(
        self,
        items: Iterable[dict[str, Any]],
        store: Callable[[], Awaitable[T]],
        abandoned: Callable[[], Awaitable[bool]] | None = None,
    ) -> T:
        """Await ``store()`` in the lane the batch of ``items`` belongs to.

        A records batch whose sender has gone by its turn (``abandoned()``: it gave up
        waiting, and will send the same items again) is not stored: refused with
        ``Unavailable``, so that a backlog does not grow with work nobody waits for.
        """
        if not records_only(items):
            with _counted("status", "storing"):
                return await store()
        semaphore = self._semaphore()
        with _counted("records", "waiting"):
            await semaphore.acquire()
        try:
            if abandoned is not None and await abandoned():
                raise Unavailable("the sender left before this batch's turn; nothing stored")
            with _counted("records", "storing"):
                return await store()
        finally:
            semaphore.release()

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        semaphore = self._semaphores.get(loop)
        if semaphore is None:
            for old in [known for known in self._semaphores if known.is_closed()]:
                del self._semaphores[old]
            semaphore = self._semaphores[loop] = asyncio.Semaphore(self.records_at_once)
        return semaphore


@contextmanager
def _counted(lane: str, state: str) -> Iterator[None]:
    gauge = REPORT_BATCHES.labels(lane=lane, state=state)
    gauge.inc()
    try:
        yield
    finally:
        gauge.dec()
