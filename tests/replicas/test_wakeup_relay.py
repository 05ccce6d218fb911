"""Wake-ups reach the replica that leads a loop: a job submitted to a replica that leads
nothing is scheduled and started at once, not at the leader's next interval
(``ffdl.server.wakeup_relay``, PostgreSQL's LISTEN/NOTIFY)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.live import FAST_CONFIG, LiveServer, serving_replicas, wait_for
from tests.integration.steps_job import steps_job
from tests.postgres import PostgresServer
from tests.replicas.test_replicas_live import control_plane

# Intervals far longer than the test waits: only a wake-up can move the job in time.
SLOW_LOOPS = {
    **FAST_CONFIG,
    "lease_ttl_s": 3.0,
    "scheduler_interval_s": 120.0,
    "lcm_interval_s": 120.0,
    "monitor_interval_s": 120.0,
    "autoscaler_interval_s": 120.0,
    # Every loop stays with the first replica, so that the second one leads none.
    "spread_loops": False,
}
IN_TIME_S = 15.0


@pytest.fixture
def two_replicas(tmp_path: Path, postgres: PostgresServer) -> Iterator[list[LiveServer]]:
    config = {**SLOW_LOOPS, "database_url": postgres.create_database()}
    with serving_replicas(tmp_path / "home", config, 2) as replicas:
        yield replicas


def test_a_submission_to_a_replica_that_leads_nothing_starts_at_once(
    two_replicas: list[LiveServer],
) -> None:
    first, second = two_replicas
    assert first.proc is not None

    def one_leader() -> str | None:
        view = control_plane(second)
        holders = {lease["holder"] for lease in view["leases"]}
        pids = {r["id"]: r["pid"] for r in view["replicas"]}
        (holder,) = holders if len(holders) == 1 else (None,)
        return holder if holder is not None and pids.get(holder) == first.proc.pid else None

    # The first replica took every loop when it started alone; the second leads none.
    wait_for(one_leader, timeout=30, what="the first replica to lead every loop")

    manifest, files = steps_job(3, pause=0.05)
    submitted = time.monotonic()
    job_id = second.submit_ok(manifest, files)
    second.wait_status(job_id, {"PROCESSING", "COMPLETED"}, timeout=IN_TIME_S)
    assert time.monotonic() - submitted < IN_TIME_S < SLOW_LOOPS["scheduler_interval_s"]
    # The job's end, reported to whichever replica, reaches the leader's loops too.
    second.wait_status(job_id, {"COMPLETED"}, timeout=IN_TIME_S)
