"""The scheduler loop's whole pass at fleet scale, against the goal of 200 ms at the p99.

One pass is what the platform's scheduler loop runs each interval: read the queue, the
running jobs and the nodes from the database (``SchedulerLoop.snapshot``), decide
(``ffdl.scheduler.policy.schedule``) and write the starts and queue positions
(``SchedulerLoop.apply``). The cluster is 10,000 declared nodes of 8 GPUs (a rack label
every 40) holding 2,000 one-GPU jobs; before each pass, 50 jobs are submitted (one to
eight GPUs per learner, one or two learners: a two-learner job of 8 GPUs each spans two
nodes), as a busy fleet sees between two passes. The database is a real SQLite file (or a
PostgreSQL server the benchmark starts, ``--database postgresql``); the nodes come from the
test double backend, which only lists them. Printed: the pass's p50 and p99 and each
part's, in milliseconds. As a replica does after start-up, the set-up's objects are frozen
out of the garbage collector's walks before the passes (``--no-freeze``: they are not).

``--beside-requests F`` runs the passes beside a thread that keeps the interpreter busy a
fraction F of each 10 ms, as the event loop of a replica serving requests does: the pass's
thread waits for the interpreter lock behind it, at every database call. Compare with F = 0,
the pass in a replica that serves the API to nobody (``run_loops`` on one replica,
``--api-only`` on the others).

``--leases`` runs each pass under its lease's fence, as a replica's loop does, with the
replica's lease round (``LeaseKeeper.tick``) every third of ``lease_ttl_s`` on a thread of
its own: each pass's commit then locks its lease row to check the fence, and waits while a
round holds it.

Run: ``python benchmarks/bench_scheduler_pass.py [--passes 40] [--database postgresql]
[--no-freeze] [--beside-requests 0.5] [--leases]``.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ffdl.backends.fake import FakeBackend
from ffdl.core.resources import LearnerPlacement, Node, Placement
from ffdl.core.status import JobStatus
from ffdl.server.auth import JobTokens
from ffdl.server.credentials import CredentialVault
from ffdl.server.leases import LeaseKeeper, fenced, install_fence_check
from ffdl.server.loops import scheduler as scheduler_loop
from ffdl.server.platform import Platform
from ffdl.server.settings import Settings
from ffdl.server.store.db import Store
from ffdl.server.store.models import Job
from ffdl.server.store.transitions import utcnow

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.server.factories import DATABASES, job_row, make_store  # noqa: E402

GOAL_P99_MS = 200.0
NODES = 10_000
GPUS_PER_NODE = 8
RUNNING = 2_000
ARRIVALS = 50
SECRET = b"b" * 32
T = TypeVar("T")


def seed(store: Store, nodes: list[Node]) -> None:
    with store.write() as session:
        for index in range(RUNNING):
            node = nodes[index % len(nodes)]
            gpu = index // len(nodes) % GPUS_PER_NODE
            placement = Placement((LearnerPlacement(1, node.name, (gpu,)),))
            session.add(
                job_row(
                    f"running-{index:05d}",
                    status=JobStatus.PROCESSING.value,
                    placement=placement.to_json(),
                    started_at=utcnow(),
                )
            )


def submit(store: Store, rng: random.Random, first: int) -> None:
    with store.write() as session:
        for index in range(first, first + ARRIVALS):
            gpus = rng.choice((1, 2, 4, 8))
            session.add(
                job_row(
                    f"queued-{index:06d}",
                    gpus=gpus,
                    learners=rng.choice((1, 1, 2)),
                    cpus=float(gpus),
                )
            )


def _timed(samples: list[float], call: Callable[..., T]) -> Callable[..., T]:
    def timed(*args: Any, **kwargs: Any) -> T:
        start = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            samples.append((time.perf_counter() - start) * 1000.0)

    return timed


def keep_busy(duty: float, stop: threading.Event) -> None:
    """Hold the interpreter ``duty`` of every 10 ms with pure Python, as request handling does."""
    while not stop.is_set():
        until = time.perf_counter() + 0.010 * duty
        while time.perf_counter() < until:
            sum(range(200))
        time.sleep(0.010 * (1 - duty))


def tick_leases(keeper: LeaseKeeper, every_s: float, stop: threading.Event) -> None:
    """The replica's lease round, as the app runs it."""
    while not stop.wait(every_s):
        keeper.tick()


