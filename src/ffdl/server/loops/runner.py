"""Running a reconcile step forever: on its timer, when woken, and safely off the event loop.

Among replicas sharing a database a loop runs only while this replica holds its lease
(``ffdl.server.leases``), and each pass runs under the lease's fence, so that the writes of
a pass that outlives the lease are refused.

A pass that meets the database away (``Unavailable``) just ends: the store has logged the
outage once, and the next pass tries again; there is no traceback per pass.

Each loop runs its passes on a thread of its own, not on the event loop's shared pool of
worker threads: with every loop of the platform in one process, and requests' waits on that
pool too, a scheduling pass would otherwise queue for a thread behind the others' work.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ffdl.core.errors import LeaseLost, Unavailable
from ffdl.server.leases import LeaseKeeper, reset_fence, set_fence
from ffdl.server.platform import Wakeups
from ffdl.server.telemetry.instruments import LOOP_PASS_SECONDS

log = logging.getLogger("ffdl.loops")


async def run_forever(
    name: str,
    step: Callable[[], object],
    interval_s: float,
    wakeups: Wakeups,
    min_gap_s: float = 0.0,
    keeper: LeaseKeeper | None = None,
) -> None:
    """Call ``step`` in a worker thread every ``interval_s`` or sooner when ``name`` is woken.

    Wake-ups that arrive during a pass or within ``min_gap_s`` after it are served by one
    further pass, so a burst of submissions costs a few passes, not one each. A failing
    step is logged and retried on the next turn: a loop never dies of one error. With a
    ``keeper``, passes run only while it holds the lease ``name`` (it wakes the loop when it
    takes the lease).
    """
    event = wakeups.event(name)
    thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"ffdl-{name}")
    try:
        while True:
            if min_gap_s > 0:
                await asyncio.sleep(min_gap_s)
            event.clear()
            await run_pass(name, step, keeper, thread)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout=interval_s)
    finally:
        # A pass still running finishes on its own; nothing waits for it here.
        thread.shutdown(wait=False)


async def run_pass(
    name: str, step: Callable[[], object], keeper: LeaseKeeper | None, thread: ThreadPoolExecutor
) -> None:
    """One pass of loop ``name`` on its loop's ``thread``, under its lease's fence if it
    has one."""
    fence = None
    if keeper is not None:
        fence = keeper.fence(name)
        if fence is None:
            return  # another replica runs this loop
        keeper.pass_started(name)
    # The worker thread runs in a copy of this task's context: it sees the fence.
    token = set_fence(fence)
    started = time.perf_counter()
    try:
        context = contextvars.copy_context()
        await asyncio.get_running_loop().run_in_executor(thread, context.run, step)
    except asyncio.CancelledError:
        raise
    except LeaseLost as exc:
        log.warning("%s pass stopped: %s", name, exc)
    except Unavailable as exc:
        log.debug("%s pass stopped: %s", name, exc)
    except Exception:
        log.exception("%s pass failed", name)
    finally:
        LOOP_PASS_SECONDS.labels(name).observe(time.perf_counter() - started)
        reset_fence(token)
        if keeper is not None:
            keeper.pass_ended(name)
