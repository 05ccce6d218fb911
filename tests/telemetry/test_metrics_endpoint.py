"""``GET /metrics`` on a real server: parsed with Prometheus's own parser, series that move
as jobs move, and each caller seeing only what it may."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.live import (
    FAST_CONFIG,
    LiveServer,
    code_zip,
    manifest_yaml,
    serving,
    wait_for,
)

SCRAPE_TOKEN = "scrape-token-0123456789abcdef"
TEAM_B = "team-b"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@dataclass
class World:
    server: LiveServer
    member_b: str  # a member of TEAM_B's token


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    home = tmp_path_factory.mktemp("metrics") / "home"
    config = {**FAST_CONFIG, "metrics_token": SCRAPE_TOKEN}
    with serving(LiveServer(home=home, config=config)) as server:
        assert server.client.post("/v1/tenants", json={"id": TEAM_B}).status_code == 201
        created = server.client.post(f"/v1/tenants/{TEAM_B}/users", json={"name": "bob"})
        assert created.status_code == 201, created.text
        yield World(server, str(created.json()["token"]))


def scrape(server: LiveServer, token: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(f"{server.url}/metrics", headers=headers, timeout=30)


def samples(server: LiveServer, token: str = SCRAPE_TOKEN) -> Samples:
    response = scrape(server, token)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=")
    found: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            found[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return found


def value(found: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 when none)."""
    wanted = set(labels.items())
    return sum(v for (n, got), v in found.items() if n == name and wanted <= got)


def names(found: Samples) -> set[str]:
    return {name for name, _ in found}


def tenants(found: Samples) -> set[str]:
    return {dict(labels)["tenant"] for _, labels in found if "tenant" in dict(labels)}


def test_a_scrape_needs_a_credential_and_a_wrong_one_is_refused(world: World) -> None:
    missing = scrape(world.server, None)
    assert missing.status_code == 401
    assert missing.json()["ffdl_code"]
    assert scrape(world.server, "not-the-scrape-token-at-all").status_code == 401


def test_series_move_as_a_job_runs_and_completes(world: World) -> None:
    server = world.server
    before = samples(server)
    job_id = server.submit_ok(manifest_yaml("python -c \"print('hello')\"", gpus=1))
    server.wait_status(job_id, {"COMPLETED"}, timeout=60)
    server.model(job_id)  # a request on a route with a path parameter
    after = samples(server)

    tenant = server.model(job_id)["tenant"]
    assert value(after, "ffdl_jobs", tenant=tenant, status="COMPLETED") == (
        value(before, "ffdl_jobs", tenant=tenant, status="COMPLETED") + 1
    )
    for histogram in ("ffdl_queue_delay_seconds_count", "ffdl_submit_to_processing_seconds_count"):
        assert value(after, histogram, tenant=tenant) == value(before, histogram, tenant=tenant) + 1
    assert value(after, "ffdl_job_transitions_total", tenant=tenant, status="COMPLETED") >= 1
    # Latency by route template, never by raw path: no job id in any label.
    assert value(after, "ffdl_api_request_duration_seconds_count", route="/v1/models/{model_id}")
    assert not any(job_id in v for _, labels in after for _k, v in labels)
    assert value(after, "ffdl_loop_pass_duration_seconds_count", loop="scheduler") > value(
        before, "ffdl_loop_pass_duration_seconds_count", loop="scheduler"
    )
    assert value(after, "ffdl_deploy_duration_seconds_count") >= 1
    assert value(after, "ffdl_node_gpus", node="node-a") == 4
    assert value(after, "ffdl_nodes", gpu_type="cpu") == 1
    assert value(after, "ffdl_gpus", gpu_type="cpu") == 4


