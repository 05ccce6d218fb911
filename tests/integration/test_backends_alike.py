"""Halt, resume, rescale, delete, drain and preemption behave the same on every backend.

Each test runs twice: on the local backend with three declared nodes, and on the Ray
backend with a real three-node Ray cluster on 127.0.0.1 of the same shape (nodes ``a``,
``b`` in rack r1 and ``c`` in rack r2, 4 GPUs each). Each test leaves every node undrained
and none of its jobs running.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration import views
from tests.integration.live import (
    FAST_CONFIG,
    LiveServer,
    free_port,
    job_pids,
    serving,
    wait_for,
)
from tests.integration.steps_job import steps_job

NODES = {"a": "r1", "b": "r1", "c": "r2"}


ELASTIC = {"gpus": {"min": 1, "max": 4}, "batch_size": {"min": 64, "max": 256}}


def _config() -> dict[str, Any]:
    config = {k: v for k, v in FAST_CONFIG.items() if k != "nodes"}
    config.update(autoscaler_interval_s=0.5, min_rescale_interval_s=3600, halt_grace_s=5)
    return config


@pytest.fixture(scope="module", params=["local", pytest.param("ray", marks=pytest.mark.ray)])
def platform(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp(request.param)
    config = _config()
    cluster = None
    if request.param == "local":
        config["nodes"] = [
            {
                "name": n,
                "gpus": 4,
                "cpus": 8,
                "memory": "16GiB",
                "gpu_type": "cpu",
                "labels": {"rack": r},
            }
            for n, r in NODES.items()
        ]
    else:
        pytest.importorskip("ray", reason="the Ray backend needs Ray: pip install 'ffdl[ray]'")
        from tests.ray_backend.cluster import RayTestCluster

        cluster = RayTestCluster(port=free_port(), root=root / "ray", nodes=dict(NODES))
        cluster.start()
        (root / "checkpoints").mkdir()
        config.update(
            backend="ray",
            ray_address=cluster.address,
            checkpoint_store=f"file://{root / 'checkpoints'}",
            checkpoint_sync_s=0.5,
        )
    try:
        with serving(LiveServer(home=root / "home", config=config)) as live:
            wait_for(lambda: set(views.nodes(live)) == set(NODES), timeout=60, what="the nodes")
            yield live
    finally:
        if cluster is not None:
            cluster.shutdown()


def _starts(lines: list[str]) -> list[tuple[int, int]]:
    """(num_learners, start step) of every start of learner 1."""
    found = (re.match(r"learner 1/(\d+) start=(\d+)", line) for line in lines)
    return [(int(m.group(1)), int(m.group(2))) for m in found if m]


def _current_nodes(model: dict[str, Any]) -> set[str]:
    last = max(lr["attempt"] for lr in model["learners"])
    return {str(lr["node"]) for lr in model["learners"] if lr["attempt"] == last}


def _steps_once(server: LiveServer, job_id: str, total: int) -> None:
    """Every step ran once (as the model has it), was logged once and reported once."""
    expected = list(range(1, total + 1))
    assert views.trained_model(server, job_id)["done"] == expected
    assert views.steps(views.lines(server, job_id)) == expected, "every step logged once"
    records = server.client.get(f"/v1/logs/{job_id}/emetrics", params={"pagesize": 5000})
    iterations = [int(r["etimes"]["iteration"]["value"]) for r in records.json()["models"]]
    assert iterations == expected, "every step reported once"


def test_halt_then_resume_on_another_node_runs_every_step_once(platform: LiveServer) -> None:
    manifest, files = steps_job(40)
    job_id = platform.submit_ok(manifest, files)
    platform.wait_status(job_id, {"PROCESSING"}, timeout=60)
    wait_for(lambda: 5 in views.steps(views.lines(platform, job_id)), timeout=60, what="step 5")
    (first_node,) = _current_nodes(platform.model(job_id))

    halted = platform.client.patch(f"/v1/models/{job_id}", json={"status": "halt"})
    assert halted.status_code == 202, halted.text
    platform.wait_status(job_id, {"HALTED"}, timeout=60)
    assert all(n["used"]["gpus"] == 0 for n in views.nodes(platform).values())
    views.drain(platform, first_node, True)
    try:
        resumed = platform.client.patch(f"/v1/models/{job_id}", json={"status": "resume"})
        assert resumed.status_code == 202, resumed.text
        model = platform.wait_status(job_id, {"COMPLETED"}, timeout=120)
    finally:
        views.drain(platform, first_node, False)
    assert first_node not in _current_nodes(model), "the resume ran on another node"
    starts = _starts(views.lines(platform, job_id))
    assert len(starts) == 2 and starts[0][1] == 0 and starts[1][1] >= 5, starts
    _steps_once(platform, job_id, 40)


def test_an_elastic_rescale_continues_the_step_counter(platform: LiveServer) -> None:
    manifest, files = steps_job(80, elastic=ELASTIC)
    job_id = platform.submit_ok(manifest, files)
    platform.wait_status(job_id, {"PROCESSING"}, timeout=60)
    wait_for(lambda: 3 in views.steps(views.lines(platform, job_id)), timeout=60, what="step 3")
    tenant = platform.model(job_id)["tenant"]
    rescales = views.metric(platform, "ffdl_rescales_total", tenant=tenant)
    response = platform.client.patch(f"/v1/models/{job_id}", json={"gpus": 3})
    assert response.status_code == 202, response.text

    def three_learners() -> bool:
        model = platform.model(job_id)
        return views.status(model) == "PROCESSING" and len(model["learners"]) == 3

    wait_for(three_learners, timeout=90, what="3 learners")
    model = platform.wait_status(job_id, {"COMPLETED"}, timeout=180)
    starts = _starts(views.lines(platform, job_id))
    assert [n for n, _ in starts] == [1, 3] and starts[1][1] >= 3, starts
    assert any(e["to"] == "RESCALING" and "1→3" in e["reason"] for e in model["events"])
    assert views.metric(platform, "ffdl_rescales_total", tenant=tenant) == rescales + 1
    # The autoscaler sized the elastic job with the optimizer, timed in its histogram.
    assert views.metric(platform, "ffdl_optimizer_duration_seconds_count") >= 1
    _steps_once(platform, job_id, 80)


def test_delete_of_a_running_job_stops_it_and_frees_its_gpus(platform: LiveServer) -> None:
    manifest, files = steps_job(2000, learners=2, gpus=2)
    job_id = platform.submit_ok(manifest, files)
    platform.wait_status(job_id, {"PROCESSING"}, timeout=60)
    wait_for(lambda: 2 in views.steps(views.lines(platform, job_id)), timeout=60, what="step 2")
    assert job_pids(job_id)

    response = platform.client.delete(f"/v1/models/{job_id}")
    assert response.status_code == 200, response.text
    assert platform.client.get(f"/v1/models/{job_id}").status_code == 404
    wait_for(lambda: not job_pids(job_id), timeout=20, what="the job's processes to end")
    wait_for(
        lambda: all(n["used"]["gpus"] == 0 for n in views.nodes(platform).values()),
        what="its GPUs to be free",
    )
    # Freed for real: a job that needs every GPU of the cluster starts.
    whole, files = steps_job(2, learners=3, gpus=4)
    platform.wait_status(platform.submit_ok(whole, files), {"COMPLETED"}, timeout=120)


def test_drain_moves_running_jobs_off_the_node_without_failing_any(platform: LiveServer) -> None:
    elastic, elastic_files = steps_job(80, elastic=ELASTIC)
    fixed, files = steps_job(80, placement={"policy": "pack"})
    # Both on one node, the node to drain: the others are drained before either job is
    # submitted, so that neither starts elsewhere and is moved before its first checkpoint
    # (which would run its first steps twice).
    for name in NODES:
        if name != "a":
            views.drain(platform, name, True)
    try:
        elastic_id = platform.submit_ok(elastic, elastic_files)
        fixed_id = platform.submit_ok(fixed, files)
        for job_id in (elastic_id, fixed_id):
            platform.wait_status(job_id, {"PROCESSING"}, timeout=60)
    finally:
        for name in NODES:
            if name != "a":
                views.drain(platform, name, False)
    for job_id in (elastic_id, fixed_id):
        wait_for(
            lambda job_id=job_id: 5 in views.steps(views.lines(platform, job_id)),
            timeout=60,
            what="step 5",
        )
        assert _current_nodes(platform.model(job_id)) == {"a"}

    views.drain(platform, "a", True)
    try:

        def moved() -> bool:
            models = [platform.model(job_id) for job_id in (elastic_id, fixed_id)]
            return all(
                views.status(m) == "PROCESSING" and "a" not in _current_nodes(m) for m in models
            )

        wait_for(moved, timeout=90, interval=0.2, what="both jobs to leave node a")
        models = [
            platform.wait_status(job_id, {"COMPLETED"}, timeout=180)
            for job_id in (elastic_id, fixed_id)
        ]
    finally:
        views.drain(platform, "a", False)
    for job_id, model in zip((elastic_id, fixed_id), models, strict=True):
        assert any("drained node" in (e["reason"] or "") for e in model["events"])
        _steps_once(platform, job_id, 80)


def test_preemption_halts_the_low_priority_job_which_resumes_later(
    platform: LiveServer,
) -> None:
    low_manifest, files = steps_job(40, learners=3, gpus=4, priority=10)
    low = platform.submit_ok(low_manifest, files)
    platform.wait_status(low, {"PROCESSING"}, timeout=60)
    wait_for(lambda: 5 in views.steps(views.lines(platform, low)), timeout=60, what="low job steps")
    tenant = platform.model(low)["tenant"]
    preemptions = views.metric(platform, "ffdl_preemptions_total", tenant=tenant)

    urgent_manifest, urgent_files = steps_job(10, gpus=4, priority=90)
    urgent = platform.submit_ok(urgent_manifest, urgent_files)
    platform.wait_status(urgent, {"COMPLETED"}, timeout=90)
    victim = platform.wait_status(low, {"COMPLETED"}, timeout=180)
    reasons = [e["reason"] for e in victim["events"] if e["learner"] is None]
    assert f"preempted by {urgent}" in reasons, reasons
    assert views.metric(platform, "ffdl_preemptions_total", tenant=tenant) == preemptions + 1
    starts = _starts(views.lines(platform, low))
    assert len(starts) == 2 and starts[1][1] > 0, "resumed from its checkpoint"
    _steps_once(platform, low, 40)