def _p50_p99(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, round(0.99 * len(ordered)))]


def main() -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=40)
    parser.add_argument("--database", choices=DATABASES, default="sqlite")
    parser.add_argument(
        "--no-freeze",
        action="store_true",
        help="leave the set-up's objects to the garbage collector (a replica freezes them)",
    )
    parser.add_argument(
        "--beside-requests",
        type=float,
        default=0.0,
        metavar="F",
        help="a thread keeps the interpreter busy this fraction of the time (0 to 0.95)",
    )
    parser.add_argument(
        "--leases",
        action="store_true",
        help="run each pass under its lease's fence, beside the replica's lease rounds",
    )
    args, _ = parser.parse_known_args()
    if args.passes < 1:
        parser.error("--passes must be at least 1")
    if not 0 <= args.beside_requests <= 0.95:
        parser.error("--beside-requests must be between 0 and 0.95")

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        store = make_store(home, args.database)
        nodes = [
            Node(
                name=f"node-{index:05d}",
                gpus=GPUS_PER_NODE,
                cpus=64.0,
                memory_mb=GPUS_PER_NODE * 32_768,
                gpu_type="a100",
                labels={"rack": f"rack-{index // 40:03d}"},
            )
            for index in range(NODES)
        ]
        seed(store, nodes)
        platform = Platform(
            settings=Settings(home=home / "home"),
            store=store,
            backend=FakeBackend(nodes),
            job_tokens=JobTokens(SECRET),
            credentials=CredentialVault(SECRET),
        )
        if not args.no_freeze:  # as a replica does once it has started (ffdl.server.main)
            gc.collect()
            gc.freeze()
        loop = scheduler_loop.SchedulerLoop(platform)
        parts: dict[str, list[float]] = {"snapshot": [], "decide": [], "apply": []}
        loop.snapshot = _timed(parts["snapshot"], loop.snapshot)  # type: ignore[method-assign]
        loop.apply = _timed(parts["apply"], loop.apply)  # type: ignore[method-assign]
        scheduler_loop.schedule = _timed(parts["decide"], scheduler_loop.schedule)
        rng = random.Random(5)
        passes: list[float] = []
        stop = threading.Event()
        if args.beside_requests > 0:
            busy = threading.Thread(target=keep_busy, args=(args.beside_requests, stop))
            busy.start()
        keeper: LeaseKeeper | None = None
        if args.leases:
            install_fence_check()
            ttl_s = platform.settings.lease_ttl_s
            keeper = LeaseKeeper(
                store,
                replica_id="bench",
                url="http://127.0.0.1:1",
                version="bench",
                ttl_s=ttl_s,
                hang_s=platform.settings.loop_hang_s,
            )
            keeper.tick()
            rounds = threading.Thread(
                target=tick_leases, args=(keeper, ttl_s / 3, stop), daemon=True
            )
            rounds.start()
        try:
            for index in range(args.passes + 1):
                submit(store, rng, index * ARRIVALS)
                fence = keeper.fence("scheduler") if keeper is not None else None
                start = time.perf_counter()
                if fence is not None:
                    with fenced(fence):
                        loop()
                else:
                    loop()
                if index:  # the first pass warms caches and the database's pages
                    passes.append((time.perf_counter() - start) * 1000.0)
        finally:
            stop.set()
        for samples in parts.values():
            del samples[0]
        with store.read() as session:
            started = session.query(Job).filter(Job.status == JobStatus.PENDING.value).count()
        store.dispose()

    results: dict[str, float] = {}
    beside = (
        f", beside a thread busy {args.beside_requests:.0%} of the time"
        if args.beside_requests
        else ""
    )
    if args.leases:
        beside += ", under the scheduler's lease beside the lease rounds"
    print(f"{NODES:,} nodes, {RUNNING:,} running, {ARRIVALS} submitted before each pass{beside}")
    print(f"{'':<10}{'p50 ms':>9}{'p99 ms':>9}")
    for name, samples in [("pass", passes), *parts.items()]:
        p50, p99 = _p50_p99(samples)
        results[f"{name}_p50_ms"], results[f"{name}_p99_ms"] = p50, p99
        print(f"{name:<10}{p50:>9.1f}{p99:>9.1f}")
    print(f"goal: pass p99 < {GOAL_P99_MS:.0f} ms; {started} jobs started in all")
    return results


if __name__ == "__main__":
    main()