def test_past_the_node_limit_only_the_per_type_totals_are_scraped(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    nodes = [
        {"name": f"n{i}", "gpus": 8, "cpus": 16, "memory": "64GiB", "gpu_type": kind}
        for i, kind in enumerate(["h100", "h100", "a100"])
    ]
    home = tmp_path_factory.mktemp("many-nodes") / "home"
    config = {
        **FAST_CONFIG,
        "nodes": nodes,
        "metrics_token": SCRAPE_TOKEN,
        "metrics_node_series_max": 2,
    }
    with serving(LiveServer(home=home, config=config)) as server:
        job_id = server.submit_ok(manifest_yaml("sleep 30", gpus=2, gpu_type="a100"))
        server.wait_status(job_id, {"PROCESSING"}, timeout=60)
        found = samples(server)
        server.client.delete(f"/v1/models/{job_id}")
    assert not {"ffdl_node_gpus", "ffdl_node_gpus_allocated", "ffdl_node_gpus_busy"} & names(found)
    assert value(found, "ffdl_nodes", gpu_type="h100") == 2
    assert value(found, "ffdl_gpus", gpu_type="h100") == 16
    assert value(found, "ffdl_gpus", gpu_type="a100") == 8
    assert value(found, "ffdl_gpus_allocated", gpu_type="a100") == 2
    assert value(found, "ffdl_gpus_allocated", gpu_type="h100") == 0


def test_a_failure_is_counted_by_its_code(world: World) -> None:
    server = world.server
    before = samples(server)
    job_id = server.submit_ok(manifest_yaml('python -c "raise SystemExit(3)"'))
    failed = server.wait_status(job_id, {"FAILED"}, timeout=60)
    code = failed["training"]["training_status"]["error_code"]
    tenant = failed["tenant"]
    after = samples(server)
    assert value(after, "ffdl_failures_total", tenant=tenant, error_code=code) == (
        value(before, "ffdl_failures_total", tenant=tenant, error_code=code) + 1
    )


def test_a_running_jobs_gpu_and_progress_series_come_from_the_store(world: World) -> None:
    server = world.server
    job_id = server.submit_ok(
        manifest_yaml("python -c \"import time; print('up', flush=True); time.sleep(60)\"", gpus=2)
    )
    server.wait_status(job_id, {"PROCESSING"}, timeout=60)
    tenant = server.model(job_id)["tenant"]
    # What GPU sampling and progress reports write, written here straight into the store.
    progress = {"fraction": 0.25, "estimated_end_at": time.time() + 3600, "samples_rate": 512.0}
    with sqlite3.connect(server.home / "ffdl.db") as db:
        db.execute(
            "UPDATE learners SET gpu_util = 75, gpu_memory_mb = 1024 WHERE job_id = ?", (job_id,)
        )
        db.execute(
            "UPDATE jobs SET gpu_util_avg = 60, gpu_idle_flagged_at = 1.0, progress = ? "
            "WHERE id = ?",
            (json.dumps(progress), job_id),
        )
    try:
        found = samples(server)
        job = {"tenant": tenant, "job": job_id}
        assert value(found, "ffdl_learner_gpu_utilization_ratio", **job) == 0.75
        assert value(found, "ffdl_learner_gpu_memory_used_bytes", **job) == 1024 * 1024 * 1024
        assert value(found, "ffdl_job_gpus_idle", **job) == 1
        assert value(found, "ffdl_job_gpus", **job) == 2
        assert value(found, "ffdl_job_progress_ratio", **job) == 0.25
        assert 3500 < value(found, "ffdl_job_remaining_seconds", **job) <= 3600
        assert value(found, "ffdl_job_samples_per_second", **job) == 512
        assert value(found, "ffdl_node_gpus_allocated", node="node-a") == 2
        assert value(found, "ffdl_node_gpus_busy", node="node-a") == 1.5
        assert value(found, "ffdl_learners", tenant=tenant, status="PROCESSING") == 1
        assert value(found, "ffdl_learner_heartbeat_age_seconds", **job) < 20
    finally:
        assert server.client.delete(f"/v1/models/{job_id}").status_code in (200, 202)


def test_a_member_sees_only_its_tenants_series(world: World) -> None:
    server = world.server
    bob = httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {world.member_b}"}, timeout=30
    )
    # The first takes every GPU of the node, so the second waits QUEUED.
    holder = submit_as(bob, "import time\ntime.sleep(120)\n")
    waiting = submit_as(bob, "pass\n")

    def queued() -> bool:
        return value(samples(server), "ffdl_queue_length", tenant=TEAM_B) == 1

    wait_for(queued, timeout=30, what="team-b's queue length at 1")
    mine = samples(server, world.member_b)
    assert tenants(mine) == {TEAM_B}
    assert value(mine, "ffdl_queue_length", tenant=TEAM_B) == 1
    # Nothing that mixes tenants: no node series, no API latency.
    assert not {"ffdl_node_gpus", "ffdl_api_request_duration_seconds_count"} & names(mine)
    everything = samples(server)
    assert len(tenants(everything)) >= 2
    for job_id in (waiting, holder):
        assert bob.delete(f"/v1/models/{job_id}").status_code in (200, 202)
    bob.close()


def submit_as(client: httpx.Client, code: str) -> str:
    manifest = manifest_yaml("python train.py", gpus=4)
    response = client.post(
        "/v1/models",
        files={
            "manifest": ("manifest.yml", manifest.encode()),
            "model_definition": ("code.zip", code_zip({"train.py": code})),
        },
    )
    assert response.status_code == 201, response.text
    return str(response.json()["model_id"])
