"""The loops' runner (``ffdl.server.loops.runner``): each loop passes on a thread of its own,
so that a full shared pool of worker threads holds up no scheduling pass, and a pass sees
its lease's fence."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

from ffdl.server.leases import Fence, current_fence
from ffdl.server.loops.runner import run_forever
from ffdl.server.platform import Wakeups

DEADLINE_S = 10.0


class OneLeaseKeeper:
    """Holds the lease of one loop, as a ``LeaseKeeper`` that leads it does."""

    def __init__(self, fence: Fence) -> None:
        self._fence = fence

    def fence(self, name: str) -> Fence | None:
        return self._fence if name == self._fence.name else None

    def pass_started(self, name: str) -> None:
        pass

    def pass_ended(self, name: str) -> None:
        pass


def test_a_pass_runs_on_its_loops_own_thread_while_the_shared_pool_is_full() -> None:
    fence = Fence("scheduler", "replica-a", 7)
    seen: list[tuple[str, Fence | None]] = []
    passed = threading.Event()
    release = threading.Event()

    def step() -> None:
        seen.append((threading.current_thread().name, current_fence()))
        passed.set()

    async def main() -> bool:
        loop = asyncio.get_running_loop()
        shared = ThreadPoolExecutor(max_workers=1)
        loop.set_default_executor(shared)
        # Requests' waits (follows, log streams) fill the shared pool.
        blocked = asyncio.create_task(asyncio.to_thread(release.wait, DEADLINE_S))
        wakeups = Wakeups()
        wakeups.bind(loop)
        keeper = OneLeaseKeeper(fence)
        runner = asyncio.create_task(
            run_forever("scheduler", step, 60.0, wakeups, keeper=keeper)  # type: ignore[arg-type]
        )
        # Waited for on a thread of the test's own: the shared pool is taken.
        waiter = ThreadPoolExecutor(max_workers=1)
        ran = await loop.run_in_executor(waiter, passed.wait, DEADLINE_S)
        waiter.shutdown()
        release.set()
        runner.cancel()
        await asyncio.gather(runner, blocked, return_exceptions=True)
        return ran

    assert asyncio.run(main()), "the pass waited for the shared pool"
    name, seen_fence = seen[0]
    assert name.startswith("ffdl-scheduler")
    assert seen_fence == fence
