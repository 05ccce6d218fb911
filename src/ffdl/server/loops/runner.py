"""Running a reconcile step forever: on its timer, when woken, and safely off the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from ffdl.server.platform import Wakeups

log = logging.getLogger("ffdl.loops")


async def run_forever(
    name: str,
    step: Callable[[], object],
    interval_s: float,
    wakeups: Wakeups,
    min_gap_s: float = 0.0,
) -> None:
    """Call ``step`` in a worker thread every ``interval_s`` or sooner when ``name`` is woken.

    Wake-ups that arrive during a pass or within ``min_gap_s`` after it are served by one
    further pass, so a burst of submissions costs a few passes, not one each. A failing
    step is logged and retried on the next turn: a loop never dies of one error.
    """
    event = wakeups.event(name)
    while True:
        if min_gap_s > 0:
            await asyncio.sleep(min_gap_s)
        event.clear()
        try:
            await asyncio.to_thread(step)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s pass failed", name)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout=interval_s)
