"""The simulator against the real platform: same jobs, same start order, same completion times.

Twenty jobs (each ``python -c "import time; time.sleep(D)"``, D from 1 to 2.5 s, gangs of one
or two learners of one or two GPUs, mixed priorities) go through a real server on two declared
nodes of 2 GPUs, so most of them queue. The simulator then replays the same arrivals (the
server's submission times) with each job lasting its scripted sleep plus one fixed start
overhead, measured once beforehand through the same server on a chain of five one-second jobs
that each take the whole cluster: the median of what each link of the chain takes beyond its
sleep (noticing the previous job ended, placement, deployment, controller start, staging,
status reporting). The median, because one link slowed by a busy machine would otherwise shift
every simulated completion. Measured run times of the twenty jobs are not used. The start order
must be the same, and every completion time (from the first submission) within 10% (or one
start overhead for the first jobs, whose 10% is less than one start's jitter on a busy
machine), plus the jitter this machine showed in the calibration chain (its slowest link less
its fastest) once for every start in the job's chain: the passes that started something up to
and including its own. The overhead is about 0.4-0.5 s per job on an idle machine and the
jitter under 0.1 s; a busy machine widens both, and the bound with them.
"""

from __future__ import annotations

import os
import random
import statistics
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from ffdl.core.resources import Node, Resources
from ffdl.sim.engine import Simulator
from ffdl.sim.policies import make_policy
from ffdl.sim.workload import fixed_duration_job
from tests.integration.live import (
    FAST_CONFIG,
    LiveServer,
    manifest_yaml,
    running_server,
    wait_for,
)

# Live completion times against the simulator's: other work on the machine would skew them.
pytestmark = pytest.mark.serial

NODES = [
    {"name": "node-a", "gpus": 2, "cpus": 8, "memory": "8GiB", "gpu_type": "cpu"},
    {"name": "node-b", "gpus": 2, "cpus": 8, "memory": "8GiB", "gpu_type": "cpu"},
]
SIM_NODES = [Node("node-a", 2, 8.0, 8192, "cpu"), Node("node-b", 2, 8.0, 8192, "cpu")]
CONFIG = {
    **FAST_CONFIG,
    "nodes": NODES,
    "scheduler_interval_s": 0.1,
    "lcm_interval_s": 0.1,
    "monitor_interval_s": 0.1,
}
CPUS, MEMORY_MB = 1, 256
CALIBRATION_SLEEP_S = 1.0
CALIBRATION_JOBS = 5
TOLERANCE = 0.10


def sleep_command(seconds: float) -> str:
    return f'python -c "import time; time.sleep({seconds})"'


