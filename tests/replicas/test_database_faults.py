"""The database as a fault: PostgreSQL killed under running replicas, and failed over.

Each test runs its own PostgreSQL server (it is killed, so it cannot be the session's
shared one). The long version of the second test is ``make chaos-db``.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ffdl.client.http import ApiError, Client
from tests.benchmark_modules import load_benchmark
from tests.integration import views
from tests.integration.live import FAST_CONFIG, LiveServer, serving_replicas, wait_for
from tests.integration.steps_job import steps_job
from tests.postgres import PostgresServer

SCRAPE_TOKEN = "scrape-token-for-database-faults"
# Silence past this fails a learner: the outage below lasts longer.
HEARTBEAT_TIMEOUT_S = 3.0
OUTAGE_S = 2 * HEARTBEAT_TIMEOUT_S


@pytest.fixture
def database() -> Iterator[PostgresServer]:
    with PostgresServer(crash_safe=True) as server:
        yield server


@pytest.fixture
def replicas(tmp_path: Path, database: PostgresServer) -> Iterator[list[LiveServer]]:
    config = {
        **FAST_CONFIG,
        "database_url": database.create_database(),
        "lease_ttl_s": 1.5,
        "heartbeat_timeout_s": HEARTBEAT_TIMEOUT_S,
        "metrics_token": SCRAPE_TOKEN,
    }
    with serving_replicas(tmp_path / "home", config, 2) as replicas:
        yield replicas


def database_up(replica: LiveServer) -> dict[str, float]:
    """The replica's database series, scraped with the scrape token."""
    answer = replica.client.get("/metrics", headers={"Authorization": f"Bearer {SCRAPE_TOKEN}"})
    assert answer.status_code == 200, answer.text
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
        if sample.name.startswith("ffdl_database_")
    }


def starts(replica: LiveServer, job_id: str) -> list[str]:
    return [line for line in views.lines(replica, job_id) if re.match(r"learner 1/1 start=", line)]


def test_an_outage_longer_than_the_heartbeat_timeout_kills_no_job_and_answers_503(
    replicas: list[LiveServer], database: PostgresServer
) -> None:
    first, second = replicas
    manifest, files = steps_job(40, pause=0.2)
    jobs = [replicas[n % 2].submit_ok(manifest, files) for n in range(3)]
    for job_id in jobs:
        wait_for(
            lambda job_id=job_id: len(views.steps(views.lines(first, job_id))) >= 2,
            timeout=60,
            what=f"{job_id} training",
        )
    assert database_up(first)["ffdl_database_up"] == 1

    database.kill()
    health: dict[str, Any] = wait_for(
        lambda: (body := second.client.get("/health").json())["status"] == "degraded" and body,
        timeout=15,
        what="/health degraded",
    )
    assert health["reason"].startswith(f"database unreachable at 127.0.0.1:{database.port}: ")
    assert health["degraded_for_s"] >= 0

    # Requests that need the database: a clear 503 to retry, in FfDL's error shape.
    answer = first.client.get("/v1/models")
    assert answer.status_code == 503, answer.text
    assert answer.headers["Retry-After"] == "2"
    body = answer.json()
    assert (body["code"], body["error"], body["ffdl_code"]) == (503, "Service Unavailable", "S503")
    assert "the platform's database is unreachable" in body["description"]
    assert "not-a-secret" not in answer.text
    refused = second.client.post(
        "/v1/models",
        files={"manifest": ("m.yml", manifest.encode()), "model_definition": ("c.zip", b"PK")},
    )
    assert refused.status_code == 503, refused.text
    assert database_up(second)["ffdl_database_up"] == 0

    # The Python client (and so the CLI) waits the outage out instead of failing.
    notices: list[float] = []
    answers: list[dict[str, Any] | ApiError] = []

    def list_models() -> None:
        with Client(first.url, first.token, on_unavailable=lambda _e, d: notices.append(d)) as c:
            try:
                answers.append(c.list_models())
            except ApiError as exc:
                answers.append(exc)

    waiting = threading.Thread(target=list_models)
    waiting.start()
    wait_for(lambda: notices, timeout=15, what="the client told of the outage")
    # The outage lasts past the heartbeat timeout: silence the monitor must not count.
    wait_for(
        lambda: second.client.get("/health").json().get("degraded_for_s", 0) >= OUTAGE_S,
        timeout=30,
        what=f"an outage of {OUTAGE_S:g} s",
    )
    database.start_again()
    waiting.join(timeout=60)
    assert len(answers) == 1 and isinstance(answers[0], dict), answers
    assert answers[0]["total"] == 3, "the submit refused during the outage made nothing"

    for job_id in jobs:
        model = first.wait_status(job_id, {"COMPLETED", "FAILED"}, timeout=90)
        assert views.status(model) == "COMPLETED", model["training"]["training_status"]
        assert model["restarts"]["taken"] == 0
        assert views.steps(views.lines(second, job_id)) == list(range(1, 41)), job_id
        records = second.client.get(f"/v1/logs/{job_id}/emetrics", params={"pagesize": 100})
        iterations = [int(r["etimes"]["iteration"]["value"]) for r in records.json()["models"]]
        assert iterations == list(range(1, 41)), "every metric once, in order"
        assert len(starts(first, job_id)) == 1, "never killed, never started again"

    wait_for(lambda: second.client.get("/health").json()["status"] == "ok", timeout=15)
    series = database_up(first)
    assert (series["ffdl_database_up"], series["ffdl_database_outages_total"]) == (1, 1)
    # One line when the database went away, one when it came back; no traceback per pass.
    for replica in replicas:
        log = (replica.home / replica.log_name).read_text()
        assert log.count("database unreachable at") == 1, log[-3000:]
        assert log.count("reachable again after") == 1, log[-3000:]
        assert "Traceback" not in log and "pass failed" not in log, log[-3000:]


@pytest.mark.timeout(300)
def test_a_short_database_chaos_run_with_a_failover_loses_nothing(tmp_path: Path) -> None:
    chaos = load_benchmark("chaos_db.py")
    settings = chaos.Settings(
        jobs=5,
        clients=2,
        lines=20,
        pause_s=0.25,
        kills=(4.0,),
        failover=True,
        promote_after_s=1.5,
        gap_s=3.0,
        follow_every=2,
        heartbeat_timeout_s=3.0,
        lease_ttl_s=1.5,
    )
    started = time.monotonic()
    report = chaos.run_chaos(settings, tmp_path / "home")
    chaos.print_report(settings, report, time.monotonic() - started)
    assert report.faults == ["kill 4 s", "failover"]
    assert report.acknowledged == settings.jobs
    assert (report.lost_jobs, report.duplicated_jobs, report.double_deploys) == (0, 0, 0)
    assert report.completed == settings.jobs, report
    assert (report.lines_missing, report.lines_duplicated) == (0, 0), report
    assert report.followed >= 2
    assert (report.followed_missing, report.followed_duplicated) == (0, 0), report
    assert report.server_errors == 0, report.api_statuses
    assert report.tokens_taken_twice == 0
    assert report.failures == []
