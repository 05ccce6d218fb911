"""Wake-ups reach the replica that leads a loop: a job submitted to a replica that leads
nothing is scheduled and started at once, not at the leader's next interval
(``ffdl.server.wakeup_relay``, PostgreSQL's LISTEN/NOTIFY); so is one submitted to a
replica that serves the API only (``run_loops: false``), whose learners report to it."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

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
REPORTS_ROUTE = "/v1/internal/jobs/{job_id}/learners/{learner}/reports"
SCRAPE_TOKEN = "scrape-token-for-api-only-replicas"


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

    submit_and_see_it_run_through(second)


def submit_and_see_it_run_through(replica: LiveServer) -> None:
    """A job submitted to ``replica`` starts long before any loop's interval could start it,
    and its end, reported to whichever replica, reaches the leader's loops too."""
    manifest, files = steps_job(3, pause=0.05)
    submitted = time.monotonic()
    job_id = replica.submit_ok(manifest, files)
    replica.wait_status(job_id, {"PROCESSING", "COMPLETED"}, timeout=IN_TIME_S)
    assert time.monotonic() - submitted < IN_TIME_S < SLOW_LOOPS["scheduler_interval_s"]
    replica.wait_status(job_id, {"COMPLETED"}, timeout=IN_TIME_S)


@pytest.fixture
def loops_and_api_only(tmp_path: Path, postgres: PostgresServer) -> Iterator[list[LiveServer]]:
    """A replica that runs the loops, then one that serves the API only."""
    config = {
        **SLOW_LOOPS,
        "database_url": postgres.create_database(),
        "metrics_token": SCRAPE_TOKEN,
    }
    home = tmp_path / "home"
    loops = LiveServer(home=home, config=dict(config), log_name="loops.log")
    api = LiveServer(home=home, config={**config, "run_loops": False}, log_name="api.log")
    started: list[LiveServer] = []
    try:
        for replica in (loops, api):
            replica.start()
            started.append(replica)
        yield started
    finally:
        for replica in started:
            replica.stop()
        with contextlib.suppress(Exception):
            loops.kill_learners()


def report_posts(replica: LiveServer) -> float:
    """The learners' report posts this replica has answered."""
    answer = replica.client.get("/metrics", headers={"Authorization": f"Bearer {SCRAPE_TOKEN}"})
    assert answer.status_code == 200, answer.text
    return sum(
        sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
        if sample.name == "ffdl_api_request_duration_seconds_count"
        and sample.labels.get("route") == REPORTS_ROUTE
    )


def test_a_replica_serving_the_api_only_leads_nothing_yet_its_jobs_start_at_once(
    loops_and_api_only: list[LiveServer],
) -> None:
    loops, api = loops_and_api_only
    assert loops.proc is not None and api.proc is not None

    def both_registered() -> dict[str, Any] | None:
        view = control_plane(api)
        return view if len([r for r in view["replicas"] if r["alive"]]) == 2 else None

    view = wait_for(both_registered, timeout=30, what="both replicas registered")
    roles = {r["pid"]: r["runs_loops"] for r in view["replicas"] if r["alive"]}
    assert roles == {loops.proc.pid: True, api.proc.pid: False}
    pids = {r["id"]: r["pid"] for r in view["replicas"]}
    assert {pids.get(lease["holder"]) for lease in view["leases"]} == {loops.proc.pid}

    submit_and_see_it_run_through(api)
    # The learner reported to the replica that serves the API only, not to the loops'.
    assert report_posts(api) > 0
    assert report_posts(loops) == 0
    holders = {lease["holder"] for lease in control_plane(api)["leases"]}
    assert {pids.get(holder) for holder in holders} == {loops.proc.pid}