def stamp(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def workload() -> list[dict[str, Any]]:
    """Two long top-priority jobs fill the cluster first; the rest queue behind them."""
    rng = random.Random(7)
    jobs: list[dict[str, Any]] = [
        {"learners": 1, "gpus": 2, "sleep": 2.5, "priority": 100},
        {"learners": 2, "gpus": 1, "sleep": 2.5, "priority": 100},
    ]
    for _ in range(18):
        learners, gpus = rng.choice([(1, 1), (1, 1), (2, 1), (1, 2), (2, 2)])
        jobs.append(
            {
                "learners": learners,
                "gpus": gpus,
                "sleep": rng.choice([1.0, 1.5, 2.0, 2.5]),
                "priority": rng.choice([10, 30, 50, 70, 90]),
            }
        )
    return jobs


def manifest(job: dict[str, Any], name: str) -> str:
    return manifest_yaml(
        sleep_command(job["sleep"]),
        name=name,
        learners=job["learners"],
        gpus=job["gpus"],
        cpus=CPUS,
        memory=f"{MEMORY_MB}MiB",
        priority=job["priority"],
    )


class StartOverhead(NamedTuple):
    median_s: float
    spread_s: float


def measure_overhead(server: LiveServer) -> StartOverhead:
    """Seconds a queued job adds to its sleep, from a chain of whole-cluster jobs, and how
    much the links of the chain differ (the machine's jitter on one start).

    Each calibration job takes every GPU, so they run one after another; each link of the
    chain (the first job's submission to its end, then one end to the next) is one sleep
    plus the overhead of one start in a queue: noticing the previous job ended, placing and
    deploying, starting the controllers, reporting.
    """
    probe = {"learners": 2, "gpus": 2, "sleep": CALIBRATION_SLEEP_S, "priority": 100}
    ids = [server.submit_ok(manifest(probe, f"calibration-{i}")) for i in range(CALIBRATION_JOBS)]
    first = server.model(ids[0])["training"]["training_status"]["submitted_at"]
    server.wait_status(ids[-1], {"COMPLETED"}, timeout=60)
    ends = [
        stamp(server.model(job_id)["training"]["training_status"]["completed_at"]) for job_id in ids
    ]
    links = [b - a for a, b in zip([stamp(first), *ends[:-1]], ends, strict=True)]
    return StartOverhead(statistics.median(links) - CALIBRATION_SLEEP_S, max(links) - min(links))


def test_simulator_matches_the_platform_on_queued_gangs(tmp_path: Path) -> None:
    # Whatever earlier tests left for the disk to write goes now, not during the jobs,
    # where it would stall this server's own synchronous writes.
    os.sync()
    with running_server(tmp_path / "home", **CONFIG) as server:
        calibration = measure_overhead(server)
        overhead = calibration.median_s
        assert 0 < overhead < 5, f"implausible start overhead {overhead:.2f} s"

        jobs = workload()
        ids = [server.submit_ok(manifest(job, f"job-{i:02d}")) for i, job in enumerate(jobs)]

        # One list request per poll: twenty detail requests four times a second would keep
        # most of a core busy in the very server whose pace the simulator is matched to.
        def all_done() -> bool:
            page = server.client.get("/v1/models", params={"limit": 100}).json()["models"]
            states = {m["model_id"]: m["training"]["training_status"]["status"] for m in page}
            assert not set(states.values()) & {"FAILED", "CANCELLED"}, states
            return all(states.get(job_id) == "COMPLETED" for job_id in ids)

        wait_for(all_done, timeout=90, interval=0.25, what="jobs")
        models = [server.model(job_id) for job_id in ids]

    statuses = [m["training"]["training_status"] for m in models]
    submitted = [stamp(s["submitted_at"]) for s in statuses]
    completed = [stamp(s["completed_at"]) for s in statuses]
    origin = submitted[0]
    assert max(submitted) < min(completed), "every job must be queued before the first ends"
    placed = [
        stamp(next(e["time"] for e in m["events"] if e["to"] == "PENDING" and e["learner"] is None))
        for m in models
    ]
    live_order = [job_id for _t, job_id in sorted(zip(placed, ids, strict=True))]

    sim_jobs = [
        fixed_duration_job(
            job_id,
            at - origin,
            job["sleep"] + overhead,
            learners=job["learners"],
            per_learner=Resources(job["gpus"], float(CPUS), MEMORY_MB),
            priority=job["priority"],
        )
        for job_id, at, job in zip(ids, submitted, jobs, strict=True)
    ]
    result = Simulator(SIM_NODES, sim_jobs, make_policy("priority-backfill")).run()
    outcomes = {o.id: o for o in result.outcomes}
    priority = {job_id: job["priority"] for job_id, job in zip(ids, jobs, strict=True)}

    def sim_key(job_id: str) -> tuple[float, int, float]:
        start = outcomes[job_id].first_start_s
        assert start is not None
        # Starts in one pass share a time; the scheduler makes them in queue order.
        return (round(start, 6), -priority[job_id], outcomes[job_id].submit_s)

    assert sorted(ids, key=sim_key) == live_order
    # The premise that makes the order meaningful: most jobs waited in the queue.
    assert sum(1 for o in outcomes.values() if (o.queueing_s or 0) > 1.0) >= 15

    # A completion lies at the end of a chain of starts (each pass that started something
    # came after an earlier job ended), and each link of the chain can be off by the jitter
    # the calibration showed: the jitter adds up along the chain, not once.
    start_times = sorted({round(o.first_start_s or 0.0, 6) for o in outcomes.values()})

    def links_to(job_id: str) -> int:
        start = round(outcomes[job_id].first_start_s or 0.0, 6)
        return sum(1 for t in start_times if t <= start)

    for job_id, live_end in zip(ids, completed, strict=True):
        sim_end = outcomes[job_id].finish_s
        assert sim_end is not None
        live = live_end - origin
        # An early job's 10% is less than one start's jitter on a busy machine: no job
        # need match closer than one start overhead, nor closer than the jitter measured
        # on each start of its chain.
        bound = max(TOLERANCE * live, overhead) + calibration.spread_s * links_to(job_id)
        assert abs(sim_end - live) <= bound, (
            f"{job_id}: simulated completion {sim_end:.2f} s, platform {live:.2f} s "
            f"(overhead {overhead:.2f} s, spread {calibration.spread_s:.2f} s, "
            f"{links_to(job_id)} starts in its chain)"
        )
