"""The elastic API pool under a step load: a fixed pool of MIN workers, the elastic pool
MIN..MAX, and a fixed pool of MAX workers, side by side.

Each runs as a real ``ffdl up --workers ...`` on 127.0.0.1 with 300 jobs in its store. A
closed-loop load generator (``tests/pool/load.py``: clients sending one request after
another over keep-alive connections) asks for a page of 50 jobs: ``LIGHT`` clients, then a
step to ``HEAVY`` clients, then back. Measured: the requests' latency (p50, p99 over the
whole run and over the step), the requests answered and failed, and the average number of
worker processes alive (the master's children, sampled every 0.1 s: booting and retiring
workers count, since they use the machine too).

The goal: the elastic pool's p99 beats the fixed MIN pool's, at an average worker count
equal to or below the fixed MAX pool's. The load generator shares the machine with the
server, so on few cores the gains are modest and the figures vary between runs.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _server import percentile, wait_for
from bench_api import seed_jobs
from tests.integration.live import FAST_CONFIG
from tests.pool.load import LoadGenerator, Outcome, PoolServer

MIN, MAX = 1, 3
LIGHT, HEAVY = 2, 24
PHASES = ((LIGHT, 5.0), (HEAVY, 20.0), (LIGHT, 10.0))  # (clients, seconds)
JOBS = 300
PATH = "/v1/models?limit=50"
# Quicker than the defaults, so that a 20-s step shows the pool at work.
POLICY = {
    "pool_window_s": 3.0,
    "pool_grow_after_s": 1.0,
    "pool_shrink_after_s": 5.0,
    "pool_cooldown_s": 2.0,
}


@dataclass
class Run:
    name: str
    outcomes: list[Outcome]
    step: tuple[float, float]  # when the heavy step began and ended
    workers: list[tuple[float, int]]  # (time, live worker processes)
    changes: list[dict[str, Any]]

    def latencies(self, start: float = 0.0, end: float = float("inf")) -> list[float]:
        return [o.seconds for o in self.outcomes if start <= o.at - o.seconds < end]

    @property
    def average_workers(self) -> float:
        area = sum(
            (t2 - t1) * n for (t1, n), (t2, _) in zip(self.workers, self.workers[1:], strict=False)
        )
        return area / max(self.workers[-1][0] - self.workers[0][0], 1e-9)


def children(pid: int) -> int:
    try:
        return len(Path(f"/proc/{pid}/task/{pid}/children").read_text().split())
    except OSError:
        return 0


def run(name: str, workers: str, tmp: Path) -> Run:
    home = tmp / name.replace(" ", "-")
    server = PoolServer(home=home, config={**FAST_CONFIG, **POLICY}, workers=workers)
    server.start()  # once, to create the store and the administrator
    server.stop()
    seed_jobs(f"sqlite:///{home / 'ffdl.db'}", JOBS)
    server.start()
    try:
        assert server.proc is not None
        master = server.proc.pid
        low = int(workers.split("..")[0])
        wait_for(lambda: children(master) == low, timeout=30, what=f"{name}: {low} workers")
        samples: list[tuple[float, int]] = []
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.wait(0.1):
                samples.append((time.monotonic(), children(master)))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        load = LoadGenerator(server.url, server.token, PATH, max_clients=HEAVY).start()
        step = (0.0, 0.0)
        for clients, seconds in PHASES:
            load.set(clients)
            began = time.monotonic()
            time.sleep(seconds)
            if clients == HEAVY:
                step = (began, time.monotonic())
        outcomes = load.stop()
        sampling.set()
        sampler.join()
        changes = server.pool()["changes"]
    finally:
        server.stop()
    return Run(name, outcomes, step, samples, changes)


def main() -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        runs = [
            run(f"fixed {MIN}", str(MIN), Path(tmp)),
            run(f"elastic {MIN}..{MAX}", f"{MIN}..{MAX}", Path(tmp)),
            run(f"fixed {MAX}", str(MAX), Path(tmp)),
        ]
    phases = ", ".join(f"{c} clients for {s:g} s" for c, s in PHASES)
    print(f"API pool under a step load ({phases}; GET {PATH}, {JOBS} jobs; {os.cpu_count()} cores)")
    rows: list[tuple[str, Any]] = [
        ("requests answered", lambda r: f"{len(r.outcomes)}"),
        ("failed", lambda r: f"{sum(1 for o in r.outcomes if o.failure)}"),
        ("p50 ms (all)", lambda r: f"{percentile(r.latencies(), 50) * 1000:.1f}"),
        ("p99 ms (all)", lambda r: f"{percentile(r.latencies(), 99) * 1000:.1f}"),
        ("p99 ms (step)", lambda r: f"{percentile(r.latencies(*r.step), 99) * 1000:.1f}"),
        ("average workers", lambda r: f"{r.average_workers:.2f}"),
    ]
    print(f"  {'':<20}" + "".join(f"{r.name:>16}" for r in runs))
    for label, cell in rows:
        print(f"  {label:<20}" + "".join(f"{cell(r):>16}" for r in runs))
    elastic = runs[1]
    print("  elastic pool's changes:")
    for change in elastic.changes:
        print(f"    {change['reason']}")
    result = {
        f"{key}_{i}": value
        for i, r in enumerate(runs)
        for key, value in (
            ("p99_ms", percentile(r.latencies(), 99) * 1000),
            ("step_p99_ms", percentile(r.latencies(*r.step), 99) * 1000),
            ("avg_workers", r.average_workers),
            ("failed", float(sum(1 for o in r.outcomes if o.failure))),
        )
    }
    won = (
        result["p99_ms_1"] < result["p99_ms_0"]
        and result["avg_workers_1"] <= result["avg_workers_2"]
    )
    print(
        f"  elastic vs fixed {MIN}: p99 {result['p99_ms_1']:.0f} vs {result['p99_ms_0']:.0f} ms; "
        f"average workers {result['avg_workers_1']:.2f} vs fixed {MAX}'s "
        f"{result['avg_workers_2']:.2f}: {'goal met' if won else 'goal NOT met'}"
    )
    return result


if __name__ == "__main__":
    main()
